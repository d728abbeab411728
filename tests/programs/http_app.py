"""A ThreadingHTTPServer whose answers are full of non-determinism: set
order (hash seed), uuid4, time.time(), a Date header, and a counter shared
by its request threads.  GET /shutdown makes it exit with status 0.
usage: http_app.py PORT"""
import http.server
import sys
import threading
import time
import uuid

# CPython forces a GIL hand-off when a waiter's 5 ms timed wait expires,
# through a flag read without a lock: llft cannot order that read (see
# docs/determinizer.md, "Limits").  Hand-offs at blocking calls, which is
# all a request thread of this server needs, replicate exactly.
sys.setswitchinterval(1000)

hits = 0
hits_lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        global hits
        if self.path == "/shutdown":
            self.close_connection = True
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
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    # A graceful shutdown: server_close() joins the request threads, so none
    # is still running while the interpreter finalizes (CPython ends daemon
    # threads there on a flag read without a lock: see docs/determinizer.md).
    daemon_threads = False


server = Server(("0.0.0.0", int(sys.argv[1])), Handler)
server.serve_forever(poll_interval=0.05)
server.server_close()
