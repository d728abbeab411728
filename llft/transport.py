"""UDP transport for the messaging protocol.

Each group has a virtual port: its members receive on one UDP multicast
address derived from the group id (239.192.hi.lo) and a port, or, where the
network has no multicast, by unicast fan-out to a known member list.  The
transport only moves datagrams (`send_group(group, datagrams)` and a receive
callback); frames, MACs and reassembly are in `llft.ordering.llmp.messaging.fragments`.
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import struct
from collections import deque
from collections.abc import Sequence
import termios
from dataclasses import dataclass, field
from typing import Callable

MULTICAST_PREFIX = (239, 192)
DEFAULT_PORT = 17400
SOCKET_BUFFER = 8 << 20
BURST = 64                      # datagrams sent per event-loop turn while a large message goes out
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed: ~3x lower UDP round trip than the stock loop here."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def group_multicast_address(group: int) -> str:
    """One multicast address per group (groups are told apart modulo 2^16)."""
    return "%d.%d.%d.%d" % (*MULTICAST_PREFIX, (group >> 8) & 0xFF, group & 0xFF)


@dataclass
class GroupAddress:
    group: int
    port: int = DEFAULT_PORT
    multicast: str | None = None                  # default: derived from the group id
    members: dict[int, tuple[str, int]] = field(default_factory=dict)  # unicast fan-out

    def __post_init__(self) -> None:
        if self.multicast is None:
            self.multicast = group_multicast_address(self.group)


class Directory:
    """Where each group receives.  mode: 'multicast' or 'unicast'."""

    def __init__(self, groups: list[GroupAddress], mode: str = "multicast"):
        if mode not in ("multicast", "unicast"):
            raise ValueError(f"unknown transport mode {mode!r}")
        self.mode = mode
        self.groups = {g.group: g for g in groups}

    def destinations(self, group: int) -> list[tuple[str, int]]:
        g = self.groups.get(group)
        if g is None:
            return []
        if self.mode == "multicast":
            return [(g.multicast, g.port)]
        return list(g.members.values())


class UdpTransport(asyncio.DatagramProtocol):
    """One socket per member: receives its group's traffic, sends to any group."""

    def __init__(self, directory: Directory, receive: Callable[[bytes, object], None]):
        self.directory = directory
        self.receive = receive
        self.transport: asyncio.DatagramTransport | None = None
        self.errors = 0
        self.datagrams_sent = 0
        self._bulk: deque[list] = deque()   # [address, datagrams, next index], in order
        self._draining = False

    @classmethod
    async def open(cls, directory: Directory, group: int, member: int,
                   receive: Callable[[bytes, object], None], interface: str = "0.0.0.0",
                   loop: asyncio.AbstractEventLoop | None = None) -> "UdpTransport":
        loop = loop or asyncio.get_running_loop()
        sock = cls._socket(directory, group, member, interface)
        _, proto = await loop.create_datagram_endpoint(lambda: cls(directory, receive), sock=sock)
        return proto

    @staticmethod
    def _socket(directory: Directory, group: int, member: int, interface: str) -> socket.socket:
        g = directory.groups[group]
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A 1 MiB message is a burst of ~730 datagrams: ask for room for it.
        # The *FORCE variants pass net.core.rmem_max when we are root.
        for force, opt in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE
            try:
                s.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
            except OSError:
                s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        if directory.mode == "multicast":
            # Bound to the group's address: only this group's datagrams arrive.
            s.bind((g.multicast, g.port))
            s.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
            mreq = struct.pack("4s4s", socket.inet_aton(g.multicast), socket.inet_aton(interface))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        else:
            s.bind(g.members[member])
        s.setblocking(False)
        return s

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1

    def unread(self) -> bool:
        """Is a datagram waiting in the socket, not yet read by the event
        loop?  (A fault detector must not call a member silent while its
        Heartbeat may be sitting here.)"""
        if getattr(self, "_fd", -1) < 0:
            return False
        size = array.array("i", [0])
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, size, True)
        except OSError:
            return False
        return size[0] > 0

    def datagram_received(self, data: bytes, addr) -> None:
        self.receive(data, addr)

    def error_received(self, exc: Exception) -> None:
        self.errors += 1   # e.g. ICMP port unreachable from a member that is down

    def send_group(self, group: int, datagrams: Sequence[bytes]) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if len(datagrams) <= BURST:
            for addr in self.directory.destinations(group):
                for d in datagrams:
                    t.sendto(d, addr)
                    self.datagrams_sent += 1
            return
        # A large message (a state transfer) goes out a burst per event-loop
        # turn, its frames made as they go, and smaller messages (Heartbeats)
        # go out meanwhile: a primary that stalled for the whole message
        # would be suspected by its backups.  (Datagrams may be reordered
        # anyway; the protocol does not rely on their order.)
        for addr in self.directory.destinations(group):
            self._bulk.append([addr, datagrams, 0])
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        t, budget = self.transport, BURST
        while self._bulk and budget > 0:
            if t is None or t.is_closing():
                self._bulk.clear()
                break
            entry = self._bulk[0]
            addr, datagrams, pos = entry
            end = min(len(datagrams), pos + budget)
            for i in range(pos, end):
                t.sendto(datagrams[i], addr)
            self.datagrams_sent += end - pos
            budget -= end - pos
            if end == len(datagrams):
                self._bulk.popleft()
            else:
                entry[2] = end
        if self._bulk:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._draining = False

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
