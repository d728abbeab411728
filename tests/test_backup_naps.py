"""A backup's controller naps after a turn that took clients' requests in
(llft/cluster/priority.py): once per turn, never at a primary, and not
while a membership change is under way.  (Counted, not timed: what a nap
costs is measured in bench/cluster.py.)"""
from __future__ import annotations

import asyncio

from llft.cluster import priority


def turns(naps: priority.BackupNaps, requests_per_turn: list[int]) -> int:
    """Runs event-loop turns taking that many requests each; returns the naps taken."""
    async def run():
        for n in requests_per_turn:
            for _ in range(n):
                naps.took_request()
            await asyncio.sleep(0)     # the turn ends: a nap due runs now
            await asyncio.sleep(0)
        return naps.taken
    return asyncio.run(run())


def test_one_nap_per_turn_that_took_requests():
    assert turns(priority.BackupNaps(lambda: True), [5, 0, 0, 5, 5]) == 3


def test_no_nap_where_it_should_not():
    assert turns(priority.BackupNaps(lambda: False), [5] * 20) == 0, "a primary naps"
    naps = priority.BackupNaps(lambda: True)
    naps.hold_off()
    assert turns(naps, [5] * 20) == 0, "a backup napped during a membership change"
