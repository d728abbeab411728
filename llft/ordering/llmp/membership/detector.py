"""Fault detection across hosts: how long another member has been silent,
as far as this member can tell, and a timer at the moment that silence
reaches a timeout (event-driven, not sampled on a periodic tick).

Silence runs from the last intra-group message heard from the member
(messaging stamps `ep.last_heard`), but never across a time when this
member was not listening: its start-up grace, its own event loop stalled
or the host paused (a 5 ms watchdog timer that runs late, or a check that
does), or datagrams still unread in its socket (the member's Heartbeat may
be among them: the verdict waits until the loop has read them).

The timeout adapts to the platform (LLFT sec. 2: the timeouts are tuned to
the distribution of computation and communication times): a live member
heard again after a silence of s ms shows that silences that long happen
here, and for a while no member is suspected before ADAPT_MARGIN x s (at
most ADAPT_LIMIT x the configured timeout).  On a virtual machine whose
CPUs the hypervisor takes away now and then (measured on the 2-core test
machines: a real-time process sleeping 5 ms woke 20-24 ms late a few times
in 30 s while idle, and live primaries went unheard for 30-50 ms under a
flood), the configured 30 ms alone made backups replace live primaries;
on a quiet host, silences stay short and the configured timeout holds."""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("llft.detector")

STARTUP_GRACE_S = 1.0
LATE_S = 0.010          # a timer this late means this member's event loop was not listening
WATCHDOG_S = 0.005
UNREAD_RECHECK_S = 0.0005
RECHECK_MIN_S = 0.0001
ADAPT_WINDOW_S = 30.0   # a silence counts for one to two of these
ADAPT_MARGIN = 2.0
ADAPT_LIMIT = 8.0       # x the configured timeout


class RecentMax:
    """The largest value noted in the current window or the one before it."""

    def __init__(self, window: float):
        self.window = window
        self.start: float | None = None
        self.current = self.previous = 0.0

    def note(self, value: float, now: float) -> None:
        self._roll(now)
        self.current = max(self.current, value)

    def value(self, now: float) -> float:
        self._roll(now)
        return max(self.current, self.previous)

    def _roll(self, now: float) -> None:
        if self.start is None:
            self.start = now
        elif now - self.start >= self.window:
            self.previous = self.current if now - self.start < 2 * self.window else 0.0
            self.current, self.start = 0.0, now


class Silence:
    def __init__(self, ep, unread: Callable[[], bool], configured: float = 0.0):
        self.ep = ep
        self.unread = unread                     # fn() -> bool: datagrams wait in our socket
        self.configured = configured             # the fault timeout asked for (logs say when silences pass it)
        # A member that just started (its replica catching up, the host busy)
        # suspects nobody for a while.
        self.listening_since = ep.clock.now() + STARTUP_GRACE_S
        self._watched = ep.clock.now()
        ep.clock.call_later(WATCHDOG_S, self._watchdog)
        self.longest = RecentMax(ADAPT_WINDOW_S)   # silences of live members, heard out while listening
        ep.on_long_silence = self._heard_after

    def _heard_after(self, member: int, gap: float) -> None:
        now = self.ep.clock.now()
        if member not in self.ep.view or now - gap < self.listening_since:
            return   # not a member, or we were not listening: it says nothing of the platform
        before = self.longest.value(now)
        self.longest.note(gap, now)
        if gap > 1.25 * before and ADAPT_MARGIN * gap > self.configured:
            log.info("member %d was silent for %.0f ms and is alive: for %.0f s or more no member is "
                     "suspected before %.0f ms of silence (configured: %.0f ms)",
                     member, gap * 1000, ADAPT_WINDOW_S, self.timeout(self.configured) * 1000, self.configured * 1000)

    def timeout(self, configured: float) -> float:
        """The fault timeout to apply now: `configured`, or longer after long silences of live members."""
        adapted = ADAPT_MARGIN * self.longest.value(self.ep.clock.now())
        return max(configured, min(adapted, ADAPT_LIMIT * configured))

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
            # (not less: a delay of a rounding error leaves a simulated clock
            # where it is, and the check would repeat there for ever)
            self.arm(max(nxt, RECHECK_MIN_S))
