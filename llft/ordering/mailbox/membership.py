"""Joins, Leaves and crash reports (§5.4, §8).  A receiver's entry and
exit times are set a Join's (or Leave's) duration plus ε ahead, so that
by then the change is in every copy: a sender gives a receiver a d-flag
iff entry ≤ ts < exit.  A receiver reported crashed gets no more d-flags,
and its unset ones are set to 0 (reject), so the messages it held up can
be removed."""
from __future__ import annotations

from llft.ordering.mailbox.mailbox import AllCopiesCrashed, Mailbox
from llft.ordering.mailbox.segment import (BOTTOM, NEVER, R_ACTIVE, R_CRASHED, R_FREE, R_LEFT, Copy,
                                           MemoryCrashed, Receiver)
from llft.ordering.mailbox.steps import Protocol


def _free_slot(mb: Mailbox) -> int:
    """A receiver slot free in the first intact copy.  Joins are one at a
    time (the mailbox server's), so it is free in every copy."""
    for c in mb.copies:
        try:
            with c.step():
                for r in c.receivers():
                    if r.state == R_FREE:
                        return r.slot
                raise ValueError(f"the mailbox's {c.layout.receivers} receiver slots are all taken")
        except MemoryCrashed:
            continue
    raise AllCopiesCrashed("every copy of the mailbox has failed")


def join(mb: Mailbox) -> Protocol[tuple[int, int]]:
    """Add this process as a receiver: (its slot, its entry time)."""
    t = mb.timing
    slot = _free_slot(mb)
    entry = mb.clock.now() + t.delta_j + t.epsilon
    yield from mb.in_every_copy(lambda c: c.set_receiver(Receiver(slot, R_ACTIVE, mb.pid, entry, NEVER)))
    return slot, entry


def leave(mb: Mailbox, slot: int) -> Protocol[int]:
    """Set this receiver's exit time in every copy: its exit time.  It
    must go on receiving the messages with a d-flag for it (those before
    the exit) before it disconnects (`disconnect`)."""
    t = mb.timing
    exit_time = mb.clock.now() + t.delta_l + t.epsilon

    def set_exit(c: Copy) -> None:
        r = c.receiver(slot)
        r.exit = exit_time
        c.set_receiver(r)
    yield from mb.in_every_copy(set_exit)
    return exit_time


def disconnect(mb: Mailbox, slot: int) -> Protocol[None]:
    return _retire(mb, slot, R_LEFT)


def report_crash(mb: Mailbox, slot: int) -> Protocol[None]:
    """The membership service says this receiver crashed: senders stop
    giving it d-flags, and its unset ones become 0 (§5.4)."""
    return _retire(mb, slot, R_CRASHED)


def _retire(mb: Mailbox, slot: int, state: int) -> Protocol[None]:
    def retire(c: Copy) -> None:
        r = c.receiver(slot)
        r.state = state
        c.set_receiver(r)
        for e in c.published():
            if e.dflags[slot] == BOTTOM:
                e.dflags[slot] = 0
                c.put(e)
            mb.collect(c, e)
    yield from mb.in_every_copy(retire)
