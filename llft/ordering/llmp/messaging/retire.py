"""Retiring finished connections.

The protocol of Fig. 6 never ends a connection: every one a group ever had
would stay in `conns`, visited on every tick, listed in every Heartbeat, and
(at a primary) kept alive with a KeepAlive every 50 ms.  A gateway that had
served a few hundred short client connections made its group's primary
miss its Heartbeats, and the group failed over again and again.

So the application says when it is done with a connection (`finish`: both
of its sides ended), and messaging drops it once the connection is quiet
on this side (everything sent acknowledged, everything received handed on
and acknowledged to the remote group) and has been finished for
`LINGER_S`, long enough for stray retransmissions to find it still there.
A retired connection leaves a tombstone: a late message for it is dropped
and counted ("retired-connection") instead of opening it again.  The two
sides retire independently, so one that is still waiting for the other
(an acknowledgment lost for good) gives up after GIVE_UP_S.

Ordering information the remote primary sent on the connection and has not
acknowledged seeing reflected is kept, per remote group, among the
`orphans`: a new remote primary still gets it in the answer to its
NewPrimaryView (viewchange.py), and the remote primary's next
acknowledgment on any connection frees it.
"""
from __future__ import annotations

from llft.ordering.llmp.messaging.ordering import Reflector

LINGER_S = 2.0          # finished and quiet for this long before it goes
GIVE_UP_S = 30.0        # finished this long: it goes even if not quiet (the remote side retired it)
CHECK_EVERY_S = 0.1     # how often finished connections are looked at
RETIRED_DROP = "retired-connection"   # the drop reason of a message for a retired connection
TOMBSTONES_LIMIT = 100_000  # per client group, beyond the contiguous low range
RETIRED_SENT_KEPT = 256     # the lowest retired connections' msgSeqCounts, for the state file


class Tombstones:
    """Retired connections: per (client group, server group), every
    connSeqNum up to `low`, and the set of those above it.  Gateways number
    their connections from 1 in order, so `low` moves up as they finish and
    the set stays small; a long-lived connection holding `low` back makes
    the set grow, bounded by forgetting its oldest entries (a message that
    late is not plausible)."""

    def __init__(self):
        self._low: dict[tuple[int, int], int] = {}
        self._above: dict[tuple[int, int], dict[int, None]] = {}

    def add(self, cid) -> None:
        key = (cid.client, cid.server)
        low = self._low.get(key, 0)
        if cid.seq <= low:
            return
        above = self._above.setdefault(key, {})
        above[cid.seq] = None
        while low + 1 in above:
            low += 1
            del above[low]
        self._low[key] = low
        if len(above) > TOMBSTONES_LIMIT:
            for seq in list(above)[: TOMBSTONES_LIMIT // 10]:
                del above[seq]

    def listed(self) -> list:
        """[[client, server, low, [seq above low, ...]], ...]: for a newcomer
        that takes no connection's history (a checkpoint, llft/cluster/checkpoint_join.py)."""
        return [[c, s, low, list(self._above.get((c, s), ()))] for (c, s), low in self._low.items()]

    def adopt(self, listed: list) -> None:
        for c, s, low, above in listed:
            key = (int(c), int(s))
            self._low[key] = max(self._low.get(key, 0), int(low))
            self._above.setdefault(key, {}).update((int(q), None) for q in above if int(q) > self._low[key])

    def __contains__(self, cid) -> bool:
        key = (cid.client, cid.server)
        return cid.seq <= self._low.get(key, 0) or cid.seq in self._above.get(key, ())

    def __len__(self) -> int:
        return sum(self._low.values()) + sum(map(len, self._above.values()))


def busy(ep, c) -> str | None:
    """What is left to do on connection c at this member, if anything: its
    messages all acknowledged by the remote primary, every message received
    handed to the application with no gap, and, at the primary, the remote
    group told (its SecondAck) what we received."""
    tx, rx = c.tx, c.rx
    if tx.remote_ack < tx.msg_seq_count:
        # (What the remote primary acknowledged may wait in the sent list for
        # its group's watermark; on a connection that ends, that would take
        # more rounds of KeepAlives than either side waits.)
        return "unacknowledged"
    if rx.nacks or rx.highest > rx.received_upto:
        return "missing"
    if rx.consumed < rx.received_upto:
        return "undelivered"
    if ep.is_primary and (c.first_ack or c.ack_sent < rx.received_upto):
        return "acknowledging"
    return None


class RetireMixin:
    """GroupEndpoint's side: `finish` and the periodic check."""

    def finish(self, cid) -> None:
        """The application has ended this connection both ways: it goes
        once quiet (LINGER_S after now at the earliest)."""
        if cid in self.conns and cid not in self.finishing:
            now = self.clock.now()
            self.finishing[cid] = [now, now]    # finished at, quiet since

    def retire_now(self, cid, sent: int) -> None:
        """A connection retired before this member joined (state transfer),
        after `sent` messages: never opened here."""
        self.conns.pop(cid, None)
        self.finishing.pop(cid, None)
        self.tombstones.add(cid)
        self._note_retired_sent(cid, sent)

    def _note_retired_sent(self, cid, sent: int) -> None:
        """The lowest connections, not the first retired: members retire in
        their own time, and their listings must agree once all have."""
        self.retired_sent[cid] = sent
        if len(self.retired_sent) > RETIRED_SENT_KEPT:
            del self.retired_sent[max(self.retired_sent)]

    def _orphans_acked(self, group: int, upto: int) -> None:
        """The remote primary of `group` has seen its entries up to `upto`
        reflected: retired connections' copies of them are no longer needed."""
        orphans = self.orphans.get(group)
        if orphans is not None:
            orphans.ack(upto)
            if not orphans.entries:
                del self.orphans[group]

    def finishing_busy(self) -> dict[str, int]:
        """Why finished connections are still here (llft-status)."""
        out: dict[str, int] = {}
        for cid in self.finishing:
            c = self.conns.get(cid)
            why = (busy(self, c) if c is not None else None) or "lingering"
            out[why] = out.get(why, 0) + 1
        return out

    def _retire_finished(self, now: float) -> None:
        if now - self._last_retire_check < CHECK_EVERY_S or not self.finishing:
            return
        self._last_retire_check = now
        for cid, times in list(self.finishing.items()):
            c = self.conns.get(cid)
            if c is None:
                del self.finishing[cid]
                continue
            if busy(self, c):
                times[1] = now
            if now - times[1] >= LINGER_S or now - times[0] >= GIVE_UP_S:
                self._retire(c, forced=now - times[1] < LINGER_S)

    def _retire(self, c, forced: bool) -> None:
        cid = c.id
        del self.finishing[cid]
        del self.conns[cid]
        self.tombstones.add(cid)
        self.primary_gwm.pop(cid, None)
        if c.reflector.entries:
            orphans = self.orphans.get(c.remote)
            if orphans is None:
                orphans = self.orphans[c.remote] = Reflector()
            orphans.add_held(c.reflector)
        self._note_retired_sent(cid, c.tx.msg_seq_count)
        self.counters["connections_retired_unquiet" if forced else "connections_retired"] += 1
