"""Programs known to race outside the locks llft orders, and how to run
them so that their replicas agree (docs/serving.md).  Semi-active
replication replays the order of a program's locks, not of its atomics:
a program whose choices depend on an atomic that another thread changes
unlocked can take another branch at a backup, which then stops as
diverged.  llft-run says so before it starts such a program."""
from __future__ import annotations

from pathlib import Path


def known_race(program: list[str]) -> str | None:
    """Advice for program (argv), or None."""
    name, args = Path(program[0]).name, " ".join(program[1:])
    if name == "memcached" and not ("no_lru_maintainer" in args and "no_lru_crawler" in args):
        return ("memcached's LRU maintainer and crawler threads decide on item reference counts that "
                "workers change with atomics outside any lock, so a backup can diverge under load; run it "
                "with -o no_lru_crawler,no_lru_maintainer (docs/serving.md, \"memcached\")")
    return None
