"""One replica's side of the client connections on one host, with the
native data plane moving the bytes.  For each client connection, in
connection order (the program accepts them in that order), the relay
connects to the program's virtual listener, writes the connection header
and hands the socket to the plane, which writes the client's bytes to it
and digests (and logs, with --log-output) what the program sends; the
primary's goes back to the client.  Under --fork replicate a backup's
relay hands each connection to the inbox of the process whose
counterpart accepted it at the primary, as soon as that is known
(llft/serving/routes.py), each on its own.  (The cross-host member still
uses the asyncio relay, llft/serving/relay.py.)"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from llft.native import conn_header
from llft.serving.dataplane import DataPlane

log = logging.getLogger("llft.relay")

DRAIN_POLL_S = 0.01


class PlaneRelay:
    def __init__(self, replica, plane: DataPlane, log_dir: Path | None = None, slot: int | None = None,
                 routes=None):
        self.replica = replica
        self.routes = routes   # a ConnectionRoutes under --fork replicate
        self.plane = plane
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        # slot: the plane made it already (a clone's, llft/checkpoint/clone.py)
        self.slot = plane.add_replica(replica, log_dir) if slot is None else slot
        self.opens: asyncio.Queue = asyncio.Queue()
        self.unhanded: dict[int, tuple] = {}   # connections opened and not handed over yet, in order
        self.opened = 0                          # the last connection opened
        self.routed: set[asyncio.Task] = set()   # hand-overs waiting for their connection's route
        self.stopped = False

    def open(self, conn_id: int, port: int, host: str, client_port: int):
        """A client connection: the plane has made this replica's leg, which
        queues the client's bytes until it is connected."""
        if not self.stopped:
            self.opened = max(self.opened, conn_id)
            self.unhanded[conn_id] = (conn_id, port, host, client_port)
            self.opens.put_nowait((conn_id, port, host, client_port))

    def catch_up(self, inputs):
        """A replica that joins late: every client connection so far, closed
        ones included, in connection order; the plane feeds each its logged
        input, then what the client sends from now on."""
        for c in inputs.connections():
            self.open(c.conn_id, c.port, c.host, c.client_port)

    def stop(self):
        """The replica is gone: no more input for it (its output is still read)."""
        self.stopped = True
        self.plane.remove_replica(self.slot)
        for task in self.routed:
            task.cancel()

    def handed_below(self) -> int:
        """Every connection numbered below this one has been handed over."""
        return min(self.unhanded, default=self.opened + 1)

    async def run(self):
        while True:
            conn_id, port, host, client_port = await self.opens.get()
            if self.routes is not None and not self.replica.took_over():
                stream = self.routes.route(conn_id)
                if stream is not None:
                    # Its route known already (a replacement catching up is
                    # handed every logged connection at once): handed in
                    # connection order, as its process's accepts take them.
                    # Out of order, each that comes before its turn would be
                    # parked on an fd of its own, and hundreds of them would
                    # run out of the numbers parking has.
                    await self._hand(conn_id, port, host, client_port, stream)
                    continue
                task = asyncio.create_task(self._hand_routed(conn_id, port, host, client_port))
                self.routed.add(task)
                task.add_done_callback(self.routed.discard)
                continue
            await self._hand(conn_id, port, host, client_port, None)

    async def _hand_routed(self, conn_id: int, port: int, host: str, client_port: int):
        stream = await self.routes.process_of(conn_id, self.replica.took_over)
        await self._hand(conn_id, port, host, client_port, stream)

    async def _hand(self, conn_id: int, port: int, host: str, client_port: int, stream: int | None):
        sock = await self.replica.channel.hand_connection(port, conn_header(conn_id, host, client_port),
                                                          self.replica.alive, stream)
        if sock is not None and self.stopped:
            sock.close()
            return
        # (no await from the hand-over to here: a connection sent to the
        # program is attached, which a checkpoint relies on)
        self.plane.attach(self.slot, conn_id, sock)
        self.unhanded.pop(conn_id, None)

    async def drained(self, timeout: float):
        """Waits until every connection's output has been read to its end
        (the replica has exited: its sockets are closed), at most timeout."""
        end = asyncio.get_running_loop().time() + timeout
        while self.plane.open_legs(self.slot) and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(DRAIN_POLL_S)

    def output_summary(self) -> dict[str, dict]:
        return self.plane.summary(self.slot)
