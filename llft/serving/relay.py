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
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llft.checkpoint.sockets import unread
from llft.native import conn_header
from llft.serving.stream_digest import StreamDigest

log = logging.getLogger("llft.relay")


@dataclass
class OutputLog:
    """What a replica sent on one connection.  A backup also keeps the bytes
    the clients have not been sent yet (by the primary): if it takes over,
    it sends them."""
    bytes: int = 0
    sha256: StreamDigest = field(default_factory=StreamDigest)
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

    def state(self) -> list:
        return [self.connections, self.bytes, self.fold.to_bytes(32, "big")]


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
        self.readers: dict[int, asyncio.StreamReader] = {}
        self.opening: int | None = None     # the connection being handed to the program
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
            conn_id = self.opening = event[1]
            try:
                sock = await self.replica.channel.hand_connection(event[2], conn_header(conn_id, *event[3:]),
                                                                  self.replica.alive)
                if sock is not None:
                    await self._connected(conn_id, sock, 0)
                    self._count_opened()
            finally:
                self.opening = None
            self._start_writer(conn_id)   # (without a connection, it drops what was queued for it)

    def _start_writer(self, conn_id: int):
        if conn_id in self.inbox:
            task = asyncio.create_task(self._write(conn_id, self.inbox[conn_id]))
            self.writer_tasks.add(task)
            task.add_done_callback(self.writer_tasks.discard)

    async def _connected(self, conn_id: int, sock, output_at: int):
        """Relays connection conn_id, whose program end is sock's other end,
        its output so far output_at bytes."""
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self.writers[conn_id] = writer
        self.readers[conn_id] = reader
        self.outputs[conn_id] = self.open_outputs[conn_id] = OutputLog(bytes=output_at)
        task = asyncio.create_task(self._pump(conn_id, reader))
        self.pumps.add(task)
        task.add_done_callback(self.pumps.discard)

    def _count_opened(self):
        self.opened += 1
        if self.opened == OUTPUTS_LISTED + 1:
            for k in [k for k, out in self.outputs.items() if out.closed]:
                del self.outputs[k]

    async def adopt(self, conn_id: int, sock, output_at: int, digest: list[bytes]):
        """A connection the program has open already (restored from a
        checkpoint, llft/cluster/checkpoint_join.py), its output so far
        output_at bytes, digested so far as digest says (StreamDigest's
        state): relayed from here on."""
        self.inbox[conn_id] = asyncio.Queue()
        await self._connected(conn_id, sock, output_at)
        self.outputs[conn_id].sha256 = StreamDigest(*digest)
        self._start_writer(conn_id)

    # -- a checkpoint's cut (llft/cluster/checkpoint_join.py) ---------------
    def input_drained(self) -> bool:
        """Every client byte queued here is in the program's sockets, and
        every connection opened handed to it."""
        return (self.events.empty() and self.opening is None and all(q.empty() for q in self.inbox.values())
                and all(w.transport.get_write_buffer_size() == 0 for w in self.writers.values()))

    def our_ends(self) -> dict[int, int]:
        """The inode of the relay's end of each connection -> its id."""
        return {os.fstat(w.get_extra_info("socket").fileno()).st_ino: conn_id
                for conn_id, w in self.writers.items()}

    def summary_state(self, pending: dict[int, bytes]) -> dict:
        """What a replica restored from a checkpoint of this one needs for
        its output_summary to go on as this one's (adopt_summary): per
        connection, what the program had sent with pending[conn] added
        (what the relay had yet to read of it), as StreamDigest states."""
        digests = {}
        for conn_id, out in self.outputs.items():
            d = out.sha256.copy()
            d.update(pending.get(conn_id, b""))
            digests[conn_id] = [out.bytes + len(pending.get(conn_id, b"")), out.closed, *d.state()]
        return {"opened": self.opened, "closed": self.closed_outputs.state(), "outputs": digests}

    def adopt_summary(self, said: dict, closing: set[int]):
        """summary_state() of the checkpoint's source: the connections
        closed before it, and those the program had closed whose end the
        source had yet to read (closing), as the source would list them."""
        self.opened = int(said["opened"])
        connections, n, fold = said["closed"]
        self.closed_outputs.connections, self.closed_outputs.bytes = connections, n
        self.closed_outputs.fold = int.from_bytes(fold, "big")
        for conn_id, (n, closed, chain, part) in said["outputs"].items():
            if conn_id in closing:   # (its pump ends so at the source: listed only while few were opened)
                out = OutputLog(bytes=n, sha256=StreamDigest(chain, part), closed=True)
                self.closed_outputs.add(conn_id, out)
                if self.opened <= OUTPUTS_LISTED:
                    self.outputs[conn_id] = out
            elif closed:
                self.outputs[conn_id] = OutputLog(bytes=n, sha256=StreamDigest(chain, part), closed=True)

    def output_pending(self, conn_id: int) -> bytes:
        """What the program wrote on the connection that the relay has not
        taken yet (read into the reader's buffer, or still in the socket)."""
        w, r = self.writers[conn_id], self.readers[conn_id]
        dup = socket.socket(fileno=os.dup(w.get_extra_info("socket").fileno()))
        try:
            return bytes(r._buffer) + unread(dup)   # (asyncio.StreamReader's own buffer: no API shows it)
        finally:
            dup.close()

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
            self.readers.pop(conn_id, None)
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
