require ["include"];
include "loop";
