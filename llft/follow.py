"""Whether each backup still follows its primary.

A backup that has records to replay and has replayed none for a while no
longer follows: the group cannot fail over to it, and says so before the
primary dies rather than after.  (A backup that merely lags still
replays; one frozen by a signal is fenced after the fault timeout
instead.)"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("llft.follow")

STALL_S = 5.0   # default bound: no record replayed this long while some wait is a stall


@dataclass
class Following:
    replayed: int = -1
    since: float = 0.0        # when replayed last changed
    behind: int = 0           # records given to it and not replayed
    stalled: bool = False


class FollowWatch:
    def __init__(self, stall_s: float = STALL_S):
        self.stall_s = stall_s
        self.backups: dict[int, Following] = {}

    def check(self, index: int, given: int, replayed: int, now: float | None = None) -> str | None:
        """Notes backup index's progress: given records written into its
        ring so far, replayed of them.  Returns "stalled" when it has just
        stopped following, "moving" when it has just started again, else
        None."""
        now = time.monotonic() if now is None else now
        f = self.backups.setdefault(index, Following(since=now))
        if replayed != f.replayed:
            f.replayed, f.since = replayed, now
        f.behind = max(0, given - replayed)
        stalled = f.behind > 0 and now - f.since >= self.stall_s
        change = None
        if stalled != f.stalled:
            change = "stalled" if stalled else "moving"
        f.stalled = stalled
        return change

    def note(self, index: int, given: int, replayed: int, where: Callable[[], str] | None = None):
        """check(), and says a change in the log: where() names where the
        threads were when a backup stopped following (a snapshot file)."""
        change = self.check(index, given, replayed)
        if change == "stalled":
            at = f" (where its threads and the primary's were: {where()})" if where else ""
            log.error("replica %d (backup) %s%s", index, self.describe(index), at)
        elif change == "moving":
            log.warning("replica %d (backup) replays again: it follows the primary", index)

    def forget(self, index: int):
        self.backups.pop(index, None)

    def view(self, index: int, now: float | None = None) -> dict | None:
        """For the state file and llft-status."""
        f = self.backups.get(index)
        if f is None:
            return None
        now = time.monotonic() if now is None else now
        return {"behind": f.behind, "still_s": round(now - f.since, 1), "stalled": f.stalled}

    def describe(self, index: int) -> str:
        f = self.backups[index]
        return (f"has replayed no record for {time.monotonic() - f.since:.0f} s while {f.behind} wait: it no "
                f"longer follows the primary, and the group cannot fail over to it")
