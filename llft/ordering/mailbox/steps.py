"""The protocols are written as generators of their waits, so that one
text runs against the real clock (`run`) and under the deterministic
harness (sim.py), which interleaves many processes step by step and
injects faults between steps.

A protocol generator yields STEP between two atomic steps (a point where
another process may run, a copy may crash or this process may die) and
Until(t) to wait until its local clock reads t or later."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Generator, TypeVar

T = TypeVar("T")


class _Step:
    def __repr__(self) -> str:
        return "STEP"


STEP = _Step()


@dataclass(frozen=True)
class Until:
    local_ns: int


Protocol = Generator[object, None, T]


class Clock:
    """A process's local clock: a shared time base plus this process's
    offset, strictly increasing (§2.2: successive readings differ).  An
    offset beyond ε/2 makes the process timing-faulty."""

    def __init__(self, base: Callable[[], int] = time.monotonic_ns, skew: int = 0):
        self._base, self.skew, self._last = base, skew, 0

    def now(self) -> int:
        t = self._base() + self.skew
        self._last = t if t > self._last else self._last + 1
        return self._last


class Stopped(Exception):
    """run() was told to stop the protocol at one of its waits."""


def run(protocol: Protocol[T], clock: Clock, stop: Callable[[], bool] | None = None) -> T:
    """Run a protocol generator against the real clock; with stop, raise
    Stopped at the first wait at which stop() holds."""
    try:
        effect = next(protocol)
        while True:
            if isinstance(effect, Until):
                if stop is not None and stop():
                    protocol.close()
                    raise Stopped()
                wait = effect.local_ns - clock.now()
                if wait > 0:
                    time.sleep(wait / 1e9)
            effect = protocol.send(None)
    except StopIteration as done:
        return done.value
