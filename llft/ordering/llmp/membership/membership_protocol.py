"""LLFT's leader-determined membership as one member across hosts runs it
(LLFT Fig. 6-10): the fault detector and election (phase 1), the take-over
of a new primary (phase 2: the virtual synchrony point with the remote
groups), removals of backups, the view notice, and the admission of
newcomers.  This is the `llft` backend's side of the seam; the member's
replication core (member.py) hears of it through MemberHooks and never
reads a membership message itself.

    member (core)  --hooks-->  view changed, leave, elected, joiner's state
    MembershipProtocol  <--    every membership message, tick()

Excluded (from tick()) means this member must leave the group."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from llft.ordering.llmp import wire
from llft.ordering.llmp.membership.backup_checkpoint import BackupCheckpoints, silent_for
from llft.ordering.llmp.membership.detector import Silence
from llft.ordering.llmp.membership.election import SETTLING_S, Election
from llft.ordering.llmp.membership.membership import Admission, follow
from llft.ordering.llmp.membership.removal import BackupRemoval, follow_removal
from llft.ordering.llmp.membership.view_notice import ViewNotice
from llft.ordering.group import Excluded, MemberHooks, Membership
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.viewchange import (deliver_held_order, follow_new_view, nack_remote, new_primary_view,
                                                     order_base, parse_new_primary_view_ack, refusal_of, take_over)
from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.member")

# A new primary's first seconds (election.SETTLING_S): its members wait this
# long.  Real-time controllers share two cores under SCHED_RR (100 ms
# quanta, and RT throttling of 50 ms a second when they saturate them): a
# busy new primary went 151 ms without being heard and was replaced.
SETTLING_TIMEOUT_S = 0.3
# A new primary waits for every remote group's answer to NewPrimaryView,
# and for the messages it lacks of theirs, as long as it hears from them:
# a gateway sends a Heartbeat every few milliseconds, so this long a
# silence means it is gone (or cut off), not slow.
REMOTE_SILENCE_S = 2.0


class MembershipProtocol(Membership):
    def __init__(self, ep, unread: Callable[[], bool], opts, hooks: MemberHooks):
        self.ep, self.opts, self.hooks = ep, opts, hooks
        self.view_notice = ViewNotice(ep, self._follow_new_view)
        self.silence = Silence(ep, unread, opts.fault_timeout)
        self.election = Election(ep, self.silence, opts.fault_timeout, opts.fault_step, hooks.held_after,
                                 self._elected, lambda view: hooks.view_changed(),
                                 max(opts.fault_timeout, SETTLING_TIMEOUT_S))
        self.admission: Admission | None = None   # the primary's
        self.checkpoints = BackupCheckpoints(ep, opts.interface, hooks.checkpoint_here)
        self.removal: BackupRemoval | None = None
        self.taking_over = False
        self.elected_at: float | None = None      # CLOCK_MONOTONIC, for bench/cluster.py
        self.took_over_at: float | None = None
        self.view_acks: dict[int, tuple] = {}     # new primary: NewPrimaryView answers by remote group
        self.view_refusals: dict[int, tuple] = {}   # ...and refusals: the view each follows instead (lineage.py)
        self.view_answered = asyncio.Event()

    # -- the primary's side ------------------------------------------------
    def become_primary(self) -> None:
        self.admission = Admission(self.ep, self.hooks.joiner_state, self.hooks.why_no_joining,
                                   self.hooks.view_changed, remove=lambda m, why: self.removal.remove([m], why),
                                   interface=self.opts.interface, checkpoint=self.hooks.checkpoint_for)
        self.removal = BackupRemoval(self.ep, self.silence, self._removal_timeout, self._removed,
                                     admitting=self.admission.unacknowledged_by_newcomers)

    def settling_left(self) -> float:
        """Seconds left of this primary's first SETTLING_S after its takeover
        (negative once past, or if it founded the group)."""
        return (self.took_over_at or 0.0) + SETTLING_S - time.monotonic()

    def _removal_timeout(self) -> float:
        """Longer than any backup waits for a silent primary: in a partition
        the side with the backups elects its primary before the old primary
        removes them.  Just after a takeover, longer again (election.SETTLING_S)."""
        o = self.opts
        base = self.silence.timeout(o.fault_timeout)
        if self.settling_left() > 0:
            base = max(base, SETTLING_TIMEOUT_S)
        return base + max(o.fault_step, base) * len(self.ep.view.backups())

    def _removed(self, members: list[int], why: str):
        self.admission.forget(members)
        self.view_notice.forget(members)
        self.hooks.view_changed()

    def close(self) -> None:
        self.checkpoints.close()
        if self.admission is not None:
            self.admission.close()   # its port, and the states it offers
            self.admission = None

    def accepted(self, seen: list) -> None:
        """A newcomer's replica runs: it acknowledges its own admission, and
        follows the admissions of members who joined while it did."""
        self.ep.send_membership(MsgType.ACCEPT_BACKUP_ACK, {"member": self.ep.me, "for": self.ep.me})
        for msg in seen:
            follow(self.ep, msg, self.hooks.view_changed)

    def settle_for(self, seconds: float) -> None:
        """The current primary took over recently (a newcomer's view of it)."""
        self.election.settle_for(min(seconds, SETTLING_S))

    def program_ended(self) -> None:
        """The primary's program ended (END): nothing is left to take over."""
        self.election.program_ended = True

    # -- every tick of the member's loop -----------------------------------
    def tick(self) -> None:
        """Excluded if this member must leave the group."""
        if self.ep.is_primary and not self.taking_over:
            self.admission.tick()
            self.removal.tick()
            self.view_notice.tick()
        self.checkpoints.tick()
        self.election.tick()

    def ending_tick(self) -> None:
        """The primary's program ended and it waits for its backups: a lagging
        backup may still lack part of the view notice."""
        self.view_notice.tick()

    # -- messages ------------------------------------------------------------
    def on_event(self, name: str, info: dict) -> None:
        msg = info.get("msg")
        if name == "membership-message" and msg is not None:
            self.hooks.heard()
            t = msg.TYPE
            if t in (MsgType.PROPOSE_PRIMARY, MsgType.PROPOSE_PRIMARY_ACK):
                try:
                    self.election.on_message(msg)
                except Excluded as e:   # (a datagram callback: the serve loop leaves the group)
                    self.hooks.leave(str(e))
            elif t == MsgType.NEW_PRIMARY_VIEW_ACK and msg.src_group != self.ep.group:
                refused = refusal_of(msg.body)
                try:
                    if refused is not None:
                        self.view_refusals[msg.src_group] = refused
                    else:
                        self.view_acks[msg.src_group] = parse_new_primary_view_ack(msg.body)
                    self.view_answered.set()
                except wire.DropError as e:
                    self.ep.drops.count(e.reason)
            elif t in (MsgType.NEW_PRIMARY_VIEW, MsgType.NEW_PRIMARY_VIEW_ACK) and msg.src_group == self.ep.group:
                self.view_notice.on_message(msg)
            elif t in (MsgType.REMOVE_BACKUP, MsgType.REMOVE_BACKUP_ACK):
                self._removal_message(msg)
            elif t in (MsgType.CHECKPOINT_FOR, MsgType.CHECKPOINT_OFFERED):
                self.checkpoints.on_message(msg, info.get("addr"))
            elif self.ep.is_primary:
                self.admission.on_message(msg)
            else:
                if t == MsgType.ACCEPT_BACKUP_ACK:
                    self.checkpoints.accepted(msg)
                follow(self.ep, msg, self.hooks.view_changed)
        elif name == "reset-and-rejoin":
            self._competing_primary(info)
        elif name == "not-a-member" and self.ep.is_primary and not self.taking_over:
            self.removal.stray(info["sender"], info["pvn"])

    def _removal_message(self, msg):
        if self.ep.is_primary:
            if msg.TYPE == MsgType.REMOVE_BACKUP_ACK and not self.taking_over:
                self.removal.on_ack(msg)
            return
        if msg.TYPE != MsgType.REMOVE_BACKUP:
            return
        before = set(self.ep.view.precedences)
        why = follow_removal(self.ep, msg)
        if why:
            self.hooks.leave(why)
        elif set(self.ep.view.precedences) != before:
            self.hooks.view_changed()

    def _competing_primary(self, info: dict):
        """Fig. 6 lines 18-20: a message of a view no older than ours whose
        primary has a higher precedence.  A primary steps down (one primary
        per view), whoever sent it: the competing primary itself, a backup
        we removed that is primary now, or a member of a membership formed
        without us, whose admission we missed or whom we removed (two
        backups each took over with a view of its own, and served side by
        side, when only the primary itself counted).

        A backup that hears a member of its view speak in a newer view of
        another primary, a view it is not competing for, was left out of it
        (it missed the proposal: the proposer did not know of it, or it was
        cut off then): it leaves and rejoins.  If
        it waited for its fault detector instead, it would propose itself
        for that same view and take over beside the primary already serving
        it (two primaries of view 4 in the soak across hosts, whose gateway
        followed one then the other: answers repeated and lost).  Other
        backups leave a competing primary of their own view to the election."""
        if self.taking_over:
            return
        sender, precedence = info.get("sender"), info.get("precedence")
        if not self.ep.is_primary:
            pvn = info.get("pvn") or 0
            if sender in self.ep.view and self.election.left_out_by(pvn, precedence or 0):
                self.hooks.leave(f"member {sender} is in view {pvn}, newer than ours ({self.ep.view.pvn}), "
                                 f"of a primary of precedence {precedence}, which left this member out")
            return
        self.hooks.leave(f"member {sender} is in view {info.get('pvn')} of a primary of precedence "
                         f"{precedence}, which replaces ours ({self.ep.view.pvn})")

    def _follow_new_view(self, body: dict) -> None:
        ep = self.ep
        if ep.me not in body["members"]:
            self.hooks.leave(f"the new primary's view {ep.view.pvn} does not include this member")
            return
        log.info("view notice: sync %d, base %d, entries %d.. (%d); this backup had released up to %d",
                 body["sync"], body["base"], body["of"], len(body["ord"]), ep.sequencer.upto)
        if not follow_new_view(ep, body["sync"], body["base"], body["of"], body["ord"]):
            log.error("this backup lacks ordering information of the old primary up to %d: it cannot follow "
                      "the new primary", body["sync"])
            self.hooks.leave("it cannot reach the new view's synchrony point")

    # -- taking over (phase 2) ----------------------------------------------------
    def _elected(self, view: View, acks: dict):
        self.elected_at = time.monotonic()
        self.taking_over = True
        self.hooks.elected(view, acks)

    def _remote_alive(self, group: int, since: float) -> bool:
        """Whether a remote group has been heard within REMOTE_SILENCE_S
        (counting from `since` for one not heard at all)."""
        heard = max(self.ep.remote_heard.get(group, since), since)
        return self.ep.clock.now() - heard < REMOTE_SILENCE_S

    async def take_over(self, view: View, acks: dict) -> dict[ConnId, int] | None:
        """LLFT Fig. 9 lines 26-35: reach the virtual synchrony point (every
        ordering entry any member or remote group holds, every message the
        remote groups sent) and install the view there.  Returns the msn
        after which each connection's messages go on in the new view; None
        if this member must leave instead (hooks.leave said why)."""
        ep = self.ep
        for _upto, first, blobs in acks.values():
            deliver_held_order(ep, first, blobs)
        # Every remote group heard, not only those with connections open: one
        # whose connections all ended took replies all the same (lineage.py).
        now = ep.clock.now()
        remotes = {c.remote for c in ep.conns.values()} | {
            g for g, heard in ep.remote_heard.items() if now - heard < REMOTE_SILENCE_S}
        self.view_acks.clear()
        self.view_refusals.clear()
        asked = now
        # Every remote group that is alive must answer: its clients may have
        # seen the effect of ordering information only it holds, and until
        # it hears of this view it takes the old primary's replies.  One
        # that is silent for REMOTE_SILENCE_S is gone, and its clients with it.
        while waiting := [g for g in remotes - self.view_acks.keys() if self._remote_alive(g, asked)]:
            for g in waiting:
                new_primary_view(ep, g, view)
            self.view_answered.clear()
            try:
                await asyncio.wait_for(self.view_answered.wait(), 0.03)
            except asyncio.TimeoutError:
                pass
            if self.view_refusals:
                g, (pvn, precedence) = next(iter(self.view_refusals.items()))
                self.hooks.leave(f"group {g} took replies of view {pvn} from a primary of precedence "
                                 f"{precedence}, which this member's view {view.pvn} does not descend from "
                                 f"(the group split; its other side served clients)")
                return None
        bases, last_sent = {}, {}
        for g in remotes:
            if g not in self.view_acks:
                log.warning("remote group %d did not answer NewPrimaryView and has been silent for %.1f s: "
                            "taken to be gone with its clients", g, REMOTE_SILENCE_S)
                continue
            rows, first, blobs = self.view_acks[g]
            deliver_held_order(ep, first, blobs)
            for cid, recv_upto, sent in rows:
                c = ep.conns.get(cid)
                if c is not None:
                    bases[cid], last_sent[cid] = recv_upto, sent
                    c.rx.learn_highest(sent, ep.clock.now())
        # Every message the remote groups sent (line 30), and with them the
        # ordering information they reflected.  Entries past a gap are the
        # old primary's whose effects no client saw: not followed.
        nacked = ep.clock.now()
        while True:
            lacking = [cid for cid, n in last_sent.items() if nack_remote(ep, cid, n, view)]
            if not lacking or not any(self._remote_alive(cid.remote(ep.group), nacked) for cid in lacking):
                break
            await asyncio.sleep(0.015)
        if lacking:
            log.error("the gateways' messages up to their lastSentMsn did not all arrive: going on without them "
                      "(%s)", ", ".join(f"connection {tuple(cid)}: have {c.rx.received_upto} of {n}"
                                        for cid, n in last_sent.items()
                                        if (c := ep.conns.get(cid)) is not None and c.rx.received_upto < n))
        for cid, c in ep.conns.items():
            bases.setdefault(cid, c.tx.remote_ack)
        sync = ep.sequencer.upto
        base = order_base(view.pvn, sync)
        lowest = min((upto for upto, _first, _blobs in acks.values()), default=sync)
        take_over(ep, view, base)
        first, lacking = self.hooks.held_after(lowest, sync)
        self.view_notice.start(view, {"pvn": view.pvn, "sync": sync, "base": base, "of": first, "ord": lacking,
                                      "members": sorted(view.precedences)})
        ep.on_order = None
        log.info("synchrony point %d; backups' lowest position %d; the view notice carried %d entries from %d",
                 sync, lowest, len(lacking), first)
        return bases

    def took_over(self) -> None:
        """The core runs as the new view's primary: admissions and removals are this member's."""
        self.become_primary()
        self.taking_over = False
        self.took_over_at = time.monotonic()

    def checkpoint_source(self, newcomer: int) -> int | None:
        """The last in rank of the backups that report and were heard
        within the fault timeout, other than newcomer and those admitted
        but not yet up; None if there is none."""
        ep, pending = self.ep, self.admission.pending
        able = [b for b in ep.view.backups() if b != newcomer and b not in pending and b in ep.backup_reports
                and silent_for(ep, b) < self.opts.fault_timeout]
        rank = ep.view.ranks()
        return max(able, key=rank.get, default=None)

    async def ask_checkpoint(self, source: int, newcomer: int) -> dict:
        return await self.checkpoints.ask(source, newcomer)

    def fault_timeout_applied(self, configured: float) -> float:
        return self.silence.timeout(configured)

    def failover_times(self) -> dict:
        """CLOCK_MONOTONIC times of this member's last primary change, for bench/cluster.py."""
        return {"suspected": self.election.suspected_at, "last_ack": self.election.last_ack_at,
                "elected": self.elected_at, "took_over": self.took_over_at}
