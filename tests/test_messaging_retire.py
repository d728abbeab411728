"""Finished connections are retired (llft/ordering/llmp/messaging/retire.py), idle ones
cost next to nothing, on the simulated network with loss."""
from __future__ import annotations

import pytest

from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.retire import GIVE_UP_S, LINGER_S, RETIRED_DROP, Tombstones
from llft.ordering.llmp.messaging.viewchange import adopt_connection, connection_state
from llft.ordering.llmp.wire import MsgType

from messaging_fixtures import KEY, SERVER, SimCluster, Workload


def keepalives(cluster) -> int:
    return sum(m.ep.counters["tx_keep_alive"] for m in cluster.members)


def decoded(ep, datagram: bytes):
    """(message, its bytes) that a single-fragment datagram carries, or None."""
    try:
        return ep.codec.decode(datagram, 0.0)
    except Exception:   # trailing frames: not one we re-inject
        return None


def finished_workload(seed: int, drop: float, conns: int = 20, config: Config | None = None) -> SimCluster:
    cluster = SimCluster(seed, LossPolicy(seed=seed, drop=drop, delay=0.0005), Workload([100] * 60, conns=conns),
                         config=config)
    cluster.run()
    cluster.check()
    return cluster


def test_idle_connections_send_keepalives_ever_more_rarely():
    """Fig. 6 sends a KeepAlive every 50 ms on each idle connection: 20 idle
    connections for 10 s would be 4,000 at each primary.  Saying nothing new,
    they back off to one per 2 s per connection."""
    cluster = finished_workload(1, 0.0)
    before, t = keepalives(cluster), cluster.clock.now()
    cluster.clock.run_until(t + 10.0)
    assert keepalives(cluster) - before < 2 * 20 * 12     # 2 primaries, 20 connections, ~11 each
    assert all(len(m.ep.conns) == 20 for m in cluster.members)   # nobody finished them: they stay


def test_idle_connections_back_off_while_another_one_is_busy():
    """The primary's new ordering information rides on every connection's
    KeepAlive; counted as news, it kept every idle connection at the base
    period as long as any connection was busy (300 idle connections across
    hosts: 6,000 KeepAlives a second from the primary)."""
    # (the group watermark's round trips pace the busy connection, through
    # a small kept_window: busy for over a second)
    cluster = finished_workload(7, 0.0, config=Config(kept_window=128))
    client = cluster.clients[0]
    busy = sorted(client.ep.conns)[0]
    client.todo = type(client).requests([busy], [100] * 8000)
    before, t = keepalives(cluster), cluster.clock.now()
    while client.todo:
        cluster.clock.run_until(cluster.clock.now() + 0.05)
    busy_for = cluster.clock.now() - t
    assert busy_for > 1.0, busy_for
    # Backing off: ~5 per idle connection and primary in the first second, ~1 a second after.
    assert keepalives(cluster) - before < 2 * 19 * (6 + busy_for), busy_for


def test_new_traffic_brings_keepalives_back_to_the_base_period():
    cluster = finished_workload(2, 0.0, conns=1)
    t = cluster.clock.now()
    cluster.clock.run_until(t + 10.0)
    (c,) = cluster.servers[0].ep.conns.values()
    assert c.keepalive_every == cluster.config.keepalive_max
    client = cluster.clients[0]
    client.todo = type(client).requests(list(client.ep.conns), [100])
    cluster.clock.run_until(t + 10.5)
    assert c.keepalive_every < cluster.config.keepalive_max


@pytest.mark.parametrize("seed,drop", [(3, 0.0), (4, 0.1)])
def test_finished_connections_are_retired_everywhere(seed, drop):
    cluster = finished_workload(seed, drop)
    for m in cluster.members:
        for cid in list(m.ep.conns):
            m.ep.finish(cid)
    cluster.clock.run_until(cluster.clock.now() + LINGER_S + 1.0)
    for m in cluster.members:
        assert not m.ep.conns, (m.name, m.ep.finishing_busy())
        assert m.ep.counters["connections_retired"] == 20
        assert not m.ep.orphans or not any(o.entries for o in m.ep.orphans.values())
    # Nothing more goes out for them: no KeepAlives, no Heartbeat rows.
    before = keepalives(cluster)
    cluster.clock.run_until(cluster.clock.now() + 5.0)
    assert keepalives(cluster) == before


def test_a_late_message_for_a_retired_connection_is_dropped_not_reopened():
    cluster = SimCluster(5, LossPolicy(seed=5, delay=0.0005), Workload([100] * 4))
    sent = []
    cluster.net.send_group = (lambda orig: lambda g, ds: (sent.extend((g, d) for d in ds), orig(g, ds)))(
        cluster.net.send_group)
    cluster.run()
    for m in cluster.members:
        for cid in list(m.ep.conns):
            m.ep.finish(cid)
    cluster.clock.run_until(cluster.clock.now() + LINGER_S + 1.0)
    assert not any(m.ep.conns for m in cluster.members)
    server = cluster.servers[0].ep
    opened = server.counters["event_connection"]
    requests = [(d, got[1]) for g, d in sent if g == server.group
                and (got := decoded(server, d)) and got[0].TYPE == MsgType.REQUEST]
    for d, data in requests:        # a stray retransmission, long after
        server.codec.forget(data)
        server.datagram_received(d)
    assert requests and not server.conns
    assert server.drops.snapshot().get(RETIRED_DROP, 0) >= len(requests)
    assert server.counters["event_connection"] == opened     # the application never hears of it again


