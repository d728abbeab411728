"""The receiving half of a connection: received list with placeholders,
nack list, receivedUpToMsn, delivered list (Fig. 6 lines 18-43, 82-84).

A message received in order is released to the application only once the
ordering information it needs is held (output commit: ordering.RemoteOrder);
until then it counts as received (acknowledged) but moves no watermark, so
the sending group's backups keep their copies of it."""
from __future__ import annotations

from collections import OrderedDict


class RecvEntry:
    __slots__ = ("msn", "ts", "data", "msg", "last_tx")

    def __init__(self, msn: int, ts: int, data: bytes, msg):
        self.msn, self.ts, self.data, self.msg = msn, ts, data, msg
        self.last_tx = float("-inf")  # when the primary last re-multicast it to its backups


class RecvSide:
    def __init__(self, window: int, kept_messages: int = 1 << 62, kept_bytes: int = 1 << 62):
        self.window = window
        self.kept_messages, self.kept_bytes = kept_messages, kept_bytes   # the delivered list's bounds
        self.received: dict[int, RecvEntry | None] = {}  # None is a placeholder
        self.nacks: dict[int, float] = {}                 # the nack list: msn -> gap seen at
        self.received_upto = 0   # receivedUpToMsn
        self.highest = 0         # highest msn known to exist
        self.released = 0        # msns <= this may go to the application (their ordering information is here)
        self.consumed = 0        # msns <= this were handed to the application
        self.delivered: OrderedDict[int, RecvEntry] = OrderedDict()  # the delivered list
        self.delivered_bytes = 0
        self.rw = 0              # timestamp watermark of this connection at this member
        self.app_rw = 0          # ... as far as application messages go (control messages move rw on)

    def _limit(self) -> int:
        """Highest msn accepted.  Flow control: at most `window` unconsumed
        messages; and consumed ones wait in the delivered list for the
        group watermark (a lagging member's, a newcomer's that has not
        reported yet), so once that list passes its bounds (kept_messages,
        kept_bytes), at most 2 x `window` held in all, until the watermark
        frees some."""
        limit = self.consumed + self.window
        d = self.delivered
        if d and (len(d) >= self.kept_messages or self.delivered_bytes >= self.kept_bytes):
            limit = min(limit, next(iter(d)) - 1 + 2 * self.window)
        return limit

    def learn_highest(self, msn: int, now: float = 0.0) -> None:
        """A message up to `msn` exists: create placeholders and Nacks for the
        gap (lines 22-24; a lost tail is found from last_msn or a SecondAck)."""
        msn = min(msn, self._limit())
        if msn > self.highest:
            for m in range(max(self.highest, self.received_upto) + 1, msn + 1):
                if m not in self.received:
                    self.received[m] = None
                    self.nacks[m] = now
            self.highest = msn

    def receive(self, entry: RecvEntry, now: float = 0.0) -> str:
        """Insert an application message; returns 'new', 'duplicate' or 'window'."""
        m = entry.msn
        if m <= self.received_upto or self.received.get(m) is not None:
            return "duplicate"                     # line 30: discard retransmission
        if m > self._limit():
            return "window"
        self.learn_highest(m - 1, now)
        self.received[m] = entry                   # lines 25, 28, 31
        self.nacks.pop(m, None)                    # line 29
        if m > self.highest:
            self.highest = m
        self._advance()
        return "new"

    def _advance(self) -> None:
        # line 32: update receivedUpToMsn
        got = self.received
        while got.get(self.received_upto + 1) is not None:
            self.received_upto += 1

    def release(self, order_upto: int) -> int:
        """Releases the messages received in order whose needed ordering
        information is held (up to order_upto); returns how many."""
        n, got = 0, self.received
        while self.released < self.received_upto:
            e = got[self.released + 1]
            pb = e.msg.piggyback
            if pb is not None and pb.needs > order_upto:
                break
            self.released += 1
            n += 1
            if e.ts > self.rw:
                self.rw = e.ts
            if e.ts > self.app_rw:
                self.app_rw = e.ts
        return n

    def held_back(self) -> bool:
        """Messages received in order wait for ordering information."""
        return self.released < self.received_upto

    def flush_after_upto(self) -> int:
        """A new primary took over the remote group (Fig. 9 line 38): what
        came from the old one after the last message released (after a gap,
        or waiting for ordering information no member may have) is
        discarded; the new primary goes on from there.  Returns how many
        were discarded."""
        later = [m for m in self.received if m > self.released]
        for m in later:
            del self.received[m]
        self.nacks.clear()
        self.highest = self.received_upto = self.released
        return len(later)

    def note_control(self, last_msn: int, ts: int, now: float = 0.0) -> None:
        """The remote primary had sent msns <= last_msn when it stamped a
        control message `ts`: if we hold them all, nothing earlier than ts is
        missing (advances the watermark of an idle connection)."""
        if last_msn <= self.released and ts > self.rw:
            self.rw = ts
        elif last_msn > self.highest:
            self.learn_highest(last_msn, now)

    def due_nacks(self, now: float, delay: float, limit: int) -> list[int]:
        """Missing msns whose gap is older than `delay`, lowest first."""
        return sorted(m for m, t in self.nacks.items() if now - t >= delay)[:limit]

    def ready(self) -> bool:
        return self.consumed < self.released

    def take(self) -> RecvEntry:
        """Move the next in-order message to the delivered list (line 43)."""
        self.consumed += 1
        e = self.received.pop(self.consumed)
        self.delivered[e.msn] = e
        self.delivered_bytes += len(e.data)
        return e

    def lookup(self, msn: int) -> RecvEntry | None:
        return self.received.get(msn) or self.delivered.get(msn)

    def gc(self, group_wm: int) -> int:
        """Free delivered messages with ts <= group watermark (lines 82-84)."""
        freed, d = 0, self.delivered
        while d:
            e = next(iter(d.values()))
            if e.ts > group_wm:
                break
            d.popitem(last=False)
            self.delivered_bytes -= len(e.data)
            freed += 1
        return freed

    def buffered(self) -> int:
        return len(self.received) + len(self.delivered)
