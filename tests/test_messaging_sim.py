"""Property tests of the messaging protocol over the simulated network:
exactly once, in msgSeqNum order, the same sequence at every member of the
destination group, ordering information intact, every buffer drained after
traffic stops, bounded memory with a slow receiver."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
from llft.ordering.llmp.messaging.history import CheckFailed
from llft.ordering.llmp.messaging.lossy import LossPolicy, message_matches
from llft.ordering.llmp.wire import MsgType
from messaging_fixtures import CLIENT, SERVER, SimCluster, Workload

# LLFT_PROPERTY_EXAMPLES=1000 for a soak run
EXAMPLES = int(os.environ.get("LLFT_PROPERTY_EXAMPLES", "30"))
SIZES = st.sampled_from([16, 100, 1000, 1500, 4000, 30000])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1),
       drop=st.sampled_from([0.0, 0.05, 0.2, 0.3]),
       dup=st.sampled_from([0.0, 0.1]),
       reorder=st.sampled_from([0.0, 0.002, 0.01]),
       sizes=st.lists(SIZES, min_size=1, max_size=40),
       conns=st.integers(1, 2),
       reply=st.booleans(),
       groups=st.sampled_from([(3, 3), (1, 3), (3, 1), (1, 1), (2, 3)]))
def test_reliable_total_order_and_drain(seed, drop, dup, reorder, sizes, conns, reply, groups):
    policy = LossPolicy(seed=seed, drop=drop, duplicate=dup, delay=0.0005, reorder=reorder)
    cluster = SimCluster(seed, policy, Workload(sizes, conns=conns, reply_size=40 if reply else None),
                         sizes=groups)
    cluster.run(limit=60)
    cluster.check()


@settings(max_examples=max(3, EXAMPLES // 6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), drop=st.sampled_from([0.0, 0.1, 0.2]),
       reply=st.booleans(), consume=st.integers(1, 2))
def test_slow_receiver_memory_bounded(seed, drop, reply, consume):
    """A fast sender and receivers that consume one or two messages per
    millisecond: the sender blocks instead of the receivers' buffers growing.
    What the remote group has and its watermark holds back is bounded
    apart (kept_window)."""
    cfg = Config(send_window=16, recv_window=24, kept_window=32)
    work = Workload([200] * 400, reply_size=40 if reply else None, consume_per_tick=consume)
    cluster = SimCluster(seed, LossPolicy(seed=seed, drop=drop, delay=0.0005, reorder=0.001), work, config=cfg)
    # Everything is queued at once: only flow control stands between the
    # 400 messages and the receivers.
    cluster.run(limit=60)
    cluster.check()
    for m in cluster.members:
        assert m.peak["in_flight"] <= cfg.send_window, (m.name, m.peak)
        assert m.peak["sent"] <= cfg.send_window + cfg.kept_window, (m.name, m.peak)
        # unconsumed + consumed but not yet known to be everywhere
        assert m.peak["held"] <= 2 * cfg.recv_window + cfg.kept_window, (m.name, m.peak)
        assert m.peak["ready"] <= cfg.recv_window, (m.name, m.peak)


@settings(max_examples=max(3, EXAMPLES // 6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), drop=st.sampled_from([0.0, 0.1]))
def test_bytes_in_flight_bounded_for_large_messages(seed, drop):
    """30 kB messages against a window of 256 messages: the byte window
    holds the sender to 64 KiB in flight (plus the message that crossed
    it), not 7.5 MB, which would overflow the receivers' socket buffers."""
    cfg = Config(send_window_bytes=64 << 10)
    work = Workload([30000] * 60, reply_size=None, consume_per_tick=1)
    cluster = SimCluster(seed, LossPolicy(seed=seed, drop=drop, delay=0.0005), work, config=cfg)
    cluster.run(limit=60)
    cluster.check()
    sender = cluster.clients[0]
    assert sender.peak["in_flight"] > 1, "nothing was ever in flight: the test no longer exercises the window"
    assert sender.peak["in_flight_bytes"] <= cfg.send_window_bytes + 30000, sender.peak


