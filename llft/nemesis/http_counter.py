"""A ThreadingHTTPServer for the nemesis: a counter per name, the clock.

    GET /incr/NAME  -> "<n>": NAME's counter after adding one
    GET /time       -> "<sec.usec>"
    GET /shutdown   -> "bye", then the server exits with status 0

usage: python -m llft.nemesis.http_counter PORT"""
from __future__ import annotations

import http.server
import sys
import threading
import time

counters: dict[str, int] = {}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/incr/"):
            name = self.path[len("/incr/"):]
            with lock:
                counters[name] = n = counters.get(name, 0) + 1
            self.reply(f"{n}\n")
        elif self.path == "/time":
            self.reply(f"{time.time():.6f}\n")
        elif self.path == "/shutdown":
            self.close_connection = True
            self.reply("bye\n")
            threading.Thread(target=self.server.shutdown).start()
        else:
            self.send_error(404)

    def reply(self, text: str):
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = False   # joined at the end, so that every replica ends alike
    block_on_close = True


def main():
    server = Server(("0.0.0.0", int(sys.argv[1])), Handler)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
