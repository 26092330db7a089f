require "include";
include "ping";
