"""Removal of a backup (LLFT §IV-C2, Fig. 10: RemoveBackup and its
acknowledgment).

The primary's fault detector watches every backup: one silent for the
removal timeout is taken out of the view at once (messaging stops waiting
for it: group watermarks, intra-group flow control, ordering
confirmations), the ranks of the others close up, and the primary
multicasts RemoveBackup with the new membership until every remaining
backup acknowledges it; one that has not after MAX_COUNT repeats is
removed in turn (as for ProposePrimary).  The primary view number does not
change: only a change of the primary makes a new view.

A backup that receives a RemoveBackup including it adopts the membership
and acknowledges; one that is not included (mistakenly suspected, e.g.
frozen past the timeout) resets and applies again (ProposeBackup).  A
removed backup that missed every RemoveBackup is told again when one of its
Heartbeats reaches the primary."""
from __future__ import annotations

import logging

from llft.ordering.llmp import wire
from llft.ordering.llmp.membership.detector import Deadline, Silence
from llft.ordering.llmp.membership.membership import parse_view, view_body
from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.membership")

RETRY_S = 0.02
MAX_COUNT = 25
JOIN_GRACE_S = 2.0        # a newcomer replays the group's log before it is heard regularly
TELL_EVERY_S = 0.1        # how often a removed member still heard is told again
# Silence counts only while this member listens (detector.py): each time its
# loop runs late, it starts again.  Real-time controllers that saturate the
# CPUs lose 50 ms a second to RT throttling, so under steady load it starts
# again every second, short of the removal timeout, and a dead backup would
# stay in the view (47 s in a nemesis run across hosts), holding back the
# group watermarks.  A backup silent this many removal timeouts by the
# clock, with every datagram that arrived read, is removed all the same.
CLOCK_SILENCE_FACTOR = 5
# A backup removed for silence (or for not acknowledging) may be cut off
# and take over on its side: its last report holds back what the remote
# groups keep for a new primary this long after (forget_backups).  It
# covers partitions whose directions fail up to this far apart; the
# remote groups' kept messages (Config.kept_window) bound it as well.
SILENT_LINGER_S = 2.0


