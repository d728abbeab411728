"""Outgoing connections: the program's connect() to a server outside the
group (docs/serving.md, "Outgoing connections").

Each replica's shim hands the other end of a virtual TCP socket to this
service through the replica's channel (llft/serving/channel.py) and writes
a request on it: the program's k-th outgoing connection and the address
(native/wrap_connect.c).  The primary's request asks: this
service makes the real TCP connection, or finds the one it made for k
already (a failed primary's successor repeats a connect the failed primary
had not recorded), and answers with the result.  A backup's request only
attaches its socket to connection k.

Every replica attached to k gets every byte the remote server sent, from
the first, in the same order.  Only the primary's writes reach the remote,
each byte once, by offset: after a failover the new primary sends only
what comes after what the old one had sent.  A backup's writes are
digested, like its replies to clients.  The remote TCP connection is this
process's, so it outlives any replica.

UDP sockets that send or connect before any bind (outgoing UDP) get a
port of their own, flagged LLFT_LISTENER_ANY_PORT; the gateway leaves those
alone and a DatagramService of this service's serves them on any free
port, closing each once every live replica has closed it.

Integration points: LocalGroup calls listen() for each replica, serve() in
its event loop, promote() at a failover, close() at the
end, and puts stats and summary() in the state file.  From serving/ it
uses relay.OutputLog (the per-connection digest) and
datagrams.DatagramService (with its `listed` argument); it changes neither
the gateway's nor the relays' paths."""
from __future__ import annotations

import asyncio
import errno
import logging
import socket
from dataclasses import dataclass, field

from llft.native import CONNECT_ASK, CONNECT_REQUEST_SIZE, LISTENER_ANY_PORT, connect_reply, parse_connect_request
from llft.serving.datagrams import DatagramService
from llft.serving.relay import OutputLog, write_once

log = logging.getLogger("llft.outgoing")

READ_CHUNK = 65536
UDP_WATCH_S = 0.01  # how often new outgoing UDP ports are looked for
MAX_ERRORS = 20     # the last ones, for the state file


@dataclass
class RemoteConnection:
    conn_id: int
    host: str
    port: int
    writer: asyncio.StreamWriter
    local: tuple[str, int]
    received: bytearray = field(default_factory=bytearray)  # what the remote sent, from the start
    eof: bool = False                  # the remote closed its side
    sent: int = 0                      # the program's bytes the remote has been sent
    write_closed: bool = False         # the primary's program closed (or shut down) its side
    sinks: dict[int, asyncio.StreamWriter] = field(default_factory=dict)  # replica index -> its socket
    outputs: dict[int, OutputLog] = field(default_factory=dict)           # replica index -> what it wrote


