"""The election (phase 1 of a change of primary across hosts) on the
simulated network: real GroupEndpoints of one group, each backup running the
real Election, the primary crashed by closing it.  Deterministic: the order
in which the backups' fault detectors fire is set by their timeouts, which
is what a real run leaves to chance (tests/test_multihost.py)."""
from __future__ import annotations

from llft.auth import Keyring
from llft.ordering.llmp.membership.detector import Silence
from llft.ordering.group import Excluded
from llft.ordering.llmp.membership.election import Election
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.lossy import LossPolicy, message_matches
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.wire import MsgType

GROUP = 20
TICK_S = 0.02            # the member's serve loop ticks the election this often
PAST_GRACE_S = 1.5       # past the detectors' start-up grace


class Backup:
    """One backup's election, fed the group's membership messages as
    HostMember feeds them; records what the election decided."""

    def __init__(self, ep, fault_timeout: float):
        self.ep = ep
        self.elected = None
        self.followed = None
        self.excluded = None
        self.election = Election(ep, Silence(ep, unread=lambda: False), fault_timeout, 0.0,
                                 held_after=lambda upto: (0, []), on_elected=self._elected,
                                 on_new_primary=self._followed, settling_timeout=fault_timeout)
        ep.on_event = self._event
        self._tick()

    def _tick(self):
        if not self.ep.closed:
            self.election.tick()
            self.ep.clock.call_later(TICK_S, self._tick)

    def _event(self, name, info):
        msg = info.get("msg")
        if name == "membership-message" and msg.TYPE in (MsgType.PROPOSE_PRIMARY, MsgType.PROPOSE_PRIMARY_ACK):
            try:
                self.election.on_message(msg)
            except Excluded as e:
                self.excluded = str(e)

    def _elected(self, view, acks):
        self.elected = (view, acks)

    def _followed(self, view):
        self.followed = view


def group_of_three(b_timeout: float, c_timeout: float, cut=None, tick: float = Config.tick):
    """Primary A, backups B (precedence 2) and C (precedence 3), running
    past the start-up grace; then A crashes.  `cut(datagram, dst_group)`:
    a targeted loss while A is still alive."""
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(seed=3, delay=0.0005))
    a, b, c = make_group(net, GROUP, 3, Keyring(b"k" * 32), Config(liveness=0.005, tick=tick))
    backups = Backup(b, b_timeout), Backup(c, c_timeout)
    clock.run_until(PAST_GRACE_S)
    return clock, net, a, backups


def test_a_backup_left_out_by_a_later_backup_contests_and_the_group_stays_whole():
    """C suspects the crashed primary 2 ms before B (fault-timeout-step 0, a
    real run's luck) and proposes itself without B.  B must not accept the
    exclusion and leave: the primary is gone for it too, so it proposes
    itself, C withdraws, and the new view holds both."""
    clock, _net, a, (b, c) = group_of_three(b_timeout=0.032, c_timeout=0.030)
    a.close()
    clock.run_until(PAST_GRACE_S + 1.0)
    assert b.excluded is None and c.excluded is None, (b.excluded, c.excluded)
    assert b.elected is not None and c.elected is None
    view = b.elected[0]
    assert (view.primary, view.pvn, sorted(view.precedences)) == (b.ep.me, 2, [b.ep.me, c.ep.me])
    assert c.followed is not None and c.followed.primary == b.ep.me and c.followed.pvn == 2



