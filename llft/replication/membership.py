"""The group's membership on this host, as the replication sees it: ranks,
the successor of a failed primary, and what a failover and a lost backup
change (LLFT's leader-determined membership, with the controller as the
one observer of every replica's end: llft/replica.py's pidfds)."""
from __future__ import annotations

import logging
import time

from llft.determinizer.streams import PrimarySource
from llft.replica import Replica
from llft.serving.plane_relay import PlaneRelay

log = logging.getLogger("llft.group")

# How long a failover waits for the forwarder to write PROMOTE before it
# goes on (a successor still catching up with --respawn takes longer).
PROMOTE_WAIT_S = 0.05


class GroupMembership:
    """LocalGroup's view changes (llft/replication/group.py holds the state
    they change: replicas, relays, sinks, the forwarder, the gateway)."""

    def ranks(self) -> dict[int, int]:
        """LLFT's ranks: the primary 1, then the live backups in precedence
        order.  A replica's precedence is its index, never reused."""
        live = [r for r in self.replicas if r.role == "primary"]
        live += [r for r in self.replicas if r.role == "backup" and r.alive()]
        return {r.index: rank for rank, r in enumerate(live, 1)}

    def _successor(self) -> Replica | None:
        """The backup that takes over: the live one of lowest rank (replicas
        are listed in join order, and a replacement joins last)."""
        return next((r for r in self.replicas if r.role == "backup" and r.alive()), None)

    def _fail_over(self, failed: Replica, new: Replica):
        """LLFT's primary change on one host: new replays the failed primary's
        stream to its end (the virtual synchrony point), then records; the
        other backups follow new's records; clients keep their connections."""
        log.warning("replica %d (primary) failed (status %s); replica %d takes over", failed.index,
                    failed.status, new.index)
        self.failovers.append({"failed": failed.index, "successor": new.index,
                               "fenced": failed.fenced_at, "detected": time.monotonic()})
        failed.role = "failed"
        new.role = "primary"
        if self.forked is not None:
            self.forked.fail_over(failed, new)
        new_source = PrimarySource(new.stream)
        promoted = self.forwarder.fail_over(new_source, self.sinks[new.index])
        self.source.finish()
        # The forwarder, which finish() woke, carries the PROMOTE: this thread
        # lets go of the GIL until it has.  (It gave it up for a moment only,
        # and its state file and logging then held the forwarder back for a
        # millisecond or more in half the view changes.)
        promoted.wait(PROMOTE_WAIT_S)
        self.source = new_source
        self.outgoing.promote(new)
        if self.gateway is not None:
            self.gateway.promote(self._relay_of(new))
            self.gateway.remove_relay(self._relay_of(failed))
        self.write_state("running")

    def _relay_of(self, r: Replica) -> PlaneRelay:
        return self.relays[self.replicas.index(r)]

    def _backup_failed(self, r: Replica, why: str):
        log.warning("replica %d (backup) %s; removed from the group", r.index, why)
        r.role = "failed"
        self.follow.forget(r.index)
        self.sinks[r.index].dead = True
        if self.forked is not None:
            self.forked.backup_failed(r.index)
        self.ordering.remove(self.sinks[r.index], crashed=True)
        if self.gateway is not None:
            self.gateway.remove_relay(self._relay_of(r))
        self.write_state("running")

    def _backup_lost(self, r: Replica):
        """A backup stopped while its primary runs: it diverged, or its
        stream broke.  Said at once, on llft-run's stderr and in the log,
        with the diagnostic kept in the run dir whatever the program did
        with its stderr; the run's exit status will say so too."""
        what = self._report_lost(r, "backup")
        self._backup_failed(r, "diverged")
        shared = self.forked.shared_memory if self.forked is not None else None
        if shared:
            # Its processes read each other's writes in memory llft does not order.
            self.failed = (f"cannot replicate the program: its processes share memory ({shared}), which llft does "
                           f"not order, and a backup diverged (replica {r.index}: {what})")
            log.info("%s; stopping the group", self.failed)
            self.stop()

    def _successor_lost(self, r: Replica):
        """A successor ended before it took over, still replaying its
        predecessor's records: it failed as a backup does (it diverged,
        most likely), and another backup takes over in its place."""
        self._report_lost(r, "taking over")

    def _report_lost(self, r: Replica, role: str) -> str:
        """Says why replica r left the group, at once (llft-run's stderr,
        the log, and the report kept in its dir whatever the program did
        with its stderr); the run's exit status will say so too."""
        what, report = r.report_divergence()
        left = sum(1 for x in self.replicas if x.role in ("primary", "backup") and x is not r and x.alive())
        log.error("replica %d (%s) diverged from the primary and left the group: %s.  %d replica%s left%s.  "
                  "The report is in %s.  %s", r.index, role, what, left, "" if left == 1 else "s",
                  ": no backup to fail over to" if left <= (1 if role == "backup" else 0) else "", report,
                  r.divergence_advice())
        self.lost.append(f"replica {r.index} diverged: {what}")
        r.problems.append(what)
        return what

    def _primary_stopped(self, primary: Replica | None):
        """While the group stops: once the primary has exited, its backups
        are told its end, and exit as it did rather than wait for it."""
        if primary is not None and not primary.alive() and not self.source.finished():
            self.source.finish(primary.status)
