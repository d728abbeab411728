"""Change of the primary across hosts, phase 1 (LLFT Fig. 9 lines 1-25):
the fault detector, ProposePrimary and its acknowledgments.

A backup that hears nothing from the primary for `base + step x (rank - 2)`
seconds, and has seen no proposal for the next view from a backup of lower
precedence, proposes itself: the new membership is itself and the backups of
higher precedence.  A member named in a proposal acknowledges it unless it
proposed itself for that view or already acknowledged a proposer of higher
precedence; it also hands over the ordering information it holds beyond
the proposer's, so the new primary can reach every member's state.  A
backup left out by a later backup's proposal contests it (proposes itself;
the later backup withdraws).  A member left out of a proposal it cannot
contest (and an old primary that sees itself replaced) must reset and
rejoin: here, it leaves the group, and takes no further part meanwhile.
A proposal from outside this member's view (a removed backup) is dropped.

Proposals are repeated every RETRY_S; members that have not acknowledged
after MAX_COUNT repeats are excluded and the proposal starts over.

The fault detector is event-driven (detector.py): a timer at the moment the
primary's silence reaches the timeout, put off while this member is not
listening."""
from __future__ import annotations

import logging
import time

from llft.ordering.llmp import wire
from llft.ordering.llmp.membership.detector import Deadline, Silence
from llft.ordering.group import Excluded
from llft.ordering.ids import View
from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.election")

RETRY_S = 0.02
MAX_COUNT = 25
GRACE_SENDS = 3
SWITCH_WINDOW_S = 0.1
SETTLING_S = 5.0       # a new primary's first seconds: it may pause (see timeout())
LOOP_STALL_S = 0.045   # a gap between ticks (every 20 ms) this long means we were not listening


