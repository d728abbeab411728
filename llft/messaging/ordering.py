"""Ordering information transport (LLFT §III-C).  Blobs are opaque here
(the determinizer writes 64-byte OrderInfo records into them); messaging only
numbers them with an order sequence number (oseq) and gets them, in order,
to every backup of the primary's group.

Fast path: the primary piggybacks its unreflected entries on every message
it sends on a connection; the remote primary reflects them back on every
message it sends to our group (which our backups receive) until our primary
says it has seen them (`refl_ack`).  Backstop: entries a backup still lacks
after `order_fallback` seconds go to it on the primary's Heartbeat; the
primary keeps each entry until every backup's Heartbeat reports it (oupto).
"""
from __future__ import annotations

from collections import OrderedDict


def _take(entries: OrderedDict, after: int, budget: int) -> tuple[int, list[bytes]]:
    """Consecutive entries with oseq > after, oldest first, within budget."""
    first, out, used = 0, [], 0
    for oseq, value in entries.items():
        if oseq <= after:
            continue
        blob = value[0] if isinstance(value, tuple) else value
        if out and used + len(blob) > budget:
            break
        if not out:
            first = oseq
        elif oseq != first + len(out):
            break
        out.append(blob)
        used += len(blob)
    return first, out


class OrderLog:
    """The primary's own ordering entries: oseq -> (blob, created)."""

    def __init__(self) -> None:
        self.next_oseq = 1
        self.entries: OrderedDict[int, tuple[bytes, float]] = OrderedDict()

    def add(self, blob: bytes, now: float, keep: bool) -> int:
        oseq = self.next_oseq
        self.next_oseq += 1
        if keep:  # with no backups nobody needs it
            self.entries[oseq] = (blob, now)
        return oseq

    def slice(self, after: int, budget: int) -> tuple[int, list[bytes]]:
        return _take(self.entries, after, budget)

    def older_than(self, after: int, cutoff: float, budget: int) -> tuple[int, list[bytes]]:
        """Fallback: entries > after created before cutoff."""
        aged = OrderedDict((k, v) for k, v in self.entries.items() if k > after and v[1] <= cutoff)
        return _take(aged, after, budget)

    def confirm(self, upto: int) -> None:
        e = self.entries
        while e and next(iter(e)) <= upto:
            e.popitem(last=False)


class Reflector:
    """At a primary, per connection: the remote primary's entries to reflect
    back to the remote group until it acknowledges seeing them."""

    def __init__(self) -> None:
        self.entries: OrderedDict[int, bytes] = OrderedDict()
        self.acked = 0

    def add(self, first: int, blobs: list[bytes]) -> None:
        for i, blob in enumerate(blobs):
            oseq = first + i
            if oseq > self.acked and oseq not in self.entries:
                self.entries[oseq] = blob
        if blobs and first + len(blobs) - 1 < max(self.entries, default=0):
            # arrived out of order: keep oseq order for _take
            self.entries = OrderedDict(sorted(self.entries.items()))

    def ack(self, upto: int) -> None:
        if upto > self.acked:
            self.acked = upto
            e = self.entries
            while e and next(iter(e)) <= upto:
                e.popitem(last=False)

    def slice(self, budget: int) -> tuple[int, list[bytes]]:
        return _take(self.entries, self.acked, budget)


class OrderSequencer:
    """At a backup: collects entries from any path and releases them in oseq
    order, each exactly once."""

    def __init__(self) -> None:
        self.upto = 0
        self.pending: dict[int, bytes] = {}

    def add(self, first: int, blobs: list[bytes]) -> list[bytes]:
        for i, blob in enumerate(blobs):
            if first + i > self.upto:
                self.pending.setdefault(first + i, blob)
        out = []
        while self.upto + 1 in self.pending:
            self.upto += 1
            out.append(self.pending.pop(self.upto))
        return out