class BackupRemoval:
    """At the primary: removes the backups its fault detector finds silent."""

    def __init__(self, ep, silence: Silence, timeout, on_removed, admitting=lambda: ()):
        self.ep, self.silence = ep, silence
        self.timeout = timeout            # fn() -> seconds of silence after which a backup is removed
        self.on_removed = on_removed      # fn([member], why): they are out of the view
        self.admitting = admitting        # fn() -> backups whose AcceptBackup has not reached them yet
        now = ep.clock.now()
        self.since = {b: now for b in ep.view.backups()}   # each backup's silence counts from here
        self.round = 0
        self.pending: list | None = None  # [encoded RemoveBackup, sends, members yet to acknowledge]
        self.last_sent = float("-inf")
        self.told: dict[int, float] = {}
        self.deadline = Deadline(silence, self._check)

    # -- the fault detector ------------------------------------------------------
    def tick(self) -> None:
        if not self.deadline.armed:
            self.deadline.arm(0)
        p, now = self.pending, self.ep.clock.now()
        if p is None or now - self.last_sent < RETRY_S:
            return
        if not p[2]:
            self.pending = None
            return
        if p[1] >= MAX_COUNT:
            self.remove(sorted(p[2]), f"did not acknowledge RemoveBackup {MAX_COUNT} times", silent=True)
            return
        p[1] += 1
        self.last_sent = now
        self.ep.resend(p[0], MsgType.REMOVE_BACKUP)

    def _check(self) -> float | None:
        ep, now, timeout = self.ep, self.ep.clock.now(), self.timeout()
        if not ep.is_primary:
            return None
        admitting = set(self.admitting())
        for b in ep.view.backups():
            # A backup admitted by this primary gets time to replay the group's
            # log once its admission, which carries the log, has reached it
            # (megabytes take seconds; the admission has its own bound).
            if b in admitting:
                self.since[b] = now + JOIN_GRACE_S
            else:
                self.since.setdefault(b, now + JOIN_GRACE_S)
        # (a backup's silence: while this member listened, or a fifth of it by the clock)
        silences = {b: max(self.silence.of(b, self.since[b]), self._by_clock(b, now) / CLOCK_SILENCE_FACTOR)
                    for b in ep.view.backups()}
        silent = sorted(b for b, s in silences.items() if s >= timeout)
        if silent:
            self.remove(silent, "silent for " + ", ".join(f"{self._by_clock(b, now) * 1000:.0f}" for b in silent)
                        + " ms", silent=True)
            return timeout
        return min((timeout - s for s in silences.values()), default=timeout)

    def _by_clock(self, b: int, now: float) -> float:
        """Seconds since backup b was last heard (or its watch began), by
        the clock, whether this member listened or not."""
        return now - max(self.ep.last_heard.get(b, 0.0), self.since[b])

    # -- RemoveBackup -------------------------------------------------------------
    def remove(self, members: list[int], why: str, silent: bool = False) -> None:
        ep = self.ep
        members = [m for m in members if m in ep.view.backups()]
        if not members:
            return
        for m in members:
            ep.view.precedences.pop(m)
            self.since.pop(m, None)
        ep.forget_backups(members, linger=SILENT_LINGER_S if silent else 0.0)
        self.round += 1
        log.warning("backup%s %s %s: removed from the group (view %d now %s)", "s" * (len(members) > 1),
                    ", ".join(map(str, members)), why, ep.view.pvn, sorted(ep.view.precedences))
        data = ep.send_membership(MsgType.REMOVE_BACKUP, self._body(members))
        self.pending = [data, 1, set(ep.view.backups())]
        self.last_sent = ep.clock.now()
        self.on_removed(members, why)

    def _body(self, removed: list[int]) -> dict:
        return {"round": self.round, "removed": removed, "view": view_body(self.ep.view)}

    def on_ack(self, msg) -> None:
        body = msg.body if isinstance(msg.body, dict) else {}
        if self.pending is not None and body.get("round") == self.round:
            self.pending[2].discard(msg.sender)

    def stray(self, sender: int, pvn: int) -> None:
        """A Heartbeat of our view from a member not in it: it missed its
        removal (or never completed its admission) and must hear of it."""
        ep, now = self.ep, self.ep.clock.now()
        if not ep.is_primary or pvn != ep.view.pvn or sender in ep.view:
            return
        if now - self.told.get(sender, float("-inf")) < TELL_EVERY_S:
            return
        self.told[sender] = now
        if len(self.told) > 1000:
            self.told.clear()
        ep.send_membership(MsgType.REMOVE_BACKUP, self._body([sender]))


def follow_removal(ep, msg) -> str | None:
    """At a backup: a RemoveBackup from our primary.  Returns why this member
    must reset and rejoin (it is not in the new membership), else None."""
    if msg.sender != ep.view.primary or ep.is_primary:
        return None
    body = msg.body if isinstance(msg.body, dict) else {}
    try:
        view = parse_view(ep.group, body.get("view"))
        removed = [int(m) for m in body["removed"]]
        round_ = int(body["round"])
    except (KeyError, TypeError, ValueError, wire.DropError):
        ep.drops.count("malformed")
        return None
    if view.pvn != ep.view.pvn or view.primary != ep.view.primary:
        return None
    if ep.me not in view:
        return f"the primary removed this member from view {view.pvn}"
    # Only the removals are taken from it: a repeated RemoveBackup may predate
    # an admission we followed since.
    gone = [m for m in removed if m in ep.view and m not in view and m != ep.view.primary]
    for m in gone:
        del ep.view.precedences[m]
    if gone:
        log.warning("the primary removed backup%s %s (view %d now %s)", "s" * (len(gone) > 1),
                    ", ".join(map(str, gone)), ep.view.pvn, sorted(ep.view.precedences))
    ep.send_membership(MsgType.REMOVE_BACKUP_ACK, {"member": ep.me, "round": round_})
    return None
