"""Ordering information transport (LLFT §III-C).  Blobs are opaque here
(the determinizer writes 64-byte OrderInfo records into them); messaging only
numbers them with an order sequence number (oseq) and gets them, in order,
to every backup of the primary's group.

Fast path: each entry rides once on the next application message the
primary sends (on any connection), which is reliable.  The remote primary
reflects it back once on its next application message on that connection,
which our backups receive reliably too (they Nack what they miss); until
then, and until our primary acknowledges the reflection (`refl_ack`), it
also rides on the remote primary's FirstAcks and KeepAlives.  Backstop:
entries a backup still lacks after `order_fallback` seconds go to it on
the primary's Heartbeat; the primary keeps each entry until every backup's
Heartbeat reports holding it (oupto).  Per message the piggyback is bounded
by `order_budget` bytes.
"""
from __future__ import annotations

from collections import OrderedDict


def _run(entries: dict, first: int, budget: int) -> tuple[int, list[bytes]]:
    """Consecutive blobs from oseq `first` on, within budget (at least one)."""
    out, used, k = [], 0, first
    while True:
        v = entries.get(k)
        if v is None:
            break
        blob = v[0] if isinstance(v, tuple) else v
        if out and used + len(blob) > budget:
            break
        out.append(blob)
        used += len(blob)
        k += 1
    return (first if out else 0), out


class OrderLog:
    """The primary's own ordering entries: oseq -> (blob, created)."""

    def __init__(self) -> None:
        self.next_oseq = 1
        self.entries: OrderedDict[int, tuple[bytes, float]] = OrderedDict()
        self.confirmed = 0  # every backup holds all entries <= this
        self.carried = 0    # entries <= this rode on an application message

    def add(self, blob: bytes, now: float, keep: bool) -> int:
        oseq = self.next_oseq
        self.next_oseq += 1
        if keep:
            self.entries[oseq] = (blob, now)
        elif self.confirmed == oseq - 1:  # no backups: nobody needs it
            self.confirmed = oseq
        return oseq

    def _from(self, after: int) -> int:
        after = max(after, self.confirmed)
        return max(after + 1, next(iter(self.entries), after + 1))

    def for_message(self, budget: int) -> tuple[int, list[bytes]]:
        """New entries for an application message; each is carried once."""
        first, blobs = _run(self.entries, self._from(self.carried), budget)
        if blobs:
            self.carried = first + len(blobs) - 1
        return first, blobs

    def for_control(self, reflected: int, budget: int) -> tuple[int, list[bytes]]:
        """Entries not yet seen reflected, for an unreliable control message."""
        return _run(self.entries, self._from(reflected), budget)

    def older_than(self, after: int, cutoff: float, budget: int) -> tuple[int, list[bytes]]:
        """Fallback: entries > after created before cutoff."""
        first, blobs = _run(self.entries, self._from(after), budget)
        for i in range(len(blobs)):
            if self.entries[first + i][1] > cutoff:
                return (first if i else 0), blobs[:i]
        return first, blobs

    def confirm(self, upto: int) -> None:
        self.confirmed = max(self.confirmed, min(upto, self.next_oseq - 1))
        e = self.entries
        while e and next(iter(e)) <= self.confirmed:
            e.popitem(last=False)


