"""llft-gateway: plain TCP clients in, a replica group across hosts behind.

Each client connection becomes a virtual connection (messaging protocol) to
the server group: the client's bytes go out as Requests, multicast to every
member; the primary's Replies come back, carrying its ordering information,
which this end reflects back to the group as messaging does for any remote
group.  A reply names its offset in the connection's output, so whatever a
new primary repeats after a failover is dropped here, never sent twice."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket

from llft.cluster import payload
from llft.ordering.group import Connections
from llft.ordering.ids import ConnId
from llft.serving.relay import write_once

log = logging.getLogger("llft.gateway")

READ_CHUNK = 65536


# After the program closes (or shuts down the writing side of) a connection,
# the peer's side stays open this long for what it still sends.
LINGER_S = 30.0


class _Client:
    __slots__ = ("writer", "sent", "writable", "write_closed", "peer_done")

    def __init__(self, writer):
        self.writer = writer
        self.sent = 0                     # bytes of the server's output the client has had
        self.writable = asyncio.Event()
        self.write_closed = False         # the program's side ended (CLOSE): the peer has had EOF
        self.peer_done = False            # the peer's side ended: nothing more to read


class ClusterGateway:
    def __init__(self, ep: Connections, server_group: int, program_port: int):
        self.ep = ep
        self.server_group = server_group
        self.program_port = program_port
        self.seqs = itertools.count(1)
        self.clients: dict[ConnId, _Client] = {}
        self.ending: set[ConnId] = set()   # closed after the linger: their EOF waits for messaging's window
        self.stats = {"connections": 0, "open": 0, "bytes_in": 0, "bytes_out": 0, "bad_replies": 0,
                      "missing_bytes": 0}   # gaps in a server's output: never, if llft works
        self.udp = None   # GatewayDatagrams (llft/cluster/datagrams.py): the program's UDP ports, if served
        self.outgoing = None   # GatewayOutgoing (llft/cluster/gateway_outgoing.py): the program's connect()s
        ep.on_deliver = self._reply
        ep.on_writable = self._writable
        ep.on_event = self._event

    def _event(self, name: str, info: dict):
        if name == "remote-primary-changed":
            log.warning("group %d has a new primary (view %d)", info["group"], info["pvn"])

    async def serve(self, host: str, port: int) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._client, host, port, reuse_address=True)

    def _writable(self, cid: ConnId):
        if self.udp is not None and self.udp.handles(cid):
            return self.udp.writable(cid)
        if self.outgoing is not None and self.outgoing.handles(cid):
            return self.outgoing.writable(cid)
        c = self.clients.get(cid)
        if c is not None:
            c.writable.set()
        elif cid in self.ending:
            self._end(cid)

    async def _send(self, cid: ConnId, c: _Client, body: bytes):
        while not self.ep.writable(cid):   # a slow group slows the client down
            c.writable.clear()
            await c.writable.wait()
        self.ep.send(cid, body)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        await self.pump(self.ep.connect(self.server_group, next(self.seqs)), reader, writer,
                        payload.open_request(self.program_port, peer[0], peer[1]))

    async def pump(self, cid: ConnId, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes):
        """A TCP connection's bytes to the group as Requests on cid, after
        `first`; the group's Replies on cid go back to it, each byte once
        (a client's, or a remote server's of an outgoing connection)."""
        c = self.clients[cid] = _Client(writer)
        self.stats["connections"] += 1
        self.stats["open"] += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._send(cid, c, first)
            while True:
                await writer.drain()   # a client that does not read its replies is not read either
                chunk = await reader.read(READ_CHUNK)
                if not chunk:
                    break
                self.stats["bytes_in"] += len(chunk)
                await self._send(cid, c, payload.data_request(chunk))
        except (ConnectionError, OSError):
            pass  # the client went away: the program sees the end of its input
        c.peer_done = True
        if self.clients.get(cid) is c:
            await self._send(cid, c, payload.eof_request())
            if c.write_closed:
                self._closed(cid, c)

    def _reply(self, cid: ConnId, body: bytes):
        if self.udp is not None and self.udp.handles(cid):
            return self.udp.reply(cid, body)
        if self.outgoing is not None and self.outgoing.handles(cid):
            return self.outgoing.reply(cid, body)
        c = self.clients.get(cid)
        try:
            kind, offset, *rest = payload.parse_reply(body)
        except payload.BadPayload as e:
            self.stats["bad_replies"] += 1
            self.ep.count_drop("bad-payload")
            log.debug("connection %s: %s", cid, e)
            return
        if c is None:
            return
        if kind == payload.CLOSE:
            # Half-close: the program may have shut down only its writing
            # side (shutdown(SHUT_WR)) and still read the peer's answer, as a
            # program asking a server that answers at the end of its input
            # does.  The peer gets EOF; the connection ends when the peer's
            # side does too (or after LINGER_S).
            if not c.write_closed:
                c.write_closed = True
                if c.peer_done or not c.writer.can_write_eof():
                    self._closed(cid, c)
                else:
                    try:
                        c.writer.write_eof()
                    except (ConnectionError, OSError, RuntimeError):
                        self._closed(cid, c)
                        return
                    asyncio.get_running_loop().call_later(LINGER_S, self._closed, cid, c)
            return
        if c.write_closed:
            return    # nothing follows CLOSE (a new primary's repeat at most)
        if offset > c.sent:
            self.stats["missing_bytes"] += offset - c.sent
            log.error("connection %s: %d bytes of the server's output are missing", cid, offset - c.sent)
        self.stats["bytes_out"] += write_once(c, rest[0], offset)

    def _closed(self, cid: ConnId, c: _Client):
        if self.clients.get(cid) is c:
            del self.clients[cid]
            self.stats["open"] -= 1
            c.writer.close()
            if c.peer_done:
                self.ep.finish(cid)
            else:                 # (after LINGER_S) the group ends its side too
                self.ending.add(cid)
                self._end(cid)

    def _end(self, cid: ConnId):
        """The EOF of a connection closed after its linger, once messaging's
        window lets it go (before, it was dropped when the window was full,
        and the program never saw the end of that connection)."""
        if self.ep.writable(cid):
            self.ending.discard(cid)
            self.ep.send(cid, payload.eof_request())
            self.ep.finish(cid)

    async def close(self, timeout: float = 2.0):
        writers = [c.writer for c in self.clients.values()]
        for w in writers:
            w.close()
        if writers:
            await asyncio.wait([asyncio.ensure_future(w.wait_closed()) for w in writers], timeout=timeout)
