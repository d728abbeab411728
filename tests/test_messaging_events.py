"""Events the membership layer will act on: a competing primary of higher
precedence (re-multicast, then reset-and-rejoin), a new remote primary view,
membership messages; and the idle-connection machinery."""
from __future__ import annotations

from llft.ordering.llmp import wire
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.wire import MsgType
from messaging_fixtures import CLIENT, SERVER, SimCluster, Workload


def names(member):
    return [n for n, _ in member.ep.events]


def quiet_cluster():
    cluster = SimCluster(1, LossPolicy(seed=1, delay=0.0005), Workload([50] * 5))
    cluster.run(limit=5, settle=0.2)
    cluster.check()
    return cluster


def test_competing_primary_is_remulticast_and_surfaces_reset_and_rejoin():
    cluster = quiet_cluster()
    s0, s1, s2 = cluster.servers
    # S2 believes it is the primary of a membership with higher precedence.
    s2.ep.view.primary = 2
    s2.ep.view.precedences[2] = 99
    cluster.clock.run_until(cluster.clock.now() + 0.1)
    for m in (s0, s1):
        assert names(m).count("reset-and-rejoin") == 1, names(m)
        info = dict(m.ep.events)["reset-and-rejoin"]
        assert info["precedence"] == 99 and info["sender"] == 2
        assert m.ep.counters["event_reset-and-rejoin"] == 1
        # re-multicast once on the intra-group connection, however often heard
        assert m.ep.counters["remulticast_competing"] == 1
    assert "reset-and-rejoin" not in names(s2)


def test_remote_primary_change_and_stale_view():
    cluster = quiet_cluster()
    for c in cluster.clients:
        c.ep.view.pvn = 2
    cluster.clock.run_until(cluster.clock.now() + 0.2)
    for s in cluster.servers:
        assert "remote-primary-changed" in names(s)
        assert s.ep.remote_views[CLIENT] == (2, 1)
    # a message of the old view is dropped and counted
    s0 = cluster.servers[0].ep
    old = wire.KeepAlive(src_group=CLIENT, dst_group=SERVER, conn_seq=1, role=0, pvn=1, precedence=1)
    s0.datagram_received(s0.codec.encode(old)[0])
    assert s0.drops["stale-view"] == 1


def test_a_superseded_primary_of_the_same_view_is_not_heard():
    """Two members that could not hear each other each took over in view 2;
    the remote group follows the one of higher precedence, and drops what
    the other sends (its replies interleaved with the other's gave clients
    answers repeated and lost)."""
    cluster = quiet_cluster()
    s0 = cluster.servers[0].ep
    s0.remote_views[CLIENT] = (2, 3)
    losing = wire.KeepAlive(src_group=CLIENT, dst_group=SERVER, conn_seq=1, role=0, pvn=2, precedence=2)
    s0.datagram_received(s0.codec.encode(losing)[0])
    assert s0.drops["stale-view"] == 1
    assert s0.remote_views[CLIENT] == (2, 3)
    winning = wire.KeepAlive(src_group=CLIENT, dst_group=SERVER, conn_seq=1, role=0, pvn=2, precedence=3)
    s0.datagram_received(s0.codec.encode(winning)[0])
    assert s0.drops["stale-view"] == 1


def test_membership_messages_are_surfaced():
    cluster = quiet_cluster()
    s0 = cluster.servers[0].ep
    pp = wire.make(MsgType.PROPOSE_PRIMARY, src_group=SERVER, dst_group=SERVER, role=2, sender=1,
                   pvn=1, precedence=1, body={"members": [1, 2]})
    s0.datagram_received(s0.codec.encode(pp)[0])
    assert dict(s0.events)["membership-message"]["msg"] == pp
    # a process that is not a member yet asks to join
    join = wire.make(MsgType.PROPOSE_BACKUP, src_group=SERVER, dst_group=SERVER, role=2, sender=77,
                     pvn=1, precedence=1, body={"birth": 5})
    s0.datagram_received(s0.codec.encode(join)[0])
    assert s0.events[-1][1]["msg"] == join and s0.drops.total() == 0


def test_idle_connections_keep_alive_and_heartbeat():
    cluster = quiet_cluster()
    before = {m.name: dict(m.ep.counters) for m in cluster.members}
    cluster.clock.run_until(cluster.clock.now() + 3.0)
    for m in cluster.members:
        c = m.ep.counters
        assert c["tx_heartbeat"] - before[m.name].get("tx_heartbeat", 0) >= 120
        if m.ep.is_primary:   # KeepAlives that say nothing new back off (50, 100, 200 ms ... 2 s), not 60
            assert 2 <= c["tx_keep_alive"] - before[m.name].get("tx_keep_alive", 0) <= 8
        assert not any(m.ep.buffers().values())
    stats = cluster.servers[0].ep.stats()
    assert stats["myTimestampWatermark"] > 0 and stats["primary"] and type(stats["drops"]) is dict
