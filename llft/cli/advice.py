"""Programs known to race outside the locks llft orders, and how to run
them so that their replicas agree (docs/serving.md).  Semi-active
replication replays the order of a program's locks, not of its atomics:
a program whose choices depend on an atomic that another thread changes
unlocked can take another branch at a backup, which then stops as
diverged.  llft-run runs the programs known to be so by design with
--serialize (their threads take turns, atomics included), says so, and
warns about the others before it starts them."""
from __future__ import annotations

from pathlib import Path


def races_by_design(program: list[str]) -> str | None:
    """Why program (argv), as started, has threads that share memory
    outside any lock llft orders, so that llft-run runs it with --serialize
    unless told not to; or None."""
    name, args = Path(program[0]).name, " ".join(program[1:])
    if name in ("node", "nodejs", "npm", "npx", "java"):   # (npm and npx are Node programs)
        return (f"{'Node' if name != 'java' else 'the JVM'}'s own threads (its compilers, garbage collector, "
                "workers) hand work to each other through memory outside any lock")
    if name == "memcached" and not ("no_lru_maintainer" in args and "no_lru_crawler" in args):
        return ("memcached's LRU maintainer and crawler threads decide on item reference counts that workers "
                "change with atomics outside any lock")
    return None


def known_race(program: list[str], serialize: bool = False) -> str | None:
    """Advice for program (argv) as it is to run, or None."""
    name = Path(program[0]).name
    why = races_by_design(program)
    if why and not serialize:
        return (f"{why}, so a backup can diverge under load: run it with --serialize"
                + (", or with -o no_lru_crawler,no_lru_maintainer" if name == "memcached" else "")
                + " (docs/determinizer.md)")
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
