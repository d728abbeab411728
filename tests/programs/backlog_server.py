"""A server with an accept queue of one (listen backlog 1) that accepts
nothing until a client says GO, then serves each later connection
in turn: one line in, "<n> <line>" back, closed.  Ends after N connections."""
import socket
import sys

port, n = int(sys.argv[1]), int(sys.argv[2])
server = socket.create_server(("127.0.0.1", port), backlog=1)
while True:   # (connections that close without a word, like a port probe, are skipped)
    first, _ = server.accept()
    f = first.makefile("rwb")
    if f.readline() == b"GO\n":
        break
    first.close()
f.write(b"GOING\n")
f.flush()
for k in range(1, n):
    c, _ = server.accept()
    g = c.makefile("rwb")
    line = g.readline().decode().strip()
    g.write(f"{k} {line}\n".encode())
    g.flush()
    g.close()
    c.close()
