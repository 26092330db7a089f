require "fileinto";
fileint "x";
