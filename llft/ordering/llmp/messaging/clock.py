"""Time and timers, so the same protocol code runs on a real event loop and
under the simulated network with a virtual clock."""
from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any, Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer: ...


class LoopClock:
    """A clock backed by an asyncio (or uvloop) event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_event_loop()

    def now(self) -> float:
        return self.loop.time()

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self.loop.call_later(delay, fn, *args)


class _SimTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimClock:
    """Virtual time: events run in (time, insertion) order, instantly."""

    def __init__(self) -> None:
        self._t = 0.0
        self._heap: list = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._t

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        timer = _SimTimer()
        heapq.heappush(self._heap, (self._t + max(0.0, delay), next(self._seq), timer, fn, args))
        return timer

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> bool:
        """Run events up to virtual time t; return True if `stop()` became true."""
        heap = self._heap
        while heap and heap[0][0] <= t:
            when, _, timer, fn, args = heapq.heappop(heap)
            if timer.cancelled:
                continue
            self._t = when
            fn(*args)
            if stop is not None and stop():
                return True
        self._t = max(self._t, t)
        return False
