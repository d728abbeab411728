"""Receive of Protocol 2 (crash and timing failures of up to ⌊(N−1)/2⌋
receivers; §6).  A decision is final only once a majority μ of the
message's receivers took part in it in a copy (nrd ≥ μ), and a receiver
votes only while the message is young (nxp, before T + X): one fast
receiver cannot reject an intact sender's message, and a slow sender's
old timestamp cannot slip in before messages already delivered.

Each message gets its own decision machine, and the receiver keeps
scanning while machines wait on their quorums: receivers that disagree
on which unread message is earliest must not wait on each other (§6.5).
Accepted messages are delivered in timestamp order once T + X + ε has
passed, after which no intact receiver votes for an older one."""
from __future__ import annotations

from typing import Callable, Generator

from llft.ordering.mailbox.config import quorum
from llft.ordering.mailbox.mailbox import Delivery, Mailbox
from llft.ordering.mailbox.segment import BOTTOM, NO_DFLAG, Copy, Entry, MemoryCrashed, Timestamp
from llft.ordering.mailbox.steps import STEP, Protocol, Until


class Receiver2:
    def __init__(self, mailbox: Mailbox, slot: int, entry_time: int = -1):
        self.mailbox, self.slot, self.entry_time = mailbox, slot, entry_time
        self.expiry = mailbox.timing.expiry_for(len(mailbox.copies))
        self.deliver_after = self.expiry + mailbox.timing.epsilon
        self._machines: dict[Timestamp, tuple[Generator, int]] = {}
        self._decided: dict[Timestamp, Delivery] = {}
        self._senders: dict[Timestamp, int] = {}
        self._delivered = Timestamp(-1, -1)
        self._heard: set[Timestamp] = set()   # listened in on, decided
        # Accepted messages older than one already delivered: the ordering
        # invariant broken (outside the failure hypothesis).
        self.order_violations = 0

    def _mine(self, e: Entry) -> bool:
        """Whether this receiver takes part in e: it has a d-flag it has not
        set, or none but the message is from its membership (listen in)."""
        flag = e.dflags[self.slot]
        if flag != NO_DFLAG:
            return flag == BOTTOM
        return e.ts.time >= self.entry_time and self.entry_time >= 0

    def run(self, deliver: Callable[[Delivery], None],
            until: Callable[[], bool] = lambda: False) -> Protocol[None]:
        """Receive until `until()`: scan, advance every machine whose wait is
        over, deliver what is final and in order."""
        mb, t = self.mailbox, self.mailbox.timing
        while not until():
            self._scan()
            yield STEP
            yield from self._advance()
            self._deliver_ready(deliver)
            yield Until(mb.clock.now() + (t.rho or t.poll))

    def _scan(self) -> None:
        """Start a machine for each new message of the first intact copy,
        and remove from every copy what every receiver is done with and is
        past its removal time."""
        first = True
        for c in self.mailbox.copies:
            try:
                with c.step():
                    present = set()
                    for e in c.published():
                        present.add(e.ts)
                        if (first and e.ts not in self._senders and e.ts not in self._heard
                                and self._mine(e)):
                            self._senders[e.ts] = e.sender
                            self._machines[e.ts] = (self._decide(e.ts), 0)
                        else:
                            self.mailbox.collect(c, e)
                    if first:
                        self._heard &= present
            except MemoryCrashed:
                continue
            first = False

    def _advance(self) -> Protocol[None]:
        clock = self.mailbox.clock
        for ts in sorted(self._machines):
            machine, wake = self._machines[ts]
            while clock.now() >= wake:
                try:
                    effect = next(machine)
                except StopIteration as done:
                    self._decided[ts] = done.value
                    del self._machines[ts]
                    break
                if isinstance(effect, Until):
                    wake = effect.local_ns
                    self._machines[ts] = (machine, wake)
                else:
                    yield STEP

    def _deliver_ready(self, deliver: Callable[[Delivery], None]) -> None:
        now = self.mailbox.clock.now()
        for ts in sorted(self._senders):
            d = self._decided.get(ts)
            if d is None or now < ts.time + self.deliver_after:
                return
            del self._senders[ts], self._decided[ts]
            if not d.accepted:
                deliver(d)          # a reject orders nothing
            elif ts > self._delivered:
                self._delivered = ts
                deliver(d)
            else:
                self.order_violations += 1

    def _decide(self, ts: Timestamp) -> Protocol[Delivery]:
        mb, t = self.mailbox, self.mailbox.timing
        yield Until(ts.time + mb.send_bound + t.epsilon + t.rho)
        first, listening, sender = BOTTOM, False, self._senders[ts]
        for c in mb.copies:
            try:
                value = yield from self._decide_in(c, ts, first)
            except MemoryCrashed:
                continue
            if value is None:
                continue
            if value == NO_DFLAG:
                listening = True
                continue
            first = value
        if listening and first == BOTTOM:
            first = yield from self._listen(ts)
        decision = first if first != BOTTOM else 0
        data = mb.first_data(ts) if decision == 1 else None
        yield STEP
        if listening:
            self._heard.add(ts)
        else:
            yield from mb.set_dflag(ts, self.slot, decision)
        return Delivery(ts, sender, decision == 1, data)

    def _decide_in(self, c: Copy, ts: Timestamp, first: int) -> Protocol[int | None]:
        """One copy's part of the decision; None if the copy lacks the
        message, NO_DFLAG if this receiver has no vote on it."""
        mb, t = self.mailbox, self.mailbox.timing
        with c.step():
            e = c.find(ts)
            if e is None:
                return None
            if e.dflags[self.slot] == NO_DFLAG:
                return NO_DFLAG
            mu = quorum(e.dflag_count())
            if first != BOTTOM and e.decision == BOTTOM:
                e.decision = first
                c.put(e)
            undecided = e.decision == BOTTOM
        yield STEP
        if undecided:
            with c.step():
                e = c.find(ts)
                if e is None:
                    return None
                if mb.clock.now() < ts.time + self.expiry:
                    e.nxp += 1
                    c.put(e)
            # Every intact receiver votes within ε of this one.
            yield Until(mb.clock.now() + t.epsilon)
            with c.step():
                e = c.find(ts)
                if e is None:
                    return None
                if e.nxp >= mu and e.local_decision < e.a_flag and e.nrd < mu:
                    e.local_decision = e.a_flag
                    c.put(e)
            yield STEP
        with c.step():
            e = c.find(ts)
            if e is None:
                return None
            e.nrd += 1
            c.put(e)
        while True:
            yield STEP
            with c.step():
                e = c.find(ts)
                if e is None:
                    return None
                if e.nrd >= mu:
                    if e.decision == BOTTOM:
                        e.decision = e.local_decision
                        c.put(e)
                    return e.decision
            yield Until(mb.clock.now() + t.poll)

    def _listen(self, ts: Timestamp) -> Protocol[int]:
        """Listen in on a message that has no d-flag for this receiver: in
        each intact copy wait for its decision, touching nothing; the last
        one counts."""
        mb, first = self.mailbox, BOTTOM
        for c in mb.copies:
            while True:
                try:
                    with c.step():
                        e = c.find(ts)
                        decided = None if e is None else e.decision
                except MemoryCrashed:
                    break
                if decided is None:
                    break
                if decided != BOTTOM:
                    first = decided
                    break
                yield Until(mb.clock.now() + mb.timing.poll)
        return first
