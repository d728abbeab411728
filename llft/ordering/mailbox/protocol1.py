"""Receive of Protocol 1 (crash failures only; §5.2).  A receiver takes
the messages in timestamp order, each once its Send must have ended
(T + Δs + ε), and decides in timed slots of δd per copy, from the first
intact copy on: follow a decision already written, or decide from the
a-flag and write it.  A copy found crashed costs an extra wait, so that a
receiver that decided in it has written its decision into the next copy
before this one reads there (§5.3)."""
from __future__ import annotations

from llft.ordering.mailbox.mailbox import AllCopiesCrashed, Delivery, Mailbox
from llft.ordering.mailbox.segment import BOTTOM, NO_DFLAG, Copy, Entry, MemoryCrashed, Timestamp
from llft.ordering.mailbox.steps import STEP, Protocol, Until


class Receiver1:
    def __init__(self, mailbox: Mailbox, slot: int, since: Timestamp = Timestamp(-1, -1)):
        self.mailbox, self.slot = mailbox, slot
        self.last_ts = since
        # Decisions that met a different decision already written: the
        # consensus invariant broken (outside the failure hypothesis).
        self.conflicts = 0

    def _earliest(self, c: Copy) -> Entry | None:
        for e in c.published():
            if e.ts > self.last_ts and e.dflags[self.slot] != NO_DFLAG:
                return e
        return None

    def receive(self) -> Protocol[Delivery]:
        mb, t = self.mailbox, self.mailbox.timing
        copies, clock = mb.copies, mb.clock
        k = 0
        while True:
            if k >= len(copies):
                raise AllCopiesCrashed("every copy of the mailbox has failed")
            try:
                with copies[k].step() as c:
                    m = self._earliest(c)
            except MemoryCrashed:
                k += 1
                yield Until(clock.now() + t.delta_d + t.crash_wait())
                continue
            if m is None:
                yield Until(clock.now() + t.poll)
                continue
            ready = m.ts.time + mb.send_bound + t.epsilon
            if clock.now() >= ready:
                break
            # Waiting: an earlier message may yet appear, and is taken first.
            yield Until(ready)

        decision = yield from self._decide(m.ts, k)
        data = mb.first_data(m.ts) if decision == 1 else None
        yield STEP
        yield from mb.set_dflag(m.ts, self.slot, decision)
        self.last_ts = m.ts
        return Delivery(m.ts, m.sender, decision == 1, data)

    def _decide(self, ts: Timestamp, k: int) -> Protocol[int]:
        mb, t = self.mailbox, self.mailbox.timing
        start, extra, first = mb.clock.now(), 0, BOTTOM
        for i in range(k, len(mb.copies)):
            c = mb.copies[i]
            try:
                with c.step():
                    e = c.find(ts)
                    if e is not None:   # missing only if the sender crashed while writing
                        if e.decision != BOTTOM:
                            if first == BOTTOM:
                                first = e.decision
                            elif e.decision != first:
                                self.conflicts += 1
                        else:
                            if first == BOTTOM:
                                first = e.a_flag
                            e.decision = first
                            c.put(e)
            except MemoryCrashed:
                extra += t.crash_wait()
            yield Until(start + (i - k + 1) * t.delta_d + extra)
        return first if first != BOTTOM else 0