class OutgoingService:
    def __init__(self):
        self.primary: int | None = None            # index of the replica whose writes go out
        self.replicas: dict[int, object] = {}
        self.members: list = []                     # the replicas in start order (for UDP ports)
        self.udp: DatagramService | None = None     # outgoing UDP, once serving
        self.served: set[int] = set()
        self.remotes: dict[int, RemoteConnection] = {}
        self.connecting: dict[int, asyncio.Future] = {}
        self.tasks: set[asyncio.Task] = set()
        self.stats = {"connections": 0, "failed": 0, "bytes_in": 0, "bytes_out": 0, "dropped": 0}
        self.errors: list[str] = []

    # -- what LocalGroup calls ------------------------------------------
    def listen(self, replica):
        """Takes replica's outgoing connections once serve() runs."""
        self.replicas[replica.index] = replica
        self.members.append(replica)

    async def serve(self):
        """Serves every replica listed and not yet served."""
        for k, r in list(self.replicas.items()):
            if k not in self.served:
                self.served.add(k)
                r.channel.serve_connects(lambda rd, w, k=k: self._replica_connection(k, rd, w))
        if self.udp is None and self.primary is not None:
            # UDP ports bound to port 0, or by a send or connect before any
            # bind: the gateway's datagram service, on any free port.
            self.udp = DatagramService(self.members, self.replicas[self.primary], None, {0: 0}, self.errors,
                                       listed=lambda replica: replica.listeners(socket.SOCK_DGRAM | LISTENER_ANY_PORT))
            self.stats["udp"] = self.udp.stats
            task = asyncio.create_task(self._watch_udp())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def promote(self, replica):
        """replica took over: its writes go to the remote servers from where
        the failed primary's stopped, and its closes close them."""
        self.primary = replica.index
        if self.udp is not None:
            self.udp.promote(replica)
        for rc in self.remotes.values():
            out = rc.outputs.get(replica.index)
            if out is None:
                continue   # attached later, as the primary, by its replayed connect
            if out.unsent:
                self._send(rc, bytes(out.unsent), out.unsent_from)
                out.unsent.clear()
            if out.closed:
                self._close_write(rc)

    def summary(self, index: int) -> dict[str, dict]:
        """What a replica wrote on each outgoing connection (bytes, SHA-256)."""
        out = {str(k): rc.outputs[index].summary() for k, rc in sorted(self.remotes.items()) if index in rc.outputs}
        if self.udp is not None:
            out.update({f"udp-{port}": s for port, s in self.udp.summary(index).items()})
        return out

    def close(self):
        if self.udp is not None:
            self.udp.close()
        for rc in self.remotes.values():
            rc.writer.close()
        for t in self.tasks:
            t.cancel()

    # -- outgoing UDP ----------------------------------------------------
    async def _watch_udp(self):
        while True:
            await self.udp.watch_once()
            self._close_finished_udp_ports()
            await asyncio.sleep(UDP_WATCH_S)

    def _close_finished_udp_ports(self):
        """A port every live replica has used and closed is done: its public
        socket closes (each lookup of a resolver has a port of its own)."""
        for port, public in self.udp.ports.items():
            if public is None or public.transport is None:
                continue
            live = [m for m in public.members.values() if m.replica.alive()]
            if any(m.sock is None or port in {p for p, _f, _n in self.udp.listed(m.replica)} for m in live):
                continue
            for m in public.members.values():
                m._readable()   # what it sent last
                m.close()
                m.kept.clear()
            public.transport.close()
            public.transport = None

    # -- a replica's connection -----------------------------------------
    def _drop(self, index: int, why: str):
        self.stats["dropped"] += 1
        msg = f"replica {index}: outgoing connection dropped: {why}"
        log.warning(msg)
        self.errors.append(msg)
        del self.errors[:-MAX_ERRORS]

    async def _replica_connection(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            raw = await reader.readexactly(CONNECT_REQUEST_SIZE)
            conn_id, flags, _family, host, port = parse_connect_request(raw)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as e:
            self._drop(index, f"bad request ({e})")
            writer.close()
            return
        if flags & CONNECT_ASK:
            rc, err = await self._connect(conn_id, host, port)
            writer.write(connect_reply(conn_id, err, rc.local if rc else None))
            if rc is None:
                writer.close()
                return
        else:
            rc = self.remotes.get(conn_id)
            if rc is None or (rc.host, rc.port) != (host, port):
                self._drop(index, f"connection {conn_id} to {host} port {port} was never made by the primary")
                writer.close()
                return
        self._attach(rc, index, writer)
        await self._from_replica(rc, index, reader)

    async def _connect(self, conn_id: int, host: str, port: int) -> tuple[RemoteConnection | None, int]:
        """The real connection for conn_id and 0, or None and the errno."""
        if conn_id in self.connecting:   # the failed primary's request is still connecting
            return await asyncio.shield(self.connecting[conn_id])
        rc = self.remotes.get(conn_id)
        if rc is not None:
            if (rc.host, rc.port) == (host, port):
                return rc, 0   # made for the failed primary, which had not recorded it
            # Its unrecorded connect went elsewhere: no replica knows it.
            rc.writer.close()
            del self.remotes[conn_id]
        fut = self.connecting[conn_id] = asyncio.get_running_loop().create_future()
        try:
            result = await self._open(conn_id, host, port)
        finally:
            del self.connecting[conn_id]
        fut.set_result(result)
        return result

    async def _open(self, conn_id: int, host: str, port: int) -> tuple[RemoteConnection | None, int]:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            self.stats["failed"] += 1
            log.info("outgoing connection %d to %s port %d: %s", conn_id, host, port, e)
            return None, e.errno or errno.ECONNREFUSED
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = writer.get_extra_info("sockname")[:2]
        rc = self.remotes[conn_id] = RemoteConnection(conn_id, host, port, writer, local)
        self.stats["connections"] += 1
        log.info("outgoing connection %d to %s port %d", conn_id, host, port)
        task = asyncio.create_task(self._from_remote(rc, reader))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return rc, 0

    def _attach(self, rc: RemoteConnection, index: int, writer: asyncio.StreamWriter):
        """A replica's socket for rc gets everything the remote sent so far
        (a backup attaches when it replays the connect), then the rest."""
        if rc.received:
            writer.write(bytes(rc.received))
        if rc.eof and writer.can_write_eof():
            writer.write_eof()
        rc.sinks[index] = writer
        rc.outputs[index] = OutputLog()

    async def _from_remote(self, rc: RemoteConnection, reader: asyncio.StreamReader):
        try:
            while chunk := await reader.read(READ_CHUNK):
                rc.received += chunk
                self.stats["bytes_in"] += len(chunk)
                self._to_sinks(rc, lambda w: w.write(chunk))
                primary = rc.sinks.get(self.primary)
                if primary is not None and not primary.is_closing():
                    try:
                        await primary.drain()   # paced by the primary; backups' sockets buffer
                    except (ConnectionError, OSError, RuntimeError):
                        pass   # the primary is gone: its successor reads on
        except (ConnectionError, OSError):
            pass   # reset by the remote: the replicas see the end of its stream
        rc.eof = True
        self._to_sinks(rc, lambda w: w.can_write_eof() and w.write_eof())
        if rc.write_closed:
            rc.writer.close()

    @staticmethod
    def _to_sinks(rc: RemoteConnection, op):
        for index, w in list(rc.sinks.items()):
            try:
                if not w.is_closing():
                    op(w)
                    continue
            except (ConnectionError, OSError, RuntimeError):   # RuntimeError: uvloop, transport closed
                pass
            del rc.sinks[index]   # that replica closed the socket, or is gone

    async def _from_replica(self, rc: RemoteConnection, index: int, reader: asyncio.StreamReader):
        """What the replica's program writes: the primary's goes to the
        remote; a backup's is digested and kept until the remote has it."""
        out = rc.outputs[index]
        try:
            while chunk := await reader.read(READ_CHUNK):
                offset = out.bytes
                out.bytes += len(chunk)
                out.sha256.update(chunk)
                if index == self.primary:
                    self._send(rc, chunk, offset)
                else:
                    self._keep_unsent(rc, out, chunk)
        except (ConnectionError, OSError):
            pass
        out.closed = True
        # The end of the primary's writes is the program's close or shutdown,
        # unless the primary is dying: then its successor closes, if it does.
        if index == self.primary and not self.replicas[index].dying():
            self._close_write(rc)

    def _send(self, rc: RemoteConnection, chunk: bytes, offset: int):
        self.stats["bytes_out"] += write_once(rc, chunk, offset)

    @staticmethod
    def _keep_unsent(rc: RemoteConnection, out: OutputLog, chunk: bytes):
        out.unsent += chunk
        drop = min(max(0, rc.sent - out.unsent_from), len(out.unsent))
        if drop:
            del out.unsent[:drop]
            out.unsent_from += drop

    @staticmethod
    def _close_write(rc: RemoteConnection):
        if rc.write_closed:
            return
        rc.write_closed = True
        if rc.writer.is_closing():
            return
        if rc.eof:
            rc.writer.close()
        elif rc.writer.can_write_eof():
            rc.writer.write_eof()