def test_a_primary_that_one_backup_lost_is_replaced_and_both_backups_stay():
    """Only C stops hearing the primary: C proposes itself without B.  B,
    still hearing the primary, contests all the same (the primary is replaced
    either way once it hears C's proposal): the new view holds B and C, and
    the old primary, left out, leaves and then stays out of the election."""
    clock, net, a, (b, c) = group_of_three(b_timeout=0.030, c_timeout=0.030)
    old = Backup(a, 0.030)           # the old primary's election, as HostMember runs it
    from_a = message_matches(lambda m: m.sender == a.me)
    receive_c = net.members[GROUP][2]
    net.members[GROUP][2] = lambda d: None if from_a(d, GROUP) else receive_c(d)
    clock.run_until(PAST_GRACE_S + 1.0)
    assert old.excluded is not None and old.election.left_out
    assert b.excluded is None and c.excluded is None, (b.excluded, c.excluded)
    view = b.elected[0]
    assert (view.primary, view.pvn, sorted(view.precedences)) == (b.ep.me, 2, [b.ep.me, c.ep.me])
    assert c.followed.primary == b.ep.me
    assert old.elected is None and old.followed is None and old.election.proposal is None


def test_a_removed_backup_that_missed_its_removal_cannot_lead_the_group():
    """B was removed (the primary and C adopted the view without it) but
    missed every RemoveBackup, so it still counts itself a member.  When the
    primary dies, B suspects it first and proposes itself: C must not
    follow a member that lacks what the group did since its removal; C
    proposes itself and wins."""
    clock, _net, a, (b, c) = group_of_three(b_timeout=0.030, c_timeout=0.032)
    without_b = View(GROUP, a.me, {a.me: 1, c.ep.me: 3}, 1)     # what RemoveBackup leaves (ranks close up)
    a.view = c.ep.view = without_b
    a.close()
    clock.run_until(PAST_GRACE_S + 0.3)       # (B would go on until MAX_COUNT; C's view notice stops it first)
    assert c.followed is None and c.ep.drops["proposal-from-outside-view"] > 0
    assert c.elected is not None and sorted(c.elected[0].precedences) == [c.ep.me]
    assert b.elected is None



def mute(net, clock, a, start: float, end: float) -> None:
    """Nothing from member a reaches the others between start and end (its
    host without the CPU for that long)."""
    from_a = message_matches(lambda m: m.sender == a.me)
    receivers = net.members[GROUP]
    for k in range(1, len(receivers)):
        receivers[k] = (lambda receive: lambda d: None if start <= clock.now() < end and from_a(d, GROUP)
                        else receive(d))(receivers[k])


def proposed_after(clock, b, start: float, limit: float) -> float | None:
    """Seconds from start until backup b proposed itself, or None."""
    while clock.now() < start + limit:
        clock.run_until(clock.now() + 0.001)
        if b.election.proposal is not None or b.elected is not None:
            return clock.now() - start
    return None


def test_after_a_live_primary_was_silent_a_while_its_silences_that_long_are_not_taken_for_a_crash():
    """A live primary unheard for some 20 ms: for the next half minute, the
    backups suspect nobody before twice that (40-52 ms: Heartbeats come
    every 5-6 ms), so a silence of 30-36 ms is no crash; a real one is
    still detected, after twice the longest silence heard.  Without the
    earlier silence, 30 ms is the configured timeout and replaces the
    primary (the control)."""
    for warned in (True, False):
        clock, net, a, (b, c) = group_of_three(b_timeout=0.030, c_timeout=0.060, tick=0.001)
        t = PAST_GRACE_S + 0.2
        if warned:
            mute(net, clock, a, t, t + 0.020)
        mute(net, clock, a, t + 0.5, t + 0.530)
        clock.run_until(t + 0.5)
        took = proposed_after(clock, b, t + 0.5, 0.5)
        if not warned:
            assert took is not None and took < 0.035, took
            continue
        assert took is None, took
        mute(net, clock, a, t + 2.0, t + 99.0)    # dead from here
        clock.run_until(t + 2.0)
        took = proposed_after(clock, b, t + 2.0, 1.0)
        longest = b.election.silence.longest.value(clock.now())
        assert 0.030 <= longest <= 0.036
        assert took is not None and 2 * longest - 0.006 <= took <= 2 * longest + 0.001, (took, longest)
