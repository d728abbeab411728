"""The gateway's public UDP port for one of the program's UDP ports: what a
gateway on one host (serving/datagrams.py) and across hosts
(cluster/datagrams.py) do alike.  Client datagrams are numbered in the
order they arrive and handed on with the client's address; replies go out
from this port, each once, in the program's order (k, from 0)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

log = logging.getLogger("llft.datagrams")


class PublicUdpPort(asyncio.DatagramProtocol):
    def __init__(self, program_port: int, family: int, stats: dict):
        self.program_port = program_port
        self.family = family          # the program's socket's: an AF_INET6 one sees IPv4 clients as ::ffff:a.b.c.d
        self.stats = stats
        self.transport: asyncio.DatagramTransport | None = None
        self.number = 0               # client datagrams numbered so far
        self.sent = 0                 # replies sent to clients: the next k expected

    # -- what each gateway does with a client datagram --------------------
    def full(self) -> bool:
        """Too much waits for the group: the datagram is dropped (UDP may)."""
        raise NotImplementedError

    def forward(self, number: int, host: str, port: int, data: bytes) -> None:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport

    def error_received(self, exc):
        log.debug("UDP port %d: %s", self.program_port, exc)

    def datagram_received(self, data: bytes, addr):
        if self.full():
            self.stats["dropped"] += 1    # bounded memory: dropped before any replica sees it
            return
        host = addr[0]
        ip = ipaddress.ip_address(host)
        if self.family == socket.AF_INET and ip.version == 6 and ip.ipv4_mapped is not None:
            host = str(ip.ipv4_mapped)
        self.number += 1
        self.stats["datagrams_in"] += 1
        self.forward(self.number, host, addr[1], data)

    def send(self, k: int, data: bytes, host: str, port: int) -> None:
        """Reply k of the program to the client at (host, port)."""
        self.sent = k + 1
        if self.transport.get_extra_info("socket").family == socket.AF_INET6 and ":" not in host:
            host = "::ffff:" + host
        try:
            self.transport.sendto(data, (host, port))
            self.stats["datagrams_out"] += 1
        except (OSError, ValueError) as e:
            log.debug("UDP port %d: reply to %s:%d lost: %s", self.program_port, host, port, e)
