"""What the clients were answered, and what a fault tolerant server may
have answered: every acknowledged operation applied exactly once, in
order; the group clock never going back."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClientHistory:
    client: int
    values: list[int] = field(default_factory=list)    # what each acknowledged operation returned
    clock: list[float] = field(default_factory=list)    # the group clock, as read in order
    errors: list[str] = field(default_factory=list)     # a connection lost, an answer never sent


@dataclass
class Verdict:
    acknowledged: int = 0
    lost: int = 0            # operations acknowledged whose effect is missing
    duplicated: int = 0      # operations applied twice (or answered twice)
    clock_back: int = 0      # readings of the group clock earlier than the one before
    disconnected: int = 0    # clients whose connection failed
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.clock_back or self.disconnected or self.problems)

    def add(self, other: "Verdict"):
        """other's counts and problems added to this one's (one group after another)."""
        for name in ("acknowledged", "lost", "duplicated", "clock_back", "disconnected"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems += other.problems


def check(histories: list[ClientHistory], global_count: bool, base: int = 0) -> Verdict:
    """global_count: every client's operations advance one counter the
    server keeps (its answers, together, must be base+1 .. base+N, each
    once); otherwise each client has its own, answered 1, 2, 3 ... in
    order."""
    v = Verdict()
    for h in histories:
        v.acknowledged += len(h.values)
        if h.errors:
            v.disconnected += 1
            v.problems.append(f"client {h.client}: {h.errors[0]}")
        back = sum(1 for a, b in zip(h.clock, h.clock[1:]) if b < a)
        if back:
            v.clock_back += back
            v.problems.append(f"client {h.client}: the group clock went back {back} time(s)")
        if not global_count:
            for k, got in enumerate(h.values, start=1):
                if got != k:
                    if got < k:
                        v.duplicated += 1
                    else:
                        v.lost += got - k
                    v.problems.append(f"client {h.client}: operation {k} answered {got}")
                    break
    if global_count:
        seen = sorted(x for h in histories for x in h.values)
        expected = range(base + 1, base + len(seen) + 1)
        dup = len(seen) - len(set(seen))
        missing = len(set(expected) - set(seen))
        if dup or missing or (seen and seen[-1] != base + len(seen)):
            v.duplicated += dup
            v.lost += missing
            v.problems.append(f"answers are not {base + 1}..{base + len(seen)} each once: {dup} repeated, "
                              f"{missing} missing")
        for h in histories:
            if h.values != sorted(h.values):
                v.problems.append(f"client {h.client}: answers out of order")
    return v
