"""Phase 2 of a primary change (LLFT Fig. 9 line 30): the new primary Nacks
the remote group for what it lacks of that group's messages.  The remote
group, told of the new view by NewPrimaryView, drops whatever comes stamped
with the old one, so the Nack must name the new view.  Deterministic: real
GroupEndpoints on the simulated network."""
from __future__ import annotations

import random

from llft.auth import Keyring
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.lossy import LossPolicy, message_matches
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.messaging.viewchange import (answer_new_primary_view, nack_remote, new_primary_view,
                                                     parse_new_primary_view_ack)
from llft.ordering.llmp.wire import MsgType

KEY = Keyring(b"k" * 32)
GW, SRV = 10, 20


def test_the_new_primarys_nack_reaches_the_remote_group_after_new_primary_view():
    clock = SimClock()
    dropping = {"third": True}

    def the_third_request(m) -> bool:            # the backup (and the old primary) never get it, for now
        return dropping["third"] and m.TYPE == MsgType.REQUEST and m.msn == 3

    net = SimNetwork(clock, LossPolicy(delay=0.0005, targets=[message_matches(the_third_request)]))
    old, new = make_group(net, SRV, 2, KEY)
    gateway = make_group(net, GW, 1, KEY)[0]
    cid = ConnId(*gateway.connect(SRV, 1))
    for body in (b"one", b"two", b"three"):
        gateway.send(cid, body)
    assert clock.run_until(1.0, lambda: cid in new.conns and new.conns[cid].rx.received_upto == 2)
    old.close()                                   # the primary fails
    view = View(SRV, primary=new.me, precedences={new.me: 2}, pvn=2)
    new_primary_view(new, GW, view)
    assert clock.run_until(clock.now() + 0.5, lambda: gateway.remote_views.get(SRV, (0,))[0] == 2)
    dropping["third"] = False
    stale = gateway.drops["stale-view"]
    assert nack_remote(new, cid, 3, view) == 1
    assert clock.run_until(clock.now() + 0.5, lambda: new.conns[cid].rx.received_upto == 3)
    assert gateway.drops["stale-view"] == stale, "the gateway dropped the new primary's Nack as of the old view"


def a_connection_and_its_view_answers(clock, net):
    """A server group of two (the old primary, the new one) and a gateway
    that answers NewPrimaryView, with one connection open; `acks` collects
    the answers that reach the new primary."""
    old, new = make_group(net, SRV, 2, KEY)
    gateway = make_group(net, GW, 1, KEY)[0]
    acks = []

    def at_new(name, info):
        if name == "membership-message" and info["msg"].TYPE == MsgType.NEW_PRIMARY_VIEW_ACK:
            acks.append(info["msg"])

    def at_gateway(name, info):
        if name == "membership-message" and info["msg"].TYPE == MsgType.NEW_PRIMARY_VIEW:
            answer_new_primary_view(gateway, info["msg"])
    new.on_event, gateway.on_event = at_new, at_gateway
    cid = ConnId(*gateway.connect(SRV, 1))
    gateway.send(cid, b"request")
    assert clock.run_until(1.0, lambda: cid in new.conns)
    return old, new, gateway, cid, acks


def test_the_remote_group_answers_with_the_entries_after_those_the_new_primary_holds():
    """The gateway holds the old primary's entries with a gap (5-6, then
    9-11: others were acknowledged on other connections); the new primary
    holds up to 8.  The answer gives it 9-11, not the run that ends at the
    gap (a new primary once lacked the numbers of outgoing UDP ports the
    gateway had opened, and numbered them anew)."""
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(delay=0.0005))
    old, new, gateway, cid, acks = a_connection_and_its_view_answers(clock, net)
    gateway.conns[cid].reflector.add(5, [b"e5", b"e6"])
    gateway.conns[cid].reflector.add(9, [b"e9", b"e10", b"e11"])
    new.sequencer.add(1, [b"e%d" % k for k in range(1, 9)])
    old.close()
    new_primary_view(new, GW, View(SRV, primary=new.me, precedences={new.me: 2}, pvn=2))
    assert clock.run_until(clock.now() + 0.5, lambda: acks)
    _rows, first, blobs = parse_new_primary_view_ack(acks[0].body)
    assert (first, blobs) == (9, [b"e9", b"e10", b"e11"])


def test_a_large_answer_reaches_a_new_primary_that_keeps_asking_under_loss():
    """The gateway holds 2 MB of the old primary's ordering information, a
    tenth of what reaches the server group is lost, and the new primary
    asks again every 30 ms until it has the answer (member.py _take_over).
    Each ask answered anew (its own timestamp, its own bytes) never got
    through: every answer's 1,500 fragments had to arrive in one go, and
    the new primary waited for good (a group lost across hosts).  The
    first answer is given again byte for byte, paced, and its fragments
    add up across transmissions."""
    clock = SimClock()
    rng = random.Random(7)
    net = SimNetwork(clock, LossPolicy(delay=0.0005))
    old, new, gateway, cid, acks = a_connection_and_its_view_answers(clock, net)
    entries = [bytes([k % 251]) * 1000 + b"%d" % k for k in range(2000)]
    gateway.conns[cid].reflector.add(1, entries)
    old.close()
    net.policy.targets.append(lambda datagram, group: group == SRV and rng.random() < 0.1)
    view = View(SRV, primary=new.me, precedences={new.me: 2}, pvn=2)
    start = clock.now()
    while not acks and clock.now() - start < 20.0:
        new_primary_view(new, GW, view)
        clock.run_until(clock.now() + 0.03, lambda: bool(acks))
    assert acks, f"no answer within 20 s ({gateway.counters['tx_new_primary_view_ack']} sent)"
    _rows, first, blobs = parse_new_primary_view_ack(acks[0].body)
    assert (first, blobs) == (1, entries)
    took = clock.now() - start
    assert gateway.counters["tx_new_primary_view_ack"] <= took / 0.45 + 1, "answers were not paced"
