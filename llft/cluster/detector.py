"""Fault detection across hosts: how long another member has been silent,
as far as this member can tell, and a timer at the moment that silence
reaches a timeout (event-driven, not sampled on a periodic tick).

Silence runs from the last intra-group message heard from the member
(messaging stamps `ep.last_heard`), but never across a time when this
member was not listening: its start-up grace, its own event loop stalled
or the host paused (a 5 ms watchdog timer that runs late, or a check that
does), or datagrams still unread in its socket (the member's Heartbeat may
be among them: the verdict waits until the loop has read them)."""
from __future__ import annotations

from typing import Callable

STARTUP_GRACE_S = 1.0
LATE_S = 0.010          # a timer this late means this member's event loop was not listening
WATCHDOG_S = 0.005
UNREAD_RECHECK_S = 0.0005


class Silence:
    def __init__(self, ep, unread: Callable[[], bool]):
        self.ep = ep
        self.unread = unread                     # fn() -> bool: datagrams wait in our socket
        # A member that just started (its replica catching up, the host busy)
        # suspects nobody for a while.
        self.listening_since = ep.clock.now() + STARTUP_GRACE_S
        self._watched = ep.clock.now()
        ep.clock.call_later(WATCHDOG_S, self._watchdog)

    def _watchdog(self) -> None:
        """Our own loop (or the whole host) stalled: a peer's silence then
        says nothing, even if it began before our check was due."""
        if self.ep.closed:
            return
        now = self.ep.clock.now()
        if now - self._watched > WATCHDOG_S + LATE_S:
            self.not_listening()
        self._watched = now
        self.ep.clock.call_later(WATCHDOG_S, self._watchdog)

    def not_listening(self) -> None:
        """This member was not listening until now: silence before now says nothing."""
        self.listening_since = max(self.listening_since, self.ep.clock.now())

    def of(self, member: int, since: float = 0.0) -> float:
        """Seconds of silence from member, counted from `since` at the earliest."""
        now = self.ep.clock.now()
        return now - max(self.ep.last_heard.get(member, 0.0), since, self.listening_since)


class Deadline:
    """Calls check() when due; check returns the delay until the next check,
    or None to stop.  A check that would run while datagrams wait unread, or
    that runs late (the loop was busy), is put off: a verdict needs what has
    arrived."""

    def __init__(self, silence: Silence, check: Callable[[], float | None]):
        self.silence, self.check = silence, check
        self.timer = None
        self.due = 0.0

    def arm(self, delay: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        clock = self.silence.ep.clock
        self.due = clock.now() + max(0.0, delay)
        self.timer = clock.call_later(max(0.0, delay), self._fire)

    @property
    def armed(self) -> bool:
        return self.timer is not None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        self.timer = None
        s = self.silence
        if s.ep.closed:
            return
        if s.ep.clock.now() - self.due > LATE_S:
            s.not_listening()
        if s.unread():
            self.arm(UNREAD_RECHECK_S)
            return
        nxt = self.check()
        if nxt is not None:
            self.arm(nxt)