class Election:
    def __init__(self, ep, silence: Silence, fault_base: float, fault_step: float, held_after, on_elected,
                 on_new_primary, settling_timeout: float):
        self.ep = ep
        self.silence = silence
        self.deadline = Deadline(silence, self._check_primary)
        self.fault_base, self.fault_step = fault_base, fault_step
        self.held_after = held_after          # fn(oseq) -> (first, [blob]): ordering info we hold after oseq
        self.on_elected = on_elected          # fn(View, acks): phase 1 done, this member is the new primary
        self.on_new_primary = on_new_primary  # fn(View): we acknowledged another member's proposal
        self.watch_since = 0.0                # the current primary's silence counts from here
        self.settling_timeout = settling_timeout
        self.settling_until = 0.0             # the current primary took over; until then, settling_timeout
        self.proposal: dict | None = None     # ours: body, acks, sends
        self.proposed_pvn = 0                 # the view we proposed ourselves for
        self.acked_precedence = ep.view.primary_precedence
        self.acked_at = 0.0
        self.lower_proposal_pvn = 0           # a lower-precedence backup proposed for this next view
        self.elected_pvn = 0                  # phase 1 won for this view; phase 2 under way
        # The primary's program ended (END received): there is nothing left to
        # take over, and a primary that leaves once its backups have the end
        # is not a failure.
        self.program_ended = False
        self.last_tick = ep.clock.now()
        self.last_ack = None                  # (what it answered, encoded acknowledgment)
        # Excluded: this member leaves the group (the serve loop acts on it a
        # little later); until then it must neither propose nor acknowledge.
        self.left_out = False
        self.suspected_at: float | None = None   # CLOCK_MONOTONIC measurements (bench/cluster.py)
        self.last_ack_at: float | None = None

    def _my_precedence(self) -> int:
        return self.ep.view.precedences.get(self.ep.me, 0)

    def left_out_by(self, pvn: int, precedence: int) -> bool:
        """A member of our view speaks in view pvn, newer than ours, of a
        primary of that precedence: whether that view was formed without
        us.  Not if its primary is us (a backup that acknowledged our
        proposal), nor if we compete for that view ourselves (the election
        settles it)."""
        return (pvn > self.ep.view.pvn and precedence != self._my_precedence()
                and self.proposed_pvn != pvn)

    def timeout(self) -> float:
        """Rank 2 suspects the primary first; each later rank waits `step` longer.
        A primary that just took over gets the longer settling timeout: new
        primaries paused 30-150 ms within seconds of taking over under load
        (real-time controllers round-robin on two cores, member.py), and a
        short timeout made their backups replace them."""
        base = self.silence.timeout(self.fault_base)
        if self.ep.clock.now() < self.settling_until:
            base = max(base, self.settling_timeout)
        return base + self.fault_step * max(0, self.ep.view.ranks().get(self.ep.me, 2) - 2)

    def settle_for(self, seconds: float) -> None:
        """The current primary took over recently: its first seconds count
        as settling here too (a member that joined after the takeover)."""
        self.settling_until = max(self.settling_until, self.ep.clock.now() + seconds)

    def _watching(self) -> bool:
        ep = self.ep
        return self.proposal is None and not ep.is_primary and self.elected_pvn <= ep.view.pvn \
            and not self.program_ended and not self.left_out

    def tick(self) -> None:
        if self.left_out:
            return
        now = self.ep.clock.now()
        if now - self.last_tick > max(self.timeout() / 3, LOOP_STALL_S):
            # This process was not listening (its event loop busy, e.g. a new
            # member feeding its replica the group's log, or the host
            # stalled): silence measured then says nothing of the primary.
            self.silence.not_listening()
        self.last_tick = now
        if self.proposal is not None:
            self._repeat()
        elif self._watching() and not self.deadline.armed:
            self.deadline.arm(0)

    def _check_primary(self) -> float | None:
        """The fault detector's timer: the delay until the next check, or None."""
        if not self._watching():
            return None                              # tick() arms it again when there is a primary to watch
        ep, timeout = self.ep, self.timeout()
        silence = self.silence.of(ep.view.primary, self.watch_since)
        if silence < timeout:
            return timeout - silence
        if self.lower_proposal_pvn > ep.view.pvn:
            return timeout                           # a backup of lower precedence proposes: its turn
        self._propose(silence)
        return None

    def _propose(self, silence: float) -> None:
        self.suspected_at = time.monotonic()     # measurement (bench/cluster.py)
        ep, mine = self.ep, self._my_precedence()
        members = {m: p for m, p in ep.view.precedences.items() if p >= mine and m != ep.view.primary}
        primary, pvn = ep.view.primary, ep.view.pvn + 1
        self.proposed_pvn = pvn
        ep.sequencer.hold(False)   # a proposer gathers the most advanced state of the old view
        lower = [m for m, p in ep.view.precedences.items() if p < mine and m != ep.view.primary]
        self.proposal = {"members": members, "acks": {}, "sends": 0, "excluded_lower": bool(lower)}
        self._repeat()
        # Logged after what follows (the proposal out, or, alone, phase 2 under way): a log write is slower.
        ep.clock.call_later(0, lambda: log.warning(
            "no word from primary %d for %.0f ms: proposing myself (%d) as primary of view %d with %s",
            primary, silence * 1000, ep.me, pvn, sorted(members)))

    def _conclude(self) -> bool:
        """Phase 1 is over once every proposed member has acknowledged."""
        ep, pr = self.ep, self.proposal
        others = [m for m in pr["members"] if m != ep.me]
        # A proposer that left out backups of lower precedence gives their
        # proposals (which would name it) time to arrive: it then withdraws,
        # rather than splitting the group into competing primaries.
        patient = pr["excluded_lower"] and pr["sends"] < GRACE_SENDS
        if not all(m in pr["acks"] for m in others) or patient:
            return False
        view = View(ep.group, ep.me, dict(pr["members"]), ep.view.pvn + 1)
        acks, self.proposal = pr["acks"], None
        self.elected_pvn = view.pvn
        self.on_elected(view, acks)
        return True

    def _repeat(self) -> None:
        ep, pr = self.ep, self.proposal
        others = [m for m in pr["members"] if m != ep.me]
        if self._conclude():
            return
        if pr["sends"] >= MAX_COUNT:
            gone = [m for m in others if m not in pr["acks"]]
            log.warning("members %s did not acknowledge the proposal: excluded", gone)
            for m in gone:
                del pr["members"][m]
            pr["sends"] = 0
        pr["sends"] += 1
        ep.send_membership(MsgType.PROPOSE_PRIMARY, {
            "pvn": ep.view.pvn, "precedence": self._my_precedence(), "upto": ep.sequencer.upto,
            "prec": [[m, p] for m, p in pr["members"].items()]})

    # -- messages -----------------------------------------------------------------
    def on_message(self, msg) -> None:
        if self.left_out:
            return
        body = msg.body if isinstance(msg.body, dict) else None
        try:
            if msg.TYPE == MsgType.PROPOSE_PRIMARY:
                self._on_proposal(msg.sender, body)
            elif msg.TYPE == MsgType.PROPOSE_PRIMARY_ACK:
                self._on_ack(msg.sender, body)
        except (KeyError, TypeError, ValueError) as e:
            self.ep.drops.count("malformed")
            log.debug("bad %s from %d: %s", msg.TYPE.name, msg.sender, e)

    def _on_proposal(self, sender: int, body) -> None:
        ep = self.ep
        pvn, precedence, upto = int(body["pvn"]), int(body["precedence"]), int(body["upto"])
        members = {int(m): int(p) for m, p in body["prec"]}
        new_pvn = pvn + 1
        if new_pvn < ep.view.pvn:
            return                                   # about a view already replaced
        if ep.view.pvn == new_pvn and ep.view.primary == sender:
            if ep.me in members:
                self._ack(sender, pvn, upto)         # our acknowledgment was lost
            return
        if sender not in ep.view:
            # Not a member as far as we know: a backup the primary removed
            # that missed every RemoveBackup (frozen) and now suspects the
            # primary.  It lacks what the group did since; it may not lead it,
            # nor replace a primary it was removed by.
            ep.drops.count("proposal-from-outside-view")
            return
        if ep.me in members:
            if precedence < self._my_precedence():
                self.lower_proposal_pvn = max(self.lower_proposal_pvn, new_pvn)
            if self.proposed_pvn == new_pvn:
                if precedence > self._my_precedence() or self.proposal is None:
                    return                           # we compete for this view ourselves
                # A backup of lower precedence timed out too and counts on us:
                # withdraw (deviation: the paper lets both proposals fail).
                log.warning("withdrawing my proposal for view %d: member %d (precedence %d) proposed too",
                            new_pvn, sender, precedence)
                self.proposal, self.proposed_pvn = None, 0
            if ep.view.pvn == new_pvn:
                # Competing proposals for the view we just acknowledged.  Line
                # 20 follows the higher precedence; we follow the lower one
                # while the election is young (deviation, with the withdrawal
                # above: the backup of lowest rank is the natural successor,
                # and the group stays whole).
                young = ep.clock.now() - self.acked_at < SWITCH_WINDOW_S
                if not young or precedence >= self.acked_precedence:
                    return
            elif precedence <= ep.view.primary_precedence:
                return
            self.acked_precedence, self.acked_at = precedence, ep.clock.now()
            self._ack(sender, pvn, upto)
            ep.sequencer.hold()   # what we acknowledged is all we release until the view notice
            log.warning("member %d is the primary of view %d (proposal acknowledged)", sender, new_pvn)
            ep.view = View(ep.group, sender, members, new_pvn)
            self.watch_since = max(self.watch_since, ep.clock.now())   # keeps a start-up grace
            self.settling_until = ep.clock.now() + SETTLING_S
            self.on_new_primary(ep.view)
            return
        if self.proposed_pvn == new_pvn and self._my_precedence() > precedence:
            return                                   # line 25's exception: we are the stronger claimant
        if precedence > self._my_precedence():
            # A later backup left us out: it timed out on the primary before
            # we did (a fault-timeout step of 0, or our detector put off).
            # It withdraws on hearing a proposal that names it, so we contest
            # rather than leave (deviation: the paper resets this member, and
            # the group loses a replica it did not need to).
            if ep.view.pvn == pvn and self._watching():
                log.warning("member %d (precedence %d) proposed view %d without this member: contesting",
                            sender, precedence, new_pvn)
                self._propose(self.silence.of(ep.view.primary, self.watch_since))
                return
            if self.proposed_pvn == new_pvn or ep.view.pvn == new_pvn:
                return   # our proposal, or the one we acknowledged, names the proposer: its proposal is stale
        log.info("excluded by %d (%s): view %d primary %d, proposed %d, elected %d, precedence %d", sender, body,
                 ep.view.pvn, ep.view.primary, self.proposed_pvn, self.elected_pvn, self._my_precedence())
        self.left_out = True
        raise Excluded(f"member {sender} took over as primary of view {new_pvn} without this member")

    def _ack(self, proposer: int, pvn: int, upto: int) -> None:
        # The same acknowledgment is repeated byte for byte while nothing
        # changed, so that a large one (ordering information) is reassembled
        # from the fragments of all its copies even under loss.
        key = (proposer, pvn, upto, self.ep.sequencer.upto)
        if self.last_ack is not None and self.last_ack[0] == key:
            self.ep.resend(self.last_ack[1], MsgType.PROPOSE_PRIMARY_ACK)
            return
        first, blobs = self.held_after(upto)
        data = self.ep.send_membership(MsgType.PROPOSE_PRIMARY_ACK, {"to": proposer, "pvn": pvn,
                                                                      "upto": self.ep.sequencer.upto,
                                                                      "of": first, "ord": blobs})
        self.last_ack = (key, data)

    def _on_ack(self, sender: int, body) -> None:
        pr = self.proposal
        if pr is None or body["to"] != self.ep.me or int(body["pvn"]) != self.ep.view.pvn:
            return
        blobs = body["ord"]
        if not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
            raise wire.DropError("malformed", "proposal ack order")
        pr["acks"][sender] = (int(body["upto"]), int(body["of"]), blobs)
        self.last_ack_at = time.monotonic()      # measurement (bench/cluster.py)
        self._conclude()   # at once, not at the next tick
