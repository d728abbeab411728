"""What every client sent, kept so that a replica started later (a
replacement for a failed one) can be given the same input as the others:
one file per connection (DIR/conn-N, the client's bytes in order), which
the data plane writes as it reads them and feeds to a joining replica, and,
here, the connections in the order the gateway numbered them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class LoggedConnection:
    conn_id: int
    port: int
    host: str
    client_port: int


class InputLog:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conns: dict[int, LoggedConnection] = {}   # in connection order

    def open(self, conn_id: int, port: int, host: str, client_port: int):
        self.conns[conn_id] = LoggedConnection(conn_id, port, host, client_port)

    def connections(self, after: int = 0) -> list[LoggedConnection]:
        """The connections numbered after `after`, in order."""
        return [c for c in self.conns.values() if c.conn_id > after]

    def oldest(self) -> int:
        """The first connection kept (one past the newest if none is)."""
        return next(iter(self.conns), self.newest() + 1)

    def newest(self) -> int:
        return next(reversed(self.conns), 0)

    def forget_through(self, conn_id: int):
        """The connections up to conn_id are in a stored checkpoint (or done
        before it): no replica joining later is handed them."""
        for k in [k for k in self.conns if k <= conn_id]:
            del self.conns[k]
