// An ordinary Node HTTP server: an in-memory counter, the clock, a random
// number and a timer.  GET /inc adds one to the counter and answers
// "<count> <Date.now()> <Math.random()>"; GET /ticks answers how many
// times a 10 ms interval timer has fired; GET /quit ends the process.
// usage: node counter_server.js PORT
"use strict";
const http = require("http");
let count = 0;
let ticks = 0;
setInterval(() => { ticks++; }, 10);
const server = http.createServer((req, res) => {
  if (req.url === "/inc") {
    count++;
    res.end(`${count} ${Date.now()} ${Math.random()}\n`);
  } else if (req.url === "/ticks") {
    res.end(`${ticks}\n`);
  } else if (req.url === "/quit") {
    res.end("bye\n", () => process.exit(0));
  } else {
    res.statusCode = 404;
    res.end("no such page\n");
  }
});
server.listen(Number(process.argv[2]), "127.0.0.1");
