"""The program's UDP ports.

When the primary binds a UDP port (the preload library publishes it in the
control block with type SOCK_DGRAM), the gateway binds the same public UDP
port.  Each client datagram gets a number on the port and goes, headed by
a 32-byte connection header (its number and the client's address), to
every replica's virtual socket, in the same order: the program's
recvfrom() returns the client's datagram, boundaries intact, and the
client's address.  The program's replies (sendto the client's address)
come back here, headed by their destination: the primary's are sent to
the client from the public port; a backup's are only digested, and kept
until the primary's copy is known to be out, in case the backup takes
over."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import struct
from collections import deque
from dataclasses import dataclass, field

from llft.native import CONN_HEADER_SIZE, conn_header, parse_conn_header
from llft.serving.public_udp import PublicUdpPort

log = logging.getLogger("llft.datagrams")

MAX_DATAGRAM = 65536
QUEUE_LIMIT = 4 << 20       # bytes waiting for one replica before client datagrams are dropped
KEEP_LIMIT = 4096           # replies a backup keeps for a failover


@dataclass
class DatagramLog:
    """What a replica sent on one UDP port: count, bytes, and a SHA-256 over
    each datagram's length, destination and payload (boundaries count)."""
    datagrams: int = 0
    bytes: int = 0
    sha256: "hashlib._Hash" = field(default_factory=hashlib.sha256)

    def add(self, raw: bytes):
        self.datagrams += 1
        self.bytes += len(raw) - CONN_HEADER_SIZE
        self.sha256.update(struct.pack("<I", len(raw)) + raw)

    def summary(self) -> dict:
        return {"datagrams": self.datagrams, "bytes": self.bytes, "sha256": self.sha256.hexdigest()}


class ReplicaPort:
    """One replica's side of one UDP port: the other end of the program's
    datagram socket (so that a full queue there reads as not writable
    here)."""

    def __init__(self, replica, port: int, on_reply, stats: dict):
        self.replica = replica
        self.port = port
        self.on_reply = on_reply            # (ReplicaPort, k, payload, (host, port))
        self.stats = stats
        self.sock: socket.socket | None = None
        self.pending: deque[bytes] = deque()
        self.pending_bytes = 0
        self.out = DatagramLog()
        self.kept: deque[tuple[int, bytes, tuple]] = deque()

    def attach(self) -> bool:
        """Takes the replica's socket for this port once its program has
        bound it (the shim hands it over through the replica's channel)."""
        s = self.replica.channel.take_datagram(self.port)
        if s is None:
            return False
        self.sock = s
        asyncio.get_running_loop().add_reader(s.fileno(), self._readable)
        self._flush()
        return True

    def deliver(self, datagram: bytes):
        if not self.replica.alive():
            return
        self.pending.append(datagram)
        self.pending_bytes += len(datagram)
        if len(self.pending) == 1:
            self._flush()

    def _flush(self):
        loop = asyncio.get_running_loop()
        while self.pending and self.sock is not None:
            d = self.pending[0]
            try:
                self.sock.send(d)
            except BlockingIOError:
                loop.add_writer(self.sock.fileno(), self._flush)  # the program's queue is full
                return
            except OSError as e:  # the program closed the socket, or exited
                log.debug("replica %d UDP port %d: datagram lost: %s", self.replica.index, self.port, e)
                self.stats["replica_lost"] += 1
            self.pending.popleft()
            self.pending_bytes -= len(d)
        if self.sock is not None:
            loop.remove_writer(self.sock.fileno())

    def _readable(self):
        while self.sock is not None:
            try:
                raw = self.sock.recv(MAX_DATAGRAM + CONN_HEADER_SIZE)
            except BlockingIOError:
                return
            except OSError:
                return
            if len(raw) < CONN_HEADER_SIZE:
                self.stats["malformed_replies"] += 1
                continue
            k = self.out.datagrams
            self.out.add(raw)
            _, host, port = parse_conn_header(raw)
            self.on_reply(self, k, raw[CONN_HEADER_SIZE:], (host, port))

    def keep(self, k: int, payload: bytes, dest, sent: int):
        """A backup's reply: kept until the primary's copy is out."""
        while self.kept and self.kept[0][0] < sent:
            self.kept.popleft()
        if k >= sent:
            if len(self.kept) >= KEEP_LIMIT:
                self.kept.popleft()
                self.stats["kept_dropped"] += 1
            self.kept.append((k, payload, dest))

    def close(self):
        if self.sock is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.sock.fileno())
            loop.remove_writer(self.sock.fileno())
            self.sock.close()
            self.sock = None