def test_slow_backup_invokes_intra_group_flow_control():
    """Backups of the sending group run behind: the server primary's
    FirstAcks go unanswered by SecondAcks, the client primary counts more
    than MAX_ACK of them and throttles until its backups catch up."""
    work = Workload([100] * 40, reply_size=None, backup_lag=0.5)
    cluster = SimCluster(3, LossPolicy(seed=3, delay=0.0005), work)
    cluster.run(limit=60)
    cluster.check()
    names = [e for e, _ in cluster.clients[0].ep.events]
    assert "throttle" in names and "unthrottle" in names


def test_one_mebibyte_messages_under_loss():
    work = Workload([1 << 20, 16, 1 << 20], reply_size=100)
    cluster = SimCluster(11, LossPolicy(seed=11, drop=0.2, duplicate=0.05, delay=0.0005, reorder=0.002), work)
    cluster.run(limit=60)
    cluster.check()


def test_first_and_last_message_dropped_everywhere():
    """Targeted drops: the first and last Request never arrive on their
    first transmission; the tail is found by retransmission timeout."""
    seen: dict = {}

    def first_or_last(m):
        if m.TYPE != MsgType.REQUEST or m.msn not in (1, 30):
            return False
        seen[m.msn] = seen.get(m.msn, 0) + 1
        return seen[m.msn] <= 3  # every receiver loses the first transmission
    policy = LossPolicy(seed=1, delay=0.0005, targets=[message_matches(first_or_last)])
    cluster = SimCluster(1, policy, Workload([100] * 30, reply_size=None))
    cluster.run(limit=30)
    cluster.check()
    assert cluster.clients[0].ep.counters["retransmissions"] >= 2


def test_order_info_reaches_backups_without_reflection():
    """One-way traffic and every FirstAck/KeepAlive from the server group
    lost: nothing reflects the client primary's ordering information, so
    it must reach the client backups on the primary's Heartbeats."""
    no_reflect = message_matches(lambda m: m.src_group == SERVER and m.TYPE in (MsgType.FIRST_ACK, MsgType.KEEP_ALIVE))
    cluster = SimCluster(5, LossPolicy(seed=5, delay=0.0005, targets=[no_reflect]),
                         Workload([64] * 20, reply_size=None))
    cluster.run(limit=10, settle=0.5)
    for b in cluster.clients[1:]:
        assert b.orders == cluster.clients[0].attached


class NoNackRetransmission(GroupEndpoint):
    """A deliberately broken variant: never sends a Nack."""

    def _send_nack(self, c, msns, now):
        c.last_nack = now


def test_checker_catches_disabled_nacks():
    """The checker is meaningful: the same workload that passes above fails
    when Nack retransmission is disabled (backups never recover a loss)."""
    work = Workload([100] * 40, reply_size=40)
    policy = LossPolicy(seed=2, drop=0.2, delay=0.0005)
    cluster = SimCluster(2, policy, work, endpoint_cls=NoNackRetransmission)
    cluster.run(limit=5)
    with pytest.raises(CheckFailed):
        cluster.check()
    ok = SimCluster(2, LossPolicy(seed=2, drop=0.2, delay=0.0005), work)
    ok.run(limit=30)
    ok.check()