class Reflector:
    """At a primary, per connection: the remote primary's entries to
    reflect back to the remote group until it acknowledges seeing them."""

    def __init__(self) -> None:
        self.entries: OrderedDict[int, bytes] = OrderedDict()
        self.unsent: OrderedDict[int, bytes] = OrderedDict()  # not yet on an application message
        self.acked = 0

    def add(self, first: int, blobs: list[bytes]) -> None:
        for i, blob in enumerate(blobs):
            oseq = first + i
            if oseq > self.acked and oseq not in self.entries:
                self.entries[oseq] = self.unsent[oseq] = blob

    def add_held(self, other: "Reflector") -> None:
        """Takes over another's entries not yet acknowledged (a retired connection's)."""
        other.ack(self.acked)
        self.entries.update(other.entries)
        self.entries = OrderedDict(sorted(self.entries.items()))

    def ack(self, upto: int) -> None:
        if upto > self.acked:
            self.acked = upto
            for d in (self.entries, self.unsent):
                while d and next(iter(d)) <= upto:
                    d.popitem(last=False)

    def for_message(self, budget: int) -> tuple[int, list[bytes]]:
        if not self.unsent:
            return 0, []
        first, blobs = _run(self.unsent, next(iter(self.unsent)), budget)
        for _ in blobs:
            self.unsent.popitem(last=False)
        return first, blobs

    def for_control(self, budget: int) -> tuple[int, list[bytes]]:
        return _run(self.entries, next(iter(self.entries)), budget) if self.entries else (0, [])


class OrderSequencer:
    """Collects entries arriving by any path, in any order, and releases
    each exactly once in oseq order (at backups: the blobs; at the primary:
    just how far its reflected entries have been seen)."""

    def __init__(self) -> None:
        self.upto = 0
        self.pending: dict[int, bytes] = {}
        self.held = False       # release nothing more (see hold)

    def hold(self, held: bool = True) -> None:
        """A backup that acknowledged a new primary releases nothing more of
        the old view until the view notice says where it ends: an entry it
        released after its acknowledgment (a reflection the new primary never
        got) could lie past the virtual synchrony point, and its replica
        would then replay records the new primary never did."""
        self.held = held

    def add(self, first: int, blobs: list[bytes]) -> list[bytes]:
        for i, blob in enumerate(blobs):
            if first + i > self.upto:
                self.pending.setdefault(first + i, blob)
        out = []
        while self.upto + 1 in self.pending and not self.held:
            self.upto += 1
            out.append(self.pending.pop(self.upto))
        return out

    def skip_to(self, upto: int) -> list[bytes]:
        """Entries <= upto no longer matter (confirmed another way).  Returns
        the pending entries after upto that this releases, as add() does."""
        if upto <= self.upto:
            return []
        for k in [k for k in self.pending if k <= upto]:
            del self.pending[k]
        self.upto = upto
        return self.add(upto + 1, [])


class RemoteOrder:
    """At every member, per remote group: how far that group's primary's
    ordering information is held here without a gap, from its messages'
    piggybacks or because its backups all hold it (refl_ack).

    Output commit (LLFT §II-E): a message's content may depend on any entry
    its primary made before it (`needs`), and each entry rides once, on
    whichever message goes next, on any connection.  A message is handed on
    only once every entry it needs is here or at every backup of its group:
    else, with a message carrying earlier entries lost and its primary dead,
    a client could have seen output whose ordering information no member
    has, and the new primary would re-create it differently (a gateway
    opened outgoing UDP ports whose numbers a new primary never learnt, and
    gave their answers to the wrong sockets)."""

    __slots__ = ("pvn", "upto", "pending")

    def __init__(self) -> None:
        self.pvn = 0
        self.upto = 0
        self.pending: set[int] = set()

    def view(self, pvn: int) -> bool:
        """The remote group's primary is of view pvn; a new view numbers its
        entries anew (viewchange.order_base): starts over.  True if it did."""
        if pvn == self.pvn:
            return False
        self.pvn, self.upto = pvn, 0
        self.pending.clear()
        return True

    def add(self, first: int, count: int, confirmed: int) -> bool:
        """Entries first..first+count-1 arrived, and the remote backups all
        hold entries <= confirmed.  True if upto moved."""
        before = self.upto
        if confirmed > self.upto:
            self.upto = confirmed
        if not self.pending and first <= self.upto + 1:   # the usual case: in order
            self.upto = max(self.upto, first + count - 1)
            return self.upto != before
        for k in range(max(first, self.upto + 1), first + count):
            self.pending.add(k)
        p = self.pending
        if p:
            while self.upto + 1 in p:
                self.upto += 1
            if before != self.upto:
                self.pending = {k for k in p if k > self.upto}
        return self.upto != before
