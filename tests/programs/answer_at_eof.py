"""A server that answers once it has read to the end of its input, then
closes: a client asking it must shut down its writing side and read on
(half-close).  usage: answer_at_eof.py PORT; prints "ready" once listening."""
import socket
import sys

server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    c, _ = server.accept()
    got = b""
    while chunk := c.recv(4096):
        got += chunk
    c.sendall(b"heard %d bytes: " % len(got) + got)
    c.close()
