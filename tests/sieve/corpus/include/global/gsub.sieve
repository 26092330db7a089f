require ["fileinto"];
fileinto "from-global";
