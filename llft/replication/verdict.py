"""llft-run's exit status: how each backup ended against its primary
(backup_end, which a group on one host and a member of a group across
hosts share), and the verdict of a group on this host."""
from __future__ import annotations

import logging

from llft.native import EXIT_DIVERGED
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


log = logging.getLogger("llft.group")


class GroupVerdict:
    """LocalGroup's exit status (llft/replication/group.py)."""

    def _verdict(self, primary: Replica | None) -> int:
        self._check_serial_steals(primary)
        refusal = next(filter(None, (r.refusal() for r in self.replicas)), None)
        if refusal is not None and not self.failed:
            self.failed = refusal
            log.info("%s", self.failed)   # llft-run says it on its stderr
        if self.interrupted is not None:
            # Stopped by a signal: the group did not finish, but a replica it
            # lost on the way is still news, and so is the status.
            return EXIT_DIVERGED if self.lost else 128 + self.interrupted
        if self.failed is not None:
            return 1
        if self.forwarder.error:
            for r in self.replicas:
                if r is not primary:
                    r.problems.append(f"its record stream was cut short: {self.forwarder.error}")
        expected = primary.status if primary else None
        for r in self.replicas:
            if r is primary or r.role == "failed":
                continue
            problem = backup_end(r, expected, primary)
            if problem:
                r.problems.append(problem)
        bad = [r for r in self.replicas if r.problems]
        for r in self.replicas:
            replayed = "" if r is primary else f", replayed {r.stream.records} records"
            log.info("replica %d (%s) exited with status %s%s", r.index, r.role, r.status, replayed)
        if primary is not None:
            log.info("the primary recorded %d records (%d threads)", self.forwarder.records,
                     primary.stream.threads + 1)
        if bad:
            return EXIT_DIVERGED
        return expected if expected is not None else self.replicas[0].status
