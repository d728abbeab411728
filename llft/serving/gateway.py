"""The gateway: plain TCP clients connect here, as they would to the
program itself.  Each client connection becomes a numbered connection into
every replica (LLFT's client-side endpoint of a virtual connection): the
client's bytes go to all of them in the same order, and only the primary's
replies come back, once."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket

from llft.serving.datagrams import DatagramService, public_address

log = logging.getLogger("llft.gateway")

READ_CHUNK = 65536
NO_PORT_NOTICE_S = 3.0   # after this long without a port, say that clients cannot reach the program


class Gateway:
    def __init__(self, relays, primary_relay, port_map: dict[int, int] | None = None, host: str | None = None,
                 inputs=None):
        self.relays = list(relays)
        self.inputs = inputs                # InputLog: what clients sent, for replicas that join later
        self.primary = primary_relay
        self.port_map = port_map or {}
        self.host = host
        self.servers: dict[int, asyncio.base_events.Server] = {}
        self.clients: dict[int, asyncio.StreamWriter] = {}
        self.ids = itertools.count(1)
        self.errors: list[str] = []
        self.stats = {"connections": 0, "bytes_in": 0, "bytes_out": 0, "failovers": 0}
        self.sent: dict[int, int] = {}  # bytes of each connection the client has been sent
        self.datagrams = DatagramService([r.replica for r in relays], primary_relay.replica, host, self.port_map,
                                         self.errors)
        self.stats["udp"] = self.datagrams.stats
        self.notices: list[str] = []      # shown by llft-status while they hold
        self.stats["notices"] = self.notices
        primary_relay.on_output = self._reply
        primary_relay.on_close = self._server_closed
        for r in relays:
            r.delivered = self.sent_to_client

    def sent_to_client(self, conn_id: int) -> int:
        return self.sent.get(conn_id, 0)

    def add_relay(self, relay):
        """A replica joins: it gets every connection so far from the input
        log, then what clients send from now on, like the others."""
        relay.delivered = self.sent_to_client
        relay.catch_up(self.inputs)
        self.relays.append(relay)

    def remove_relay(self, relay):
        """A replica failed: clients no longer wait for it."""
        if relay in self.relays:
            self.relays.remove(relay)
        relay.stop()

    def promote(self, relay):
        """The primary failed and relay's replica took over: its output goes to
        the clients from where the old primary's stopped; connections stay."""
        old, self.primary = self.primary, relay
        old.on_output = old.on_close = None
        self.stats["failovers"] += 1
        relay.take_over(self._reply, self._server_closed)
        self.datagrams.promote(relay.replica)

    async def watch(self, stream, interval: float = 0.01):
        """Opens a public port for each port the primary listens on (TCP)
        or binds (UDP); says so if it has none after NO_PORT_NOTICE_S."""
        since = asyncio.get_running_loop().time()
        while True:
            for port, family, _name in stream.listeners():
                if port not in self.servers:
                    await self._serve(port, family)
            await self.datagrams.watch_once()
            self._notice_no_port(asyncio.get_running_loop().time() - since)
            await asyncio.sleep(interval)

    def _notice_no_port(self, waited: float):
        if self.servers or self.datagrams.ports:
            if self.notices:
                log.info("the program listens now; clients can reach it")
                self.notices.clear()
        elif waited >= NO_PORT_NOTICE_S and not self.notices:
            msg = (f"the program has not listened on any TCP port (nor bound a UDP port) after "
                   f"{waited:.0f} s; clients cannot reach it")
            log.warning(msg)
            self.notices.append(msg)

    async def _serve(self, port: int, family: int):
        host, public = public_address(self.port_map, self.host, port, family)
        try:
            server = await asyncio.start_server(lambda r, w: self._client(r, w, port), host, public,
                                                reuse_address=True)
        except OSError as e:
            msg = f"cannot listen on {host} port {public} for the program's port {port}: {e.strerror}"
            log.error(msg)
            self.errors.append(msg)
            self.servers[port] = None
            return
        self.servers[port] = server
        log.info("serving clients on %s port %d (the program's port %d)", host, public, port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int):
        conn_id = next(self.ids)
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        host, cport = peer[0], peer[1]
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.clients[conn_id] = writer
        self.stats["connections"] += 1
        if self.inputs is not None:
            self.inputs.open(conn_id, port, host, cport)
        for r in self.relays:
            r.open(conn_id, port, host, cport)
        try:
            while True:
                for r in list(self.relays):  # bounded memory: a slow replica slows the client down
                    await r.room.wait()
                await writer.drain()   # ...and so does a client that does not read its replies
                chunk = await reader.read(READ_CHUNK)
                if not chunk:
                    break
                self.stats["bytes_in"] += len(chunk)
                if self.inputs is not None:
                    self.inputs.data(conn_id, chunk)
                for r in self.relays:
                    r.data(conn_id, chunk)
        except (ConnectionError, OSError):
            pass  # the client went away mid-request: the program sees the end of its input
        if self.inputs is not None:
            self.inputs.eof(conn_id)
        for r in self.relays:
            r.eof(conn_id)

    def _reply(self, conn_id: int, chunk: bytes, offset: int):
        """Sends what of chunk (at offset in the connection's output) the
        client has not had yet: after a failover the new primary repeats,
        byte for byte, what the old one had sent."""
        skip = self.sent.get(conn_id, 0) - offset
        if skip >= len(chunk):
            return
        part = chunk[max(skip, 0):]
        self.sent[conn_id] = offset + len(chunk)
        w = self.clients.get(conn_id)
        if w is not None and not w.is_closing():
            self.stats["bytes_out"] += len(part)
            w.write(part)

    def _server_closed(self, conn_id: int):
        w = self.clients.pop(conn_id, None)
        if w is not None:
            w.close()

    async def close(self, timeout: float = 2.0):
        """Stops accepting, then closes client connections once what they
        were sent has gone out (bounded by timeout)."""
        for s in self.servers.values():
            if s is not None:
                s.close()
        self.datagrams.close()
        writers = list(self.clients.values())
        for w in writers:
            w.close()
        if writers:
            await asyncio.wait([asyncio.ensure_future(w.wait_closed()) for w in writers], timeout=timeout)