class DuplicatingDelivery(GroupEndpoint):
    """Broken: hands a retransmitted copy to the application again instead
    of discarding it (Fig. 6 line 30)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.again = []

    def _on_application(self, c, msg, data):
        if msg.msn <= c.rx.consumed:
            self.again.append((c.id, msg.payload))
        super()._on_application(c, msg, data)

    def recv(self):
        return self.again.pop() if self.again else super().recv()


def test_checker_catches_duplicate_delivery():
    work = Workload([100] * 40, reply_size=40)
    cluster = SimCluster(4, LossPolicy(seed=4, drop=0.2, duplicate=0.2, delay=0.0005), work,
                         endpoint_cls=DuplicatingDelivery)
    cluster.run(limit=5)
    with pytest.raises(CheckFailed):
        cluster.check()


def test_primary_knows_when_every_backup_holds_what_it_received():
    """backups_hold_all_received (a leaving primary waits for it): false
    while a backup lacks a client message the primary has, true once the
    backup got it again through its Nack to the primary."""
    from llft.auth import Keyring
    from llft.ordering.llmp.messaging.clock import SimClock
    from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group

    copies = {"n": 0}

    def backups_copy_of_second(m) -> bool:       # each copy is planned per receiver: the primary's, then the backup's
        if m.TYPE == MsgType.REQUEST and m.msn == 2:
            copies["n"] += 1
            return copies["n"] == 2
        return False

    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(delay=0.0005, targets=[message_matches(backups_copy_of_second)]))
    key = Keyring(b"k" * 32)
    primary, backup = make_group(net, SERVER, 2, key)
    client = make_group(net, CLIENT, 1, key)[0]
    cid = client.connect(SERVER, 1)
    client.send(cid, b"first")
    assert clock.run_until(1.0, lambda: primary.backups_hold_all_received() and backup.conns.get(cid))
    client.send(cid, b"second")
    assert clock.run_until(clock.now() + 1.0, lambda: primary.conns[cid].rx.received_upto == 2)
    assert backup.conns[cid].rx.received_upto == 1
    assert not primary.backups_hold_all_received()
    assert clock.run_until(clock.now() + 1.0, lambda: backup.conns[cid].rx.received_upto == 2)
    assert clock.run_until(clock.now() + 1.0, primary.backups_hold_all_received)


def test_a_backup_that_missed_a_whole_connection_learns_it_from_the_primary():
    """Nothing the client group sends reaches a backup (as nothing reaches
    a newcomer restoring its replica, which drops the group's datagrams,
    and the connection is over before it is back): nothing it received
    names the new connection, so it cannot Nack it.  The primary's
    Heartbeat lists the connection with the highest message it has: the
    backup learns of it, Nacks from the first message, and gets them from
    the primary."""
    from llft.auth import Keyring
    from llft.ordering.llmp.messaging.clock import SimClock
    from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group

    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(delay=0.0005))
    key = Keyring(b"k" * 32)
    primary, backup = make_group(net, SERVER, 2, key)
    client = make_group(net, CLIENT, 1, key)[0]
    to_primary_only = SimNetwork(clock, LossPolicy(delay=0.0005))
    to_primary_only.members = {SERVER: [primary.datagram_received], CLIENT: net.members[CLIENT]}
    client.transport = to_primary_only
    cid = client.connect(SERVER, 1)
    for body in (b"one", b"two", b"three"):
        client.send(cid, body)
    assert clock.run_until(1.0, lambda: primary.conns.get(cid) and primary.conns[cid].rx.received_upto == 3)
    assert clock.run_until(clock.now() + 2.0, lambda: backup.conns.get(cid)
                           and backup.conns[cid].rx.received_upto == 3), "the backup never got the connection"
    assert backup.counters["connections_learned"] == 1
    assert clock.run_until(clock.now() + 1.0, primary.backups_hold_all_received)


@pytest.mark.parametrize("drop", [0.0, 0.1])
def test_a_backlog_of_ordering_information_no_message_carries_reaches_the_backups_in_bursts(drop):
    """A program that makes megabytes of records in one long request has no
    message for them to ride on: the primary's Heartbeats carry them.  One
    run of order_budget bytes a Heartbeat took 128 Heartbeats (2.6 s) for
    1 MiB; the backups hold all of it within a few Heartbeats of
    order_fallback, every entry once, in order, also when a tenth of the
    datagrams is lost.  (Simulated time: the count of Heartbeats is the
    property, not this machine's speed.)"""
    from llft.auth import Keyring
    from llft.ordering.llmp.messaging.clock import SimClock
    from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(seed=3, drop=drop, delay=0.0005))
    config = Config()
    primary, *backups = make_group(net, SERVER, 3, Keyring(b"k" * 32), config)
    got = {b.me: [] for b in backups}
    for b in backups:
        b.on_order = lambda oseq, blob, me=b.me: got[me].append((oseq, blob))
    blobs = [os.urandom(4000) for _ in range(256)]   # 1 MiB, in entries of a record group's size
    for blob in blobs:
        primary.add_order_info(blob)
    clock.run_until(config.order_fallback + 10 * config.heartbeat)
    if drop == 0.0:
        for me, entries in got.items():
            assert [b for _oseq, b in entries] == blobs, f"backup {me} holds {len(entries)} of {len(blobs)} entries"
    clock.run_until(5.0)
    for me, entries in got.items():
        assert [b for _oseq, b in entries] == blobs and [k for k, _b in entries] == list(range(1, 257)), me
    assert primary.order_log.confirmed == 256 and not primary.order_log.entries
