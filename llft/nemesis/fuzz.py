"""Bad datagrams against a live group across hosts: garbage, truncated and
mutated copies of the group's own traffic, well-formed messages of every
type sealed with a wrong key, and the group's own datagrams replayed
verbatim, sent from a host of their own to the group's and the gateway's
multicast addresses and to each member.  Meanwhile checkable clients go
on; afterwards every member and the gateway must still run, the view be
the one before, and every answer be right: nothing bad was accepted."""
from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

from llft.ordering.llmp import wire
from llft.auth import Keyring
from llft.ordering.llmp.messaging.fragments import split
from llft.nemesis import hosts
from llft.transport import DEFAULT_PORT, group_multicast_address

MAX_DATAGRAM = 1472
CATEGORIES = ("garbage", "truncated", "mutated", "forged", "replayed")


def capture(ns: str, groups: list[int], want: int, timeout: float) -> dict[int, list[bytes]]:
    """Up to `want` datagrams of each group's traffic, as a host on their
    network hears it (joined to their multicast addresses)."""
    got: dict[int, list[bytes]] = {g: [] for g in groups}

    def listen():
        hosts.enter(ns)
        socks = {}
        for g in groups:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((group_multicast_address(g), DEFAULT_PORT))   # this group's datagrams only
            mreq = struct.pack("4s4s", socket.inet_aton(group_multicast_address(g)), socket.inet_aton("0.0.0.0"))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            s.setblocking(False)
            socks[g] = s
        end = time.monotonic() + timeout
        while any(len(v) < want for v in got.values()) and time.monotonic() < end:
            idle = True
            for g, s in socks.items():
                try:
                    got[g].append(s.recv(65536))
                    idle = False
                except BlockingIOError:
                    pass
            if idle:
                time.sleep(0.001)
        for s in socks.values():
            s.close()
    t = threading.Thread(target=listen)
    t.start()
    t.join()
    return got


def forged(rng: random.Random, wrong: Keyring, gid: int) -> list[bytes]:
    """A well-formed message of a random type, sealed with a key not the group's."""
    t = rng.choice(list(wire.MsgType))
    m = wire.make(t, src_group=rng.choice([gid, rng.randrange(1, 1 << 16)]), dst_group=gid,
                  conn_seq=rng.randrange(1, 100), role=rng.choice([0, 1, 2]), sender=rng.randrange(1 << 30),
                  pvn=rng.randrange(1, 1000), precedence=rng.randrange(1, 1000),
                  msn=rng.randrange(1, 1 << 20) if t in wire.APPLICATION_TYPES else 0,
                  payload=b"SET stolen 1\n" if t == wire.MsgType.REQUEST else b"")
    return split(wrong, gid, wire.encode_message(m), MAX_DATAGRAM)


def bad_datagrams(rng: random.Random, captured: dict[int, list[bytes]]):
    """(category, datagram, group it goes to) without end, the categories in
    turn.  A replayed datagram goes to the group it was heard going to:
    valid there, and already had."""
    wrong = Keyring(os.urandom(32))
    groups = [g for g, v in captured.items() if v]
    pending: list[bytes] = []
    k = 0
    while True:
        category = CATEGORIES[k % len(CATEGORIES)]
        k += 1
        g = rng.choice(groups)
        if category == "garbage":
            yield category, os.urandom(rng.randrange(1, MAX_DATAGRAM)), g
        elif category == "truncated":
            d = rng.choice(captured[rng.choice(groups)])
            yield category, d[:rng.randrange(0, len(d))], g
        elif category == "mutated":
            original = rng.choice(captured[rng.choice(groups)])
            d = bytearray(original)
            while d == original:   # (flips of one bit twice cancel: that would be a replay)
                for _ in range(rng.randrange(1, 9)):
                    d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
            yield category, bytes(d), g
        elif category == "forged":
            if not pending:
                pending = forged(rng, wrong, g)
            yield category, pending.pop(0), g
        else:
            yield category, rng.choice(captured[g]), g


def send(ns: str, datagrams, count: int, rate: float, sent: dict[tuple[str, int], int]):
    """Sends `count` datagrams from host ns to their groups' multicast
    addresses, about `rate` a second; counts them by (category, group)."""
    def run():
        hosts.enter(ns)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        start = time.monotonic()
        for n in range(count):
            category, d, g = next(datagrams)
            try:
                s.sendto(d, (group_multicast_address(g), DEFAULT_PORT))
            except OSError:
                continue   # (ENOBUFS: the host's queue is full) not sent, not counted
            sent[(category, g)] = sent.get((category, g), 0) + 1
            ahead = start + (n + 1) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        s.close()
    t = threading.Thread(target=run)
    t.start()
    t.join()
