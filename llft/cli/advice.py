"""Programs known to race outside the locks llft orders, and how to run
them so that their replicas agree (docs/serving.md).  Semi-active
replication replays the order of a program's locks, not of its atomics:
a program whose choices depend on an atomic that another thread changes
unlocked can take another branch at a backup, which then stops as
diverged.  llft-run says so before it starts such a program."""
from __future__ import annotations

from pathlib import Path


def known_race(program: list[str], serialize: bool = False) -> str | None:
    """Advice for program (argv), or None.  Under --serialize the threads
    take turns, which orders their atomics too (docs/determinizer.md)."""
    name, args = Path(program[0]).name, " ".join(program[1:])
    if name == "memcached" and not serialize and not ("no_lru_maintainer" in args and "no_lru_crawler" in args):
        return ("memcached's LRU maintainer and crawler threads decide on item reference counts that "
                "workers change with atomics outside any lock, so a backup can diverge under load; run it "
                "with --serialize, or with -o no_lru_crawler,no_lru_maintainer (docs/serving.md, \"memcached\")")
    if name in ("node", "nodejs", "java") and not serialize:
        return (f"{'Node' if name != 'java' else 'the JVM'}'s own threads (its compilers, garbage collector, "
                "workers) hand work to each other through memory outside any lock, so its backups diverge: "
                "run it with --serialize (docs/determinizer.md)")
    if name == "redis-server" and io_threads(program[1:]) > 1:
        return ("redis's I/O threads and its main thread wait for each other by spinning on atomics a bounded "
                "number of times, so a backup can diverge, with --serialize too (docs/determinizer.md); run it "
                "with io-threads 1")
    return None


def io_threads(args: list[str]) -> int:
    """redis-server's --io-threads N among its arguments (1 if absent)."""
    for flag, value in zip(args, args[1:]):
        if flag == "--io-threads" and value.isdigit():
            return int(value)
    return 1
