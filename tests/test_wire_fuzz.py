"""Decoder fuzzing: random and mutated datagrams never raise out of the
receive loop, each bad one is counted as a drop, and nothing with a bad MAC
is ever delivered."""
from __future__ import annotations

import random

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from llft.ordering.llmp import wire
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
from llft.ordering.llmp.messaging.fragments import split
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.wire import MsgType, Piggyback
from messaging_fixtures import CLIENT, KEY, SERVER, SimCluster, Workload


class Sink:
    def __init__(self):
        self.sent = []

    def send_group(self, group, datagrams):
        self.sent.extend(datagrams)


def endpoint(member=1) -> GroupEndpoint:
    view = View(SERVER, primary=0, precedences={0: 1, 1: 2, 2: 3})
    return GroupEndpoint(view, member, SimClock(), Sink(), KEY, Config())


def valid_datagrams() -> list[bytes]:
    """One or more datagrams of every message type, including fragments."""
    out = []
    for t in MsgType:
        src = SERVER if t in (MsgType.HEARTBEAT, MsgType.PROPOSE_PRIMARY) else CLIENT
        m = wire.make(t, src_group=src, dst_group=SERVER, conn_seq=1, role=2 if src == SERVER else 0,
                      sender=0, pvn=1, precedence=1, msn=1 if t in wire.APPLICATION_TYPES else 0,
                      ack=1, back=3, timestamp=5, last_msn=1, payload=b"p" * 20,
                      piggyback=Piggyback(1, [b"o" * 64], 0, [], 0),
                      body={"rw": [[CLIENT, SERVER, 1, 3, 1]], "oupto": 0} if t == MsgType.HEARTBEAT
                      else wire.nack_body((CLIENT, SERVER, 1), [1, 2]) if t == MsgType.NACK else None)
        out += split(KEY, SERVER, wire.encode_message(m), 1472)
    big = wire.Request(src_group=CLIENT, dst_group=SERVER, conn_seq=1, msn=2, last_msn=2, payload=b"z" * 5000)
    return out + split(KEY, SERVER, wire.encode_message(big), 1472)


VALID = valid_datagrams()
VALID_SET = set(VALID)


def mutate(d: bytes, r: random.Random) -> bytes:
    d = bytearray(d)
    op = r.randrange(5)
    if op == 0:
        for _ in range(r.randint(1, 4)):
            d[r.randrange(len(d))] ^= 1 << r.randrange(8)
    elif op == 1:
        del d[r.randrange(len(d)):]
    elif op == 2:
        d += bytes(r.randrange(256) for _ in range(r.randint(1, 40)))
    elif op == 3:
        i = r.randrange(len(d))
        d[i:i + 1] = bytes(r.randrange(256) for _ in range(r.randint(0, 8)))
    else:
        other = VALID[r.randrange(len(VALID))]
        cut = r.randrange(min(len(d), len(other)))
        d = d[:cut] + other[cut:]
    return bytes(d)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_random_bytes_are_counted_drops(data):
    ep = endpoint()
    ep.datagram_received(data)
    assert ep.drops.total() == 1
    assert ep.recv() is None


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_datagrams_never_delivered(seed):
    r = random.Random(seed)
    ep = endpoint()
    bad = 0
    for _ in range(20):
        d = VALID[r.randrange(len(VALID))]
        m = mutate(d, r)
        if m in VALID_SET:   # a splice can reproduce a genuine datagram
            continue
        bad += 1
        ep.datagram_received(m)
    assert ep.drops.total() == bad
    assert ep.recv() is None and ep.counters["rx_request"] == 0


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_authentic_but_hostile_bodies_never_raise(seed):
    """A key holder (or a bug) sending well-MACed garbage: msgpack values of
    the wrong shape, extreme numbers.  Dropped or ignored, never a crash."""
    r = random.Random(seed)
    ep = endpoint(member=r.choice([0, 1]))
    values = [None, -1, 0, 1, 2**64 - 1, 1.5, "s", b"b", [], {}, [[1, 2, 3, 4, 5]], {"rw": 1},
              {"gwm": [[1, 2, 3]]}, {"ord": [1]}, [[1, 2, 3], [2**64 - 1]], [0, [b"x"], 0, 5, 0]]
    for _ in range(30):
        fields = [1, r.choice([t.value for t in MsgType] + [0, 99])]
        fields += [r.choice([r.randrange(2**64), 2**64 - 1, r.randrange(4), CLIENT, SERVER])
                   for _ in wire.HEADER_FIELDS]
        fields[3] = SERVER
        fields += [r.choice(values), r.choice(values), r.choice([b"", b"x" * 10, "t", None])]
        if r.random() < 0.3:
            fields[r.randrange(len(fields))] = r.choice(values)
        data = msgpack.packb(fields, use_bin_type=True)
        for d in split(KEY, SERVER, data, 1472):
            ep.datagram_received(d)
        ep._tick()   # periodic processing over whatever state that left
    ep.stats()


def test_garbage_interleaved_with_live_traffic():
    """The receive loop keeps delivering correctly while a third of all
    datagrams on the wire arrive corrupted next to the real ones."""
    policy = LossPolicy(seed=9, drop=0.1, delay=0.0005)
    cluster = SimCluster(9, policy, Workload([100, 3000] * 15))
    r = random.Random(9)
    real = cluster.net.send_group
    noise = [True]

    def noisy(group, datagrams):
        real(group, datagrams)
        if noise[0]:
            real(group, [mutate(d, r) for d in datagrams if r.random() < 0.33])
    cluster.net.send_group = noisy
    for m in cluster.members:
        m.ep.transport = cluster.net   # endpoints call net.send_group
    cluster.run(limit=30)
    # A garbage datagram that is a valid fragment (a splice of a whole VALID
    # one) waits in reassembly until it times out: the noise stops, and the
    # buffers are checked once that time has passed.
    noise[0] = False
    cluster.clock.run_until(cluster.clock.now() + cluster.members[0].ep.config.reassembly_timeout + 0.1)
    cluster.check()
    assert sum(m.ep.drops.total() for m in cluster.members) > 50
