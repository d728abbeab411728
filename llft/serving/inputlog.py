"""What every client sent, kept so that a replica started later (a
replacement for a failed one) can be given the same input as the others:
one file per connection (DIR/conn-N, the client's bytes in order) and, in
memory, the connections in the order the gateway numbered them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class LoggedConnection:
    conn_id: int
    port: int
    host: str
    client_port: int
    bytes: int = 0
    eof: bool = False


class InputLog:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conns: dict[int, LoggedConnection] = {}   # in connection order
        self.files: dict[int, object] = {}

    def path(self, conn_id: int) -> Path:
        return self.dir / f"conn-{conn_id}"

    def open(self, conn_id: int, port: int, host: str, client_port: int):
        self.conns[conn_id] = LoggedConnection(conn_id, port, host, client_port)
        self.files[conn_id] = open(self.path(conn_id), "wb", buffering=0)

    def data(self, conn_id: int, chunk: bytes):
        # Written through at once: a replica joining now reads the file up
        # to .bytes, and the gateway passes it everything after.
        f, view = self.files[conn_id], memoryview(chunk)
        while view:
            view = view[f.write(view):]
        self.conns[conn_id].bytes += len(chunk)

    def eof(self, conn_id: int):
        self.conns[conn_id].eof = True
        f = self.files.pop(conn_id, None)
        if f is not None:
            f.close()

    def connections(self) -> list[LoggedConnection]:
        return list(self.conns.values())

    def close(self):
        for f in self.files.values():
            f.close()
        self.files.clear()
