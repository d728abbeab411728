"""The UDP transport on real sockets (loopback, in one process): unicast
fan-out between two groups of three, with the lossy wrapper injecting
drops, duplicates and reordering."""
from __future__ import annotations

import asyncio
import socket

from llft.messaging.lossy import LossPolicy, LossyTransport
from llft.messaging.node import run_member
from llft.transport import Directory, GroupAddress, group_multicast_address, new_event_loop
from messaging_fixtures import CLIENT, SERVER, check_histories, member_specs


def free_ports(k: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_group_addresses():
    assert group_multicast_address(10) == "239.192.0.10"
    assert group_multicast_address(0x1234) == "239.192.18.52"
    d = Directory([GroupAddress(10, 7000, members={0: ("127.0.0.1", 1), 1: ("127.0.0.1", 2)})], "unicast")
    assert d.destinations(10) == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    assert Directory(list(d.groups.values()), "multicast").destinations(10) == [("239.192.0.10", 7000)]
    assert d.destinations(99) == []


def test_lossy_transport_is_seeded():
    sent = []

    class Sink:
        def send_group(self, g, ds):
            sent.extend(ds)

    class Now:
        def call_later(self, delay, fn, *a):
            fn(*a)
    runs = []
    for _ in range(2):
        sent.clear()
        t = LossyTransport(Sink(), LossPolicy(seed=3, drop=0.3, duplicate=0.3, reorder=0.01), Now())
        for i in range(200):
            t.send_group(1, [bytes([i])])
        runs.append(list(sent))
    assert runs[0] == runs[1] and 100 < len(runs[0]) < 300


def test_two_groups_of_three_on_loopback(tmp_path):
    ports = free_ports(6)
    addrs = {(g, m): ("127.0.0.1", ports.pop()) for g in (CLIENT, SERVER) for m in range(3)}
    specs = member_specs(tmp_path, addrs, mode="unicast", n=400, linger=1.0, deadline=60,
                         lossy={"seed": 1, "drop": 0.1, "duplicate": 0.05, "reorder": 0.002})
    async def members():
        return await asyncio.gather(*(run_member(s) for s in specs))
    loop = new_event_loop()
    try:
        results = loop.run_until_complete(members())
    finally:
        loop.close()
    assert not any(r["timeout"] for r in results)
    finals = check_histories(specs)
    assert all(f["drained"] for f in finals.values()), finals
    assert sum(f["stats"]["counters"].get("retransmissions", 0) for f in finals.values()) > 0
