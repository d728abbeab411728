"""One replica's side of the client connections, in asyncio: the relay of
a member of a group across hosts (llft/cluster/member.py), whose input
arrives over the messaging protocol.  (On one host, llft-run's relays are
llft/serving/plane_relay.py, with the native data plane moving the bytes.)

For each client connection, in connection order, the relay hands the
program's virtual listener a new connection through the replica's channel
(llft/serving/channel.py), the connection header first on it, then writes
the client's bytes.  Whatever the program sends is collected: the
primary's goes back to the client; a backup's is only digested (and logged
with --log-output), as semi-active replication requires, and kept for
comparison with the primary's."""
from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llft.native import conn_header

log = logging.getLogger("llft.relay")


@dataclass
class OutputLog:
    """What a replica sent on one connection.  A backup also keeps the bytes
    the clients have not been sent yet (by the primary): if it takes over,
    it sends them."""
    bytes: int = 0
    sha256: "hashlib._Hash" = field(default_factory=hashlib.sha256)
    closed: bool = False
    unsent: bytearray = field(default_factory=bytearray)
    unsent_from: int = 0  # stream offset of unsent[0]

    def summary(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256.hexdigest(), "closed": self.closed}


OUTPUTS_LISTED = 256


class ClosedOutputs:
    """The closed connections' outputs, summed up so that replicas that
    closed the same connections in another order agree: the digest is the
    XOR of one SHA-256 per connection (its id, byte count and digest)."""

    def __init__(self):
        self.connections = self.bytes = self.fold = 0

    def add(self, conn_id: int, out: OutputLog):
        one = hashlib.sha256(f"{conn_id} {out.bytes} {out.sha256.hexdigest()}".encode()).digest()
        self.fold ^= int.from_bytes(one, "big")
        self.connections += 1
        self.bytes += out.bytes

    def summary(self) -> dict:
        return {"connections": self.connections, "bytes": self.bytes, "sha256": f"{self.fold:064x}"}


def write_once(peer, chunk: bytes, offset: int) -> int:
    """Writes to peer.writer what of chunk (at stream offset `offset`) lies
    beyond the peer.sent bytes it already has, and advances peer.sent: a new
    primary repeats what the old one sent, and each byte goes out once.
    Returns how many bytes were written."""
    skip = peer.sent - offset
    if skip >= len(chunk):
        return 0
    part = chunk[max(skip, 0):]
    peer.sent = offset + len(chunk)
    if peer.writer.is_closing():
        return 0
    peer.writer.write(part)
    return len(part)


