require "editheader";
addheader "X-One" "1";
