require ["variables", "include"];
global "who";
set "who" "included";
