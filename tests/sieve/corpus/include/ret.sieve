require ["fileinto", "include"];
if true { return; }
fileinto "never";