class PublicPort(PublicUdpPort):
    """The gateway's public UDP port for one port of the program: client
    datagrams go to every replica's virtual socket."""

    def __init__(self, service: "DatagramService", port: int, family: int):
        super().__init__(port, family, service.stats)
        self.service = service
        self.members = {r.index: ReplicaPort(r, port, self._reply, service.stats) for r in service.replicas}

    def full(self) -> bool:
        return any(m.pending_bytes > QUEUE_LIMIT for m in self.members.values() if m.replica.alive())

    def forward(self, number: int, host: str, port: int, data: bytes) -> None:
        datagram = conn_header(number, host, port) + data
        for m in self.members.values():
            m.deliver(datagram)

    def _reply(self, member: ReplicaPort, k: int, payload: bytes, dest):
        if member.replica is not self.service.primary:
            member.keep(k, payload, dest, self.sent)
        elif k >= self.sent:  # below: the failed primary had sent it already
            self.send(k, payload, *dest)


def public_address(port_map: dict[int, int], host: str | None, port: int, bound: str) -> tuple[str, int]:
    """Where the gateway serves the program's port: --port's mapping (0: any
    port), else the same port; on --host, else on the address the program
    bound (a service its author kept to loopback stays there)."""
    return host or bound, port_map.get(port, port_map.get(0, port))


class DatagramService:
    """The UDP side of the gateway: a public port per UDP port the primary
    binds, a ReplicaPort per replica and port."""

    def __init__(self, replicas, primary, host: str | None, port_map: dict[int, int], errors: list[str],
                 listed=lambda replica: replica.listeners(socket.SOCK_DGRAM)):
        self.replicas = replicas
        self.listed = listed                # a replica's ports this service serves (outgoing.py: any-port ones)
        self.primary = primary
        self.host = host
        self.port_map = port_map
        self.errors = errors
        self.ports: dict[int, PublicPort | None] = {}
        self.stats = {"datagrams_in": 0, "datagrams_out": 0, "dropped": 0, "replica_lost": 0,
                      "malformed_replies": 0, "kept_dropped": 0}

    async def watch_once(self):
        """Serves new UDP ports of the primary; connects replicas whose
        program has bound them since."""
        for port, family, bound in self.listed(self.primary):
            public = self.ports.get(port, False)
            # (closed: a port outgoing.py was done with, bound again once the numbers went round)
            if public is False or (public is not None and public.transport is None):
                await self._serve(port, family, bound)
        for port, public in self.ports.items():
            if public is None:
                continue
            for m in public.members.values():
                if m.sock is None and m.replica.alive():
                    m.attach()

    async def _serve(self, port: int, family: int, bound: str):
        host, public = public_address(self.port_map, self.host, port, bound)
        proto = PublicPort(self, port, family)
        try:
            await asyncio.get_running_loop().create_datagram_endpoint(lambda: proto, local_addr=(host, public))
        except OSError as e:
            msg = f"cannot bind {host} UDP port {public} for the program's UDP port {port}: {e.strerror}"
            log.error(msg)
            self.errors.append(msg)
            self.ports[port] = None
            return
        self.ports[port] = proto
        log.info("serving UDP clients on %s port %d (the program's UDP port %d)", host, public, port)

    def promote(self, replica):
        """replica is the primary now: it sends the replies the clients have
        not had yet."""
        self.primary = replica
        for public in self.ports.values():
            if public is None or public.transport is None:   # closed (outgoing.py)
                continue
            m = public.members.get(replica.index)
            if m is None:   # a replica started after this port was served
                continue
            for k, payload, dest in m.kept:
                if k >= public.sent:
                    public.send(k, payload, *dest)
            m.kept.clear()

    def summary(self, index: int) -> dict[str, dict]:
        """What replica index sent, per UDP port."""
        return {str(port): p.members[index].out.summary() for port, p in sorted(self.ports.items())
                if p is not None and index in p.members}

    def close(self):
        for public in self.ports.values():
            if public is not None:
                if public.transport is not None:
                    public.transport.close()
                for m in public.members.values():
                    m._readable()  # what the replicas sent last
                    m.close()
