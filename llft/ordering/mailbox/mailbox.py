"""A process's handle on a mailbox: the copies in the one order every
process visits them (§4.2), its timing, its pid and clock, and Send
(§5.1), which both protocols share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llft.ordering.mailbox.config import Timing
from llft.ordering.mailbox.segment import (BOTTOM, NO_DFLAG, Copy, Entry, MemoryCrashed,
                                           Timestamp)
from llft.ordering.mailbox.steps import STEP, Clock, Protocol


class AllCopiesCrashed(Exception):
    """Every copy has failed: outside the failure hypothesis (n > f)."""


@dataclass(frozen=True)
class Delivery:
    ts: Timestamp
    sender: int
    accepted: bool
    data: bytes | None


class Mailbox:
    def __init__(self, copies: list[Copy], timing: Timing, pid: int, clock: Clock):
        self.copies, self.timing, self.pid, self.clock = copies, timing, pid, clock
        self.protocol = copies[0].protocol
        self.send_bound = timing.send_bound(len(copies))
        self.receive_bound = timing.receive_bound(len(copies), self.protocol)

    def send(self, data: bytes, ts: Timestamp | None = None) -> Protocol[Timestamp]:
        """Write the message into every intact copy, then set its a-flag in
        every intact copy: a receiver that sees the a-flag knows every
        intact copy holds the message.  ts: when the Send started, if
        before this call (the clock is read here otherwise)."""
        ts = ts or Timestamp(self.clock.now(), self.pid)

        def write(c: Copy) -> None:
            c.insert(self.pid, ts, data, [BOTTOM if r.eligible(ts) else NO_DFLAG for r in c.receivers()])

        def available(c: Copy) -> None:
            e = c.find(ts)
            if e is not None:
                e.a_flag = 1
                c.put(e)
        yield from self.in_every_copy(write)
        yield from self.in_every_copy(available)
        return ts

    def in_every_copy(self, change: Callable[[Copy], None]) -> Protocol[None]:
        """change(copy) as one atomic step on each intact copy, in the
        copies' order, with a scheduling point after each."""
        for c in self.copies:
            try:
                with c.step():
                    change(c)
            except MemoryCrashed:
                pass
            yield STEP

    def first_data(self, ts: Timestamp) -> bytes:
        """The message's data, read from the first intact copy."""
        for c in self.copies:
            try:
                with c.step():
                    e = c.find(ts)
                    if e is not None:
                        return c.data(e)
            except MemoryCrashed:
                continue
        raise AllCopiesCrashed(f"no intact copy holds the message {ts}")

    def removal_time(self, ts: Timestamp) -> int:
        """The earliest a message may leave the queue: under Protocol 2 a
        receiver without a d-flag may be listening in until T + Δs + Δr + 2ε
        (§8)."""
        if self.protocol == 1:
            return 0
        return ts.time + self.send_bound + self.receive_bound + 2 * self.timing.epsilon

    def set_dflag(self, ts: Timestamp, slot: int, decision: int) -> Protocol[None]:
        """Set this receiver's d-flag in every intact copy, removing the
        message from a copy where every d-flag is then set (check and
        remove in one step)."""
        def done(c: Copy) -> None:
            e = c.find(ts)
            if e is not None:
                e.dflags[slot] = decision
                c.put(e)
                self.collect(c, e)
        yield from self.in_every_copy(done)

    def collect(self, c: Copy, e: Entry) -> bool:
        """Inside a step on c: remove e if every receiver is done with it."""
        if BOTTOM in e.dflags or self.clock.now() < self.removal_time(e.ts):
            return False
        c.remove(e)
        return True
