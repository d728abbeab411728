"""A ThreadingHTTPServer whose answers are full of non-determinism: set
order (hash seed), uuid4, time.time(), a Date header, and a counter shared
by its request threads.  GET /shutdown makes it exit with status 0.
usage: http_app.py PORT"""
import http.server
import sys
import threading
import time
import uuid

hits = 0
hits_lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        global hits
        if self.path == "/shutdown":
            self.reply(b"bye\n")
            threading.Thread(target=self.server.shutdown).start()
            return
        with hits_lock:
            hits += 1
            n = hits
        body = (f"hit {n} path {self.path}\nset {sorted(set())!r} {list({'a', 'b', 'c', 'd', 'e', 'f'})}\n"
                f"uuid {uuid.uuid4()}\ntime {time.time():.6f}\n").encode()
        self.reply(body)

    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler)
server.serve_forever(poll_interval=0.05)
server.server_close()