def test_a_connection_the_remote_side_no_longer_answers_on_goes_after_a_while():
    """The remote group retired it first and drops what we send: we give up
    after GIVE_UP_S rather than keep it (and retransmit) forever."""
    cluster = finished_workload(6, 0.0, conns=1)
    for m in cluster.clients:                     # the client side is done and gone
        for cid in list(m.ep.conns):
            m.ep.retire_now(cid, 0)
    server = cluster.servers[0]
    (cid,) = server.ep.conns
    server.ep.send(cid, b"one more reply nobody will acknowledge")
    for m in cluster.servers:
        m.ep.finish(cid)
    cluster.clock.run_until(cluster.clock.now() + LINGER_S + 1.0)
    assert cid in server.ep.conns                 # not quiet: it waits for the acknowledgment...
    cluster.clock.run_until(cluster.clock.now() + GIVE_UP_S)
    assert cid not in server.ep.conns             # ...but not forever
    assert server.ep.counters["connections_retired_unquiet"] == 1


def test_tombstones_keep_a_contiguous_low_range_and_the_rest():
    t = Tombstones()
    for seq in (1, 2, 4, 5):
        t.add(ConnId(10, 20, seq))
    assert ConnId(10, 20, 2) in t and ConnId(10, 20, 4) in t
    assert ConnId(10, 20, 3) not in t and ConnId(10, 20, 6) not in t and ConnId(11, 20, 1) not in t
    t.add(ConnId(10, 20, 3))
    assert t._low[(10, 20)] == 5 and not t._above[(10, 20)]
    assert len(t) == 5


def test_members_list_the_same_retired_connections_whatever_order_they_retired_in(monkeypatch):
    """llft-status lists some retired connections' message counts, which the
    tests compare across members; members retire in their own time, so the
    listing keeps the lowest connections, not the first retired."""
    monkeypatch.setattr("llft.ordering.llmp.messaging.retire.RETIRED_SENT_KEPT", 8)
    cluster = finished_workload(8, 0.0)
    primary, backup = cluster.servers[:2]
    cids = sorted(primary.ep.conns)
    for a, b in zip(cids, reversed(cids)):          # opposite orders, a retirement check apart
        primary.ep.finish(a)
        backup.ep.finish(b)
        cluster.clock.run_until(cluster.clock.now() + 0.2)
    cluster.clock.run_until(cluster.clock.now() + LINGER_S + 1.0)
    assert not primary.ep.conns and not backup.ep.conns
    assert list(sorted(primary.ep.retired_sent)) == cids[:8]
    assert primary.ep.retired_sent == backup.ep.retired_sent


def test_heartbeats_of_idle_connections_list_them_only_now_and_then():
    """A Heartbeat lists the connections that changed lately, and all of
    them every HEARTBEAT_FULL_EVERY-th time: with 20 idle connections, most
    Heartbeats list none.  The backups still know every watermark: the
    primary's group watermark frees what every member has."""
    cluster = finished_workload(9, 0.05)
    primary, backup = cluster.servers[:2]
    listed = []
    for m in (primary, backup):
        m.ep._intra = (lambda orig: lambda mtype, **kw: (
            listed.append(len(kw["body"].get("gwm", kw["body"].get("rw", [])))) if mtype == MsgType.HEARTBEAT
            and isinstance(kw.get("body"), dict) else None, orig(mtype, **kw))[1])(m.ep._intra)
    cluster.clock.run_until(cluster.clock.now() + 2.0)
    assert len(listed) >= 150                      # two members, 50 a second, for 2 s
    assert sum(n == 20 for n in listed) <= 12      # a full list every 25th (0.5 s), per member
    assert sum(n == 0 for n in listed) >= len(listed) * 0.8
    report = primary.ep.backup_reports[backup.ep.me]["rw"]
    assert all(report[cid] == c.rx.rw for cid, c in backup.ep.conns.items())
    assert not any(primary.ep.buffers().values())


def test_a_newcomer_numbers_the_replies_the_remote_group_had_without_logging_them():
    """A newcomer's program replays a connection from its start and
    generates every reply again.  Those the remote group had before the
    newcomer joined are numbered, not logged: with the client side done and
    retired, nothing would ever free them, and after a window's worth the
    newcomer stopped, its numbering behind the others' for good (seen
    across hosts when a newcomer joined while a finished connection
    lingered at the primary)."""
    cluster = SimCluster(10, LossPolicy(seed=10, delay=0.0005), Workload([100] * 600))
    cluster.run()
    cluster.check()
    for m in cluster.clients:
        for cid in list(m.ep.conns):
            m.ep.retire_now(cid, 0)
    primary = cluster.servers[0].ep
    (cid,) = primary.conns
    replies = primary.conns[cid].tx.msg_seq_count
    assert replies == 600 > cluster.config.send_window
    consumed, acked, logged_from = connection_state(primary, cid)
    view = View(SERVER, primary=0, precedences={0: 1, 1: 2, 2: 3, 3: 4})
    newcomer = GroupEndpoint(view, 3, cluster.clock, cluster.net, KEY, cluster.config)
    cluster.net.join(SERVER, newcomer.datagram_received)
    newcomer.start()
    adopt_connection(newcomer, cid, consumed, acked, logged_from)
    for k in range(replies):
        assert newcomer.writable(cid), f"stopped after {k} of {replies} replies"
        newcomer.send(cid, b"again")
        cluster.clock.run_until(cluster.clock.now() + 0.001)
    tx = newcomer.conns[cid].tx
    assert tx.msg_seq_count == replies
    assert list(tx.sent) == list(primary.conns[cid].tx.sent)   # what the primary still logs, and only that
