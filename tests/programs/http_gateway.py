"""A ThreadingHTTPServer in front of a backend HTTP server: GET /fetch/X
fetches /X from the backend with http.client (a connect with a timeout:
CPython connects non-blocking, polls for writability, reads SO_ERROR) and
answers with the backend's body, on a new backend connection per request.
GET /shutdown makes it exit with status 0.
usage: http_gateway.py PORT BACKEND_PORT"""
import http.client
import http.server
import sys
import threading

# See http_app.py: no forced GIL hand-offs, which llft cannot order.
sys.setswitchinterval(1000)

BACKEND_PORT = int(sys.argv[2])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/shutdown":
            self.close_connection = True
            self.reply(b"bye\n")
            threading.Thread(target=self.server.shutdown).start()
            return
        if not self.path.startswith("/fetch/"):
            self.reply(b"not found\n", 404)
            return
        backend = http.client.HTTPConnection("127.0.0.1", BACKEND_PORT, timeout=10)
        try:
            backend.request("GET", "/" + self.path[len("/fetch/"):])
            r = backend.getresponse()
            self.reply(b"backend %d: " % r.status + r.read())
        except OSError as e:
            self.reply(f"backend error: {e}\n".encode(), 502)
        finally:
            backend.close()

    def reply(self, body, status=200):
        self.send_response(status)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler)
server.daemon_threads = False
server.serve_forever()
server.server_close()
