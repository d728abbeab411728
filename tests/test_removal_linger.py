"""A primary that removes its backups for their silence goes on alone, and
may be wrong to: cut off rather than dead, one of them takes over on its
side of the partition (a partition whose two directions fail some time
apart lets the primary remove them before they miss it).  Whatever the
lone primary ordered and acknowledged meanwhile reached its clients, so
the new primary must find it where LLFT keeps it for a new primary: at the
remote group (the gateway), which holds the primary's ordering entries
and the messages it sent until the primary says every backup has them.

Real GroupEndpoints and BackupRemoval on the simulated network: the
gateway keeps the lone primary's entries and its own messages for
SILENT_LINGER_S after a removal for silence (the removed backups' last
reports hold them), gives them to a new primary that asks, and lets them
go after; a removal for any other reason lets them go at once."""
from __future__ import annotations

import pytest

from llft.auth import Keyring
from llft.ordering.ids import View
from llft.ordering.llmp.membership.detector import Silence
from llft.ordering.llmp.membership.removal import SILENT_LINGER_S, BackupRemoval
from llft.ordering.llmp.messaging import viewchange
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp import wire
from llft.ordering.llmp.wire import MsgType, Role

GROUP, GATEWAY = 30, 40
KEY = Keyring(b"k" * 32)


class Harness:
    def __init__(self):
        self.clock = SimClock()
        net = SimNetwork(self.clock, LossPolicy(seed=3, delay=0.0005))
        self.primary, self.b, self.c = make_group(net, GROUP, 3, KEY, Config(liveness=0.005))
        (self.gw,) = make_group(net, GATEWAY, 1, KEY, Config())
        self.cid = self.gw.connect(GROUP, 1)
        self.live = [self.primary, self.b, self.c]
        self.removal = BackupRemoval(self.primary, Silence(self.primary, unread=lambda: False), lambda: 0.1,
                                     lambda members, why: None)
        self.n = 0

    def round_trips(self, count: int) -> None:
        """count requests from the gateway, each answered with one new ordering entry."""
        for _ in range(count):
            self.n += 1
            self.gw.send(self.cid, b"request %d" % self.n)
            self.clock.run_until(self.clock.now() + 0.005)
            for ep in self.live:
                while (got := ep.recv()) is not None:
                    ep.send(got[0], b"reply to " + got[1], b"entry %d" % self.n)
            self.clock.run_until(self.clock.now() + 0.005)
            while self.gw.recv() is not None:
                pass

    def cut_off_backups(self, silent: bool) -> None:
        """The backups fall silent (cut off), and the primary removes them."""
        for ep in (self.b, self.c):
            ep.close()
        self.live = [self.primary]
        self.removal.remove([self.b.me, self.c.me], "silent" if silent else "asked to leave", silent=silent)

    def held_at_gateway(self) -> set[bytes]:
        """The primary's ordering entries the gateway holds for a new primary."""
        return {blob for c in self.gw.conns.values() for blob in c.reflector.entries.values()}

    def kept_at_gateway(self) -> int:
        """Messages the gateway keeps for a new primary to Nack."""
        return len(self.gw.conns[self.cid].tx.sent)

    def answer_to_new_primary(self, member) -> list[bytes]:
        """The ordering entries the gateway's NewPrimaryViewAck gives member,
        taking over as primary of view 2 (Fig. 9)."""
        msg = wire.make(MsgType.NEW_PRIMARY_VIEW, src_group=GROUP, dst_group=GATEWAY, role=int(Role.SERVER),
                        sender=member.me, pvn=2, precedence=2,
                        body={"oupto": member.sequencer.upto, "lineage": [[2, 2], [1, 1]]})
        _rows, _first, blobs = viewchange.parse_new_primary_view_ack(
            wire.decode_message(viewchange._view_answer(self.gw, msg)).body)
        return blobs


def test_a_lone_primarys_work_is_held_for_the_backups_it_removed_for_silence():
    h = Harness()
    h.round_trips(20)
    upto = h.b.sequencer.upto
    h.cut_off_backups(silent=True)
    removed_at = h.clock.now()
    h.round_trips(20)   # acknowledged by the primary alone, answered to the clients
    alone = {b"entry %d" % k for k in range(21, 41)}
    assert alone <= h.held_at_gateway(), "the gateway let go of what the lone primary ordered"
    assert h.kept_at_gateway() >= 20, "the gateway let go of its messages the lone primary acknowledged"
    given = h.answer_to_new_primary(h.b)
    assert alone <= set(given), "a new primary from among the removed backups would not get them"
    assert len(given) >= h.primary.order_log.next_oseq - 1 - upto - 1
    # Past the linger, the lone primary is the group: they go.
    h.clock.run_until(removed_at + SILENT_LINGER_S + 0.1)
    h.round_trips(5)
    assert not h.held_at_gateway() & alone, "held past the linger"
    assert h.kept_at_gateway() < 20, "kept past the linger"
    assert not h.primary.lingering


def test_a_backup_removed_for_another_reason_holds_nothing_back():
    h = Harness()
    h.round_trips(20)
    h.cut_off_backups(silent=False)
    h.round_trips(20)
    assert not h.held_at_gateway() & {b"entry %d" % k for k in range(21, 41)}
    assert h.kept_at_gateway() < 20


@pytest.mark.parametrize("silent", [True, False])
def test_a_new_view_forgets_the_lingering(silent):
    h = Harness()
    h.round_trips(5)
    h.cut_off_backups(silent=silent)
    assert bool(h.primary.lingering) == silent
    viewchange.take_over(h.primary, View(GROUP, h.primary.me, {h.primary.me: 1}, pvn=2), base=2 << 40)
    assert not h.primary.lingering
