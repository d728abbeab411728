"""A deterministic harness for the mailbox protocols: many processes on
one virtual time base, each with its own clock offset, interleaved step
by step in an order drawn from a seed, with faults injected between any
two steps (a copy fails, a process dies, a process stalls).  The
protocols run unchanged on real segments; only time and scheduling are
simulated, so a failing seed replays exactly."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from llft.ordering.mailbox.steps import STEP, Clock, Protocol, Until


@dataclass
class Process:
    name: str
    protocol: Protocol
    clock: Clock
    wake: int = 0                 # global time at which it may run again
    steps: int = 0
    done: bool = False
    dead: bool = False
    result: object = None
    error: BaseException | None = None
    started: int = 0              # global time of its first step
    finished: int = -1            # global time it returned
    step_time: Callable[[], int] = field(default=lambda: 0)  # what one step costs

    @property
    def alive(self) -> bool:
        return not (self.done or self.dead)


class Sim:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.now = 0
        self.processes: list[Process] = []
        # Called before every step with the process about to run: a test's
        # fault injection, driven by the run's progress.
        self.before_step: Callable[[Process], None] = lambda p: None

    def clock(self, skew: int = 0) -> Clock:
        return Clock(lambda: self.now, skew)

    def spawn_with(self, name: str, clock: Clock, protocol: Protocol, at: int = 0,
                   step_time: Callable[[], int] | None = None) -> Process:
        p = Process(name, protocol, clock, wake=at)
        if step_time:
            p.step_time = step_time
        self.processes.append(p)
        return p

    def kill(self, p: Process) -> None:
        """p crashes: it takes no further step."""
        p.dead = True

    def run(self, until: int) -> None:
        """Run until every process has returned or died, or global time
        passes `until` (receivers poll for ever)."""
        while True:
            alive = [p for p in self.processes if p.alive]
            if not alive:
                return
            ready = [p for p in alive if p.wake <= self.now]
            if not ready:
                self.now = min(p.wake for p in alive)
                if self.now > until:
                    return
                continue
            p = self.rng.choice(ready)
            self.before_step(p)
            if p.alive:
                self._step(p)

    def _step(self, p: Process) -> None:
        if p.steps == 0:
            p.started = self.now
        p.steps += 1
        try:
            effect = next(p.protocol)
        except StopIteration as done:
            p.done, p.result, p.finished = True, done.value, self.now
            return
        except Exception as e:  # the process fails; the test reads why
            p.done, p.error, p.finished = True, e, self.now
            return
        cost = p.step_time()
        if isinstance(effect, Until):
            # Local time t is global time t − skew.
            p.wake = max(self.now + cost, effect.local_ns - p.clock.skew)
        else:
            assert effect is STEP, effect
            p.wake = self.now + cost