class ReplicaRelay:
    def __init__(self, replica, on_output: Callable[[int, bytes, int], None], on_close: Callable[[int, int], None],
                 log_dir: Path | None = None, queue_limit: int = 8 << 20):
        self.replica = replica
        self.on_output = on_output          # (conn, chunk, stream offset of chunk)
        self.on_close = on_close            # (conn, bytes sent): the program closed it
        self.log_dir = log_dir
        self.events: asyncio.Queue = asyncio.Queue()
        self.queued_bytes = 0
        self.queue_limit = queue_limit
        self.room = asyncio.Event()
        self.room.set()
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.inbox: dict[int, asyncio.Queue] = {}   # per connection: what to write to the program
        self.writer_tasks: set[asyncio.Task] = set()
        self.stopped = False
        # Every connection's while at most OUTPUTS_LISTED were made, then
        # the open ones' only (memory bounded by the open connections).
        self.outputs: dict[int, OutputLog] = {}
        self.opened = 0
        self.open_outputs: dict[int, OutputLog] = {}
        self.closed_outputs = ClosedOutputs()
        self.pumps: set[asyncio.Task] = set()

    # -- what the gateway calls ------------------------------------------
    def open(self, conn_id: int, port: int, host: str, client_port: int):
        if self.stopped:
            return
        self.inbox[conn_id] = asyncio.Queue()
        self.events.put_nowait(("open", conn_id, port, host, client_port))

    def data(self, conn_id: int, chunk: bytes):
        if self._to(conn_id, ("data", chunk)):
            self.queued_bytes += len(chunk)
            if self.queued_bytes > self.queue_limit:
                self.room.clear()

    def eof(self, conn_id: int):
        self._to(conn_id, ("eof",))

    def stop(self):
        """The replica is gone: drop what was queued for it; take no more."""
        for t in self.writer_tasks:
            t.cancel()
        self.inbox.clear()
        self.queued_bytes = 0
        self.room.set()
        self.stopped = True

    def _to(self, conn_id: int, item: tuple) -> bool:
        q = self.inbox.get(conn_id)
        if q is None or self.stopped:
            return False
        q.put_nowait(item)
        return True

    # -- the relay's own loop --------------------------------------------
    async def run(self):
        """Connects to the program's listener for each client connection, in
        connection order (the program accepts them in that order); each
        connection then has its own writer, so that bytes the program does
        not read yet on one never hold up another."""
        while True:
            event = await self.events.get()
            conn_id = event[1]
            await self._open(conn_id, *event[2:])
            if conn_id in self.inbox:
                task = asyncio.create_task(self._write(conn_id, self.inbox[conn_id]))
                self.writer_tasks.add(task)
                task.add_done_callback(self.writer_tasks.discard)

    async def _write(self, conn_id: int, inbox: asyncio.Queue):
        try:
            while True:
                item = await inbox.get()
                w = self.writers.get(conn_id)   # gone once the program closed the connection
                if w is None:
                    break
                if item[0] == "data":
                    self.queued_bytes -= len(item[1])
                    if self.queued_bytes <= self.queue_limit // 2:
                        self.room.set()
                    w.write(item[1])
                    await w.drain()
                else:
                    if w.can_write_eof():
                        w.write_eof()
                    break
        except (ConnectionError, OSError, RuntimeError) as e:   # RuntimeError: uvloop, transport closed
            log.debug("replica %d connection %d: %s", self.replica.index, conn_id, e)
            self.writers.pop(conn_id, None)
        finally:
            # Bytes left unwritten no longer count against the gateway's room.
            while not inbox.empty():
                item = inbox.get_nowait()
                if item[0] == "data":
                    self.queued_bytes -= len(item[1])
            if self.queued_bytes <= self.queue_limit // 2:
                self.room.set()
            self.inbox.pop(conn_id, None)

    async def _open(self, conn_id: int, port: int, host: str, client_port: int):
        sock = await self.replica.channel.hand_connection(port, conn_header(conn_id, host, client_port),
                                                          self.replica.alive)
        if sock is None:
            return
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self.writers[conn_id] = writer
        self.outputs[conn_id] = self.open_outputs[conn_id] = OutputLog()
        self.opened += 1
        if self.opened == OUTPUTS_LISTED + 1:
            for k in [k for k, out in self.outputs.items() if out.closed]:
                del self.outputs[k]
        task = asyncio.create_task(self._pump(conn_id, reader))
        self.pumps.add(task)
        task.add_done_callback(self.pumps.discard)

    async def _pump(self, conn_id: int, reader: asyncio.StreamReader):
        out = self.outputs[conn_id]
        logfile = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            logfile = open(self.log_dir / f"conn-{conn_id}", "wb")
        try:
            while chunk := await reader.read(65536):
                offset = out.bytes
                out.bytes += len(chunk)
                out.sha256.update(chunk)
                if logfile:
                    logfile.write(chunk)
                self.on_output(conn_id, chunk, offset)
        except (ConnectionError, OSError):
            pass
        finally:
            out.closed = True
            if self.open_outputs.pop(conn_id, None) is not None:
                self.closed_outputs.add(conn_id, out)
            if logfile:
                logfile.close()
            w = self.writers.pop(conn_id, None)
            if w is not None:
                w.close()
            # A dying replica's sockets close without the program closing them.
            if not self.replica.dying():
                self.on_close(conn_id, out.bytes)
            if self.opened > OUTPUTS_LISTED:
                self.outputs.pop(conn_id, None)

    async def drained(self, timeout: float):
        """Waits until every connection's output has been read to its end
        (the replica has exited: its sockets are closed), at most timeout."""
        if self.pumps:
            await asyncio.wait(list(self.pumps), timeout=timeout)

    def output_summary(self) -> dict[str, dict]:
        """What the replica sent, per connection (bytes, SHA-256, closed).
        Past OUTPUTS_LISTED connections, the closed ones are summed up in one
        entry, "closed": the state file is written every second, and a
        long-running server has had more connections than it is worth
        listing there (3,000 of them held a member's event loop long enough
        to miss its Heartbeats)."""
        if self.opened <= OUTPUTS_LISTED:
            return {str(k): v.summary() for k, v in sorted(self.outputs.items())}
        out = {str(k): v.summary() for k, v in sorted(self.open_outputs.items())}
        out["closed"] = self.closed_outputs.summary()
        return out
