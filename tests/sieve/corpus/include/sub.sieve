require ["fileinto"];
fileinto "from-include";
