"""Which process of the program accepted each client connection (llft-run
--fork replicate).

At the primary the processes share the program's listener, and whichever
accepts a connection records it in its own stream (an ACCEPT record,
which names the connection).  A backup's processes must each get the
very connections their counterparts accepted: the record pumps read the
ACCEPTs off every stream as they forward it (`accepted`, in their
threads), and a backup's relay hands each connection to the inbox of the
process whose stream accepted it (`process_of`).  A connection the
primary's processes never accepted has no route: when a backup takes
over, its relay hands those to its shared listener, as the primary's
does, and its processes accept them for real."""
from __future__ import annotations

import asyncio
import threading

from llft.native import accepted_connections

ROUTE_WAIT_S = 0.05


class ConnectionRoutes:
    def __init__(self):
        self._routes: dict[int, int] = {}   # conn_id -> stream id of the process that accepted it
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None   # set, and replaced, at each change

    def serve(self):
        """Waiters wake on the running loop from now on."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def _wake(self):
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def accepted(self, stream_id: int, chunk: bytes):
        """A record pump forwarded chunk of stream stream_id's records."""
        ids = accepted_connections(chunk)
        if not ids:
            return
        with self._lock:
            for conn_id in ids:
                self._routes[conn_id] = stream_id
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake)

    def route(self, conn_id: int) -> int | None:
        with self._lock:
            return self._routes.get(conn_id)

    async def process_of(self, conn_id: int, unrouted) -> int | None:
        """The stream id of the process that accepted conn_id at the
        primary, once known; None as soon as unrouted() says the
        connection goes to the shared listener instead (this replica
        has taken over)."""
        while True:
            changed = self._changed
            stream = self.route(conn_id)
            if stream is not None:
                return stream
            if unrouted():
                return None
            try:
                await asyncio.wait_for(changed.wait(), ROUTE_WAIT_S)
            except asyncio.TimeoutError:
                pass

    def prune(self, below: int):
        """Forgets the routes of connections numbered below `below`, which
        every backup has been handed."""
        with self._lock:
            for conn_id in [c for c in self._routes if c < below]:
                del self._routes[conn_id]

    def __len__(self) -> int:
        return len(self._routes)
