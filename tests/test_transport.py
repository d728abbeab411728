"""The UDP transport on real sockets (loopback, in one process): unicast
fan-out between two groups of three, with the lossy wrapper injecting
drops, duplicates and reordering."""
from __future__ import annotations

import asyncio
import socket

from llft.ordering.llmp.messaging.lossy import LossPolicy, LossyTransport
from llft.ordering.llmp.messaging.node import run_member
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


def test_async_member_waits_for_window_on_real_sockets():
    """A 4-message send window and 300 requests: senders wait for
    on_writable (never polling), and every request and reply arrives."""
    from llft.ordering.llmp.messaging.aio import AsyncMember
    from llft.ordering.llmp.messaging.node import open_member
    ports = free_ports(2)
    groups = [{"group": g, "port": 0, "members": {"0": ["127.0.0.1", ports[i]]}}
              for i, g in enumerate((CLIENT, SERVER))]
    spec = {"mode": "unicast", "groups": groups, "key": "11" * 32, "interface": "127.0.0.1",
            "member": 0, "config": {"send_window": 4}}

    async def run():
        client = AsyncMember(await open_member(dict(spec, group=CLIENT)))
        server = AsyncMember(await open_member(dict(spec, group=SERVER)))

        async def echo():
            for _ in range(300):
                conn, payload = await server.recv()
                await server.send(conn, payload[::-1])
        task = asyncio.ensure_future(echo())
        conn = client.ep.connect(SERVER, 1)

        async def produce():
            for i in range(300):
                await client.send(conn, b"%05d" % i)
        producer = asyncio.ensure_future(produce())
        replies = [(await client.recv())[1] for _ in range(300)]
        await producer
        await task
        for m in (client, server):
            m.ep.close()
            m.ep.udp.close()
        return replies
    loop = new_event_loop()
    try:
        replies = loop.run_until_complete(asyncio.wait_for(run(), 60))
    finally:
        loop.close()
    assert replies == [(b"%05d" % i)[::-1] for i in range(300)]
