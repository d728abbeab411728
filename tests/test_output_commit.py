"""Output commit at the receiving group (LLFT §II-E; ordering.RemoteOrder):
a primary's message is handed on only once the receiver holds every ordering
entry the primary had made before it, or the primary's backups all do.

Each entry rides once, on whichever message the primary sends next, on any
connection.  Here the message carrying an entry (a reply on connection A) is
lost, and a later reply on connection B, whose content may depend on that
entry, arrives.  Deterministic: real GroupEndpoints on the simulated network."""
from __future__ import annotations

from llft.auth import Keyring
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.lossy import LossPolicy, message_matches
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.messaging.viewchange import answer_new_primary_view, new_primary_view
from llft.ordering.llmp.wire import MsgType

KEY = Keyring(b"k" * 32)
GW, SRV = 10, 20


class Setup:
    """A server group of two (old primary, backup) and a one-member gateway
    with connections A and B; every reply on A to the gateway is lost while
    `losing_a` is set."""

    def __init__(self):
        self.clock = SimClock()
        self.losing_a = True
        lost = message_matches(lambda m: self.losing_a and m.TYPE == MsgType.REPLY and m.conn_seq == 1)
        self.net = SimNetwork(self.clock, LossPolicy(delay=0.0005, targets=[lost]))
        self.old, self.new = make_group(self.net, SRV, 2, KEY)
        self.gw = make_group(self.net, GW, 1, KEY)[0]
        self.got: list[tuple[int, bytes]] = []
        self.gw.on_deliver = lambda cid, body: self.got.append((cid.seq, body))
        self.gw.on_event = self._event
        self.a, self.b = (ConnId(*self.gw.connect(SRV, k)) for k in (1, 2))
        for cid in (self.a, self.b):
            self.gw.send(cid, b"request")
        assert self.clock.run_until(1.0, lambda: all(c in ep.conns for ep in (self.old, self.new)
                                                      for c in (self.a, self.b)))

    def _event(self, name, info):
        msg = info.get("msg")
        if name == "membership-message" and msg is not None and msg.TYPE == MsgType.NEW_PRIMARY_VIEW:
            answer_new_primary_view(self.gw, msg)

    def replies(self):
        """The old primary makes an entry, carried by its reply on A, then
        replies on B (as a program's output that depends on the entry)."""
        self.old.send(self.a, b"reply on A", b"entry made before both replies")
        self.old.send(self.b, b"reply on B")
        self.clock.run_until(self.clock.now() + 0.005)

    def received_b(self) -> bool:
        return self.gw.conns[self.b].rx.received_upto == 1


def test_a_reply_waits_for_the_entries_its_primary_made_before_it():
    s = Setup()
    s.replies()
    assert s.received_b(), "the reply on B arrived (and is acknowledged)"
    assert s.got == [], "it is not handed on: the entry it may depend on is not at the gateway yet"
    assert s.gw.conns[s.b].rx.rw == 0, "it moves no watermark: the server's backup keeps its copy"
    s.losing_a = False          # the entry comes: on A's retransmission, a control message, or as held by the backup
    assert s.clock.run_until(s.clock.now() + 1.0, lambda: len(s.got) == 2)
    assert sorted(s.got) == [(1, b"reply on A"), (2, b"reply on B")]


def test_a_new_primary_resends_what_waited_for_entries_lost_with_the_old_one():
    """The old primary dies with the only copy of the entry out of reach:
    the gateway never hands B's reply on, drops it at the view change and
    reports it not received, so the new primary sends its own."""
    s = Setup()
    s.replies()
    s.old.close()
    s.losing_a = False
    s.clock.run_until(s.clock.now() + 0.2)
    assert s.got == [], "still waiting: nobody can send the entry"
    view = View(SRV, primary=s.new.me, precedences={s.new.me: 2}, pvn=2)
    new_primary_view(s.new, GW, view)
    assert s.clock.run_until(s.clock.now() + 0.5, lambda: s.gw.remote_views.get(SRV, (0,))[0] == 2)
    assert s.gw.conns[s.b].rx.received_upto == 0, "B's reply dropped, not acknowledged to the new primary"
    assert s.gw.conns[s.b].ack_sent == 0, "the new primary's version of it is to be acknowledged anew"
    assert s.gw.counters["flushed_after_view_change"] >= 1
    assert s.got == []
