"""Timing faults of the replicas on this host: a replica stopped (SIGSTOP,
a debugger; not CRIU's holds) longer than the fault timeout has failed.
A group on one host fences it; a member of a group across hosts steps
down, so that as primary it is replaced."""
from __future__ import annotations

import time
from collections.abc import Iterable

from llft.replica import Replica


def frozen_past(replicas: Iterable[Replica], timeout: float) -> list[tuple[Replica, float]]:
    """The replicas, primary or backup, stopped longer than timeout, each
    with how long it has been (seconds)."""
    now = time.monotonic()
    out = []
    for r in replicas:
        if r.role not in ("primary", "backup"):
            continue
        frozen = r.frozen_for(now)
        if frozen >= timeout:
            out.append((r, frozen))
    return out
