"""The gateway: plain TCP clients connect here, as they would to the
program itself.  Each client connection becomes a numbered connection into
every replica (LLFT's client-side endpoint of a virtual connection): the
client's bytes go to all of them in the same order, and only the primary's
replies come back, once.  The gateway accepts and numbers connections; the
native data plane (llft/serving/dataplane.py) moves their bytes."""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket

from llft.serving.datagrams import DatagramService, public_address

log = logging.getLogger("llft.gateway")

NO_PORT_NOTICE_S = 3.0   # after this long without a port, say that clients cannot reach the program
CLOSE_POLL_S = 0.01
# A replica this many connections behind (its relay has yet to hand them to
# its program): new clients wait in the listen backlog until it catches up,
# so that the plane holds a bounded amount for the connections it lags.
MAX_WAITING = 256
RESUME_POLL_S = 0.002


class Gateway:
    def __init__(self, plane, relays, primary_relay, port_map: dict[int, int] | None = None,
                 host: str | None = None, inputs=None):
        self.plane = plane                  # DataPlane: moves the bytes
        self.relays = list(relays)          # PlaneRelay: connect each replica's legs
        self.inputs = inputs                # InputLog: the connections, for replicas that join later
        self.primary = primary_relay
        self.port_map = port_map or {}
        self.host = host
        self.servers: dict[int, list[socket.socket] | None] = {}
        self.ids = itertools.count(1)
        self.errors: list[str] = []
        self.failovers = 0
        self.datagrams = DatagramService([r.replica for r in relays], primary_relay.replica, host, self.port_map,
                                         self.errors)
        self.notices: list[str] = []      # shown by llft-status while they hold
        self.holding = False              # not accepting: a replica lags (MAX_WAITING)
        plane.set_primary(primary_relay.slot)

    @property
    def stats(self) -> dict:
        s = self.plane.stats()
        return {"connections": s["connections"], "held": s["held"], "bytes_in": s["bytes_in"],
                "bytes_out": s["bytes_out"],
                "failovers": self.failovers, "udp": self.datagrams.stats, "notices": self.notices}

    def add_relay(self, relay):
        """A replica joins: the plane gave it every connection so far, fed
        from the input log, then what clients send from now on; the relay
        connects them in connection order."""
        relay.catch_up(self.inputs)
        self.relays.append(relay)

    def add_clone_relay(self, relay, unhanded: list[tuple]):
        """A replica cloned from another joins (llft/checkpoint/clone.py):
        the plane gave it the connections its source has; it hands over
        those its source had not been handed yet (unhanded: the open()
        arguments, in connection order), then every new one."""
        for args in unhanded:
            relay.open(*args)
        self.relays.append(relay)

    def remove_relay(self, relay):
        """A replica failed: clients no longer wait for it."""
        if relay in self.relays:
            self.relays.remove(relay)
        relay.stop()

    def promote(self, relay):
        """The primary failed and relay's replica took over: its output goes to
        the clients from where the old primary's stopped; connections stay."""
        self.primary = relay
        self.failovers += 1
        self.plane.set_primary(relay.slot)
        self.datagrams.promote(relay.replica)

    async def watch(self, interval: float = 0.01):
        """Opens a public port for each port the primary's processes listen
        on (TCP) or bind (UDP); says so if it has none after NO_PORT_NOTICE_S."""
        since = asyncio.get_running_loop().time()
        while True:
            for port, _family, bound in self.primary.replica.listeners():
                if port not in self.servers:
                    await self._serve(port, bound)
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

    async def _serve(self, port: int, bound: str):
        host, public = public_address(self.port_map, self.host, port, bound)
        try:
            socks = listen(host, public)
        except OSError as e:
            msg = f"cannot listen on {host} port {public} for the program's port {port}: {e.strerror}"
            log.error(msg)
            self.errors.append(msg)
            self.servers[port] = None
            return
        loop = asyncio.get_running_loop()
        for s in socks:
            loop.add_reader(s.fileno(), self._accept, s, port)
        self.servers[port] = socks
        log.info("serving clients on %s port %d (the program's port %d)", host, public, port)

    def _hold_clients(self):
        """A replica lags MAX_WAITING connections: stop accepting until it
        has fewer."""
        loop = asyncio.get_running_loop()
        for socks in self.servers.values():
            for s in socks or ():
                loop.remove_reader(s.fileno())
        self.holding = True
        loop.call_later(RESUME_POLL_S, self._maybe_resume)

    def _maybe_resume(self):
        if not self.holding:
            return
        loop = asyncio.get_running_loop()
        if not self.plane.accepting(MAX_WAITING):
            loop.call_later(RESUME_POLL_S, self._maybe_resume)
            return
        self.holding = False
        for port, socks in self.servers.items():
            for s in socks or ():
                loop.add_reader(s.fileno(), self._accept, s, port)

    def _accept(self, server: socket.socket, port: int):
        """A client connection: numbered, handed to the data plane (with a
        leg for every live replica), and each relay connects its leg."""
        for _ in range(64):   # a burst of connections, without starving the loop
            if not self.plane.accepting(MAX_WAITING):
                self._hold_clients()
                return
            try:
                sock, peer = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:   # out of fds, say: the client waits in the backlog
                log.warning("cannot accept a client on port %d: %s", port, e)
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn_id = next(self.ids)
            host, cport = peer[0], peer[1]
            if not self.plane.open_conn(conn_id, sock):
                log.warning("connection %d: the data plane refused it", conn_id)
                continue
            if self.inputs is not None:
                self.inputs.open(conn_id, port, host, cport)
            for r in self.relays:
                r.open(conn_id, port, host, cport)

    async def close(self, timeout: float = 2.0):
        """Stops accepting, then closes client connections once what they
        were sent has gone out (bounded by timeout), and stops the plane."""
        loop = asyncio.get_running_loop()
        self.holding = False
        for socks in self.servers.values():
            for s in socks or ():
                loop.remove_reader(s.fileno())
                s.close()
        self.datagrams.close()
        self.plane.close_clients()
        end = loop.time() + timeout
        while self.plane.stats()["open_clients"] and loop.time() < end:
            await asyncio.sleep(CLOSE_POLL_S)
        self.plane.stop()


def listen(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets on host's addresses for port."""
    socks = []
    try:
        for family, type_, proto, _name, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                    flags=socket.AI_PASSIVE):
            s = socket.socket(family, type_, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(1024)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks
