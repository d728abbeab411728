"""How a backup ended, against its primary: the exit verdict's part that
a group on one host and a member of a group across hosts share."""
from __future__ import annotations

from llft.replica import Replica
from llft.stdout_check import stdout_problem


def backup_end(r: Replica, expected: int | None, primary: Replica | None = None) -> str | None:
    """Why backup r's end is not its primary's, or None: its stream's
    divergence or its exit status against expected, the primary's (None
    if unknown: Replica.end_problem), and, when the primary's replica is
    on this host, a stdout other than the primary's."""
    problem = r.end_problem(expected)
    if problem is None and primary is not None and expected is not None and r.status == expected \
            and not r.stream.stopped_for_good:
        differs = stdout_problem(primary.out_dir / "stdout", r.out_dir / "stdout")
        if differs:
            problem = f"{differs}; {r.divergence_advice()}"
    return problem
