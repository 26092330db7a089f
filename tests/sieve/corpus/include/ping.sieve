require "include";
include "pong";
