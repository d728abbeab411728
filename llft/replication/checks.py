"""What the group on this host watches while it serves, once per turn of
its loop: timing faults (fencing), backups that stop following, backups
of forked processes that diverged, --serialize's steals, and replicas
that did what llft cannot replicate."""
from __future__ import annotations

import functools
import itertools
import logging
import signal
import time

from llft.replica import Replica
from llft.replication.faults import frozen_past
from llft.thread_snapshot import keep_stall_snapshot

log = logging.getLogger("llft.group")


class GroupChecks:
    """LocalGroup's checks (llft/replication/group.py)."""

    def _check_following(self):
        for r in self.replicas:
            sink = self.sinks.get(r.index)
            if r.role != "backup" or sink is None or sink.dead or not r.alive():
                continue
            self.follow.note(r.index, sink.delivered, r.stream.records, functools.partial(self._stall_snapshot, r))

    def _stall_snapshot(self, r: Replica) -> str:
        """Where a backup that stopped following and its primary are: the
        file that keeps their threads' stacks."""
        primary = next((p for p in self.replicas if p.role == "primary"), None)
        return keep_stall_snapshot(r.out_dir / "stall-threads.txt", {
            f"replica {r.index} (backup)": r.pid,
            f"replica {primary.index} (primary)" if primary else "primary": primary and primary.pid})

    def _check_frozen(self):
        """Timing faults: a replica stopped longer than the fault timeout is
        fenced (SIGKILL), so that it can never act in the view that replaced
        it; a primary's death then makes a backup take over, and a frozen
        backup no longer holds the primary back.  With --respawn a new
        replica takes the fenced one's place: it never serves in the old view."""
        for r, frozen in frozen_past(self.replicas, self.opts.fault_timeout):
            log.warning("replica %d (%s) has been frozen for %.0f ms: fenced (SIGKILL)", r.index, r.role,
                        frozen * 1000)
            r.fenced_at = time.monotonic()
            r.signal(signal.SIGKILL)
            if r.role == "backup":
                self._backup_failed(r, "was fenced")

    def _check_forked_divergence(self):
        """--fork replicate: a backup one of whose processes diverged is
        lost, as if the backup itself had (its other processes are ended)."""
        for index, streams in self.forked.diverged_backups().items():
            r = self.replica_at(index)
            if r is None or r.role != "backup":
                continue
            r.forked_streams = streams
            r.signal(signal.SIGKILL)
            self._backup_lost(r)

    def _prune_routes(self):
        """--fork replicate: the routes of the connections every live
        backup has been handed are no longer needed, but for those the
        input log keeps (--respawn): a replacement is handed each again."""
        below = [rl.handed_below() for r, rl in zip(self.replicas, self.relays) if r.role == "backup" and r.alive()]
        if below and self.inputs is not None:
            below.append(self.inputs.oldest())
        if below:
            self.routes.prune(min(below))

    def _check_serial_steals(self, primary: Replica | None):
        """Under --serialize, said once: a thread ran on without a call that
        gives up its turn, and another ran beside it (native/serialize.c)."""
        if primary is None or not self.opts.serialize or self.steals_said:
            return
        steals = primary.stream.serial_steals
        if steals:
            self.steals_said = True
            log.warning("under --serialize, a thread of the program kept its turn while others waited for it "
                        "(asleep 10 ms in a wait llft does not see, or spinning on memory for 500 ms of CPU "
                        "time), and another was let run beside it, %d time%s so far (llft-status counts "
                        "them): the threads race there, and a backup may diverge", steals, "" if steals == 1 else "s")

    def _check_unreplicable(self) -> bool:
        """A replica whose process did what llft cannot replicate (a forked
        child reaching a client: the shim says so in the control block), or
        that holds a real port (llft/native_sockets.py): the group stops, as
        nothing may be served unreplicated."""
        forked = self.forked.refusal() if self.forked is not None else None
        for why in itertools.chain([forked], (r.unreplicable() for r in self.replicas)):
            if why:
                self.failed = why
                log.info("%s; stopping the group", self.failed)   # llft-run says it on its stderr
                self.stop()
                return True
        return False
