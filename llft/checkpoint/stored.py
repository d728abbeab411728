"""A stored checkpoint: a clone of a live backup (llft/checkpoint/clone.py)
whose restore waits until a replacement is needed and no backup lives to
be cloned then (a group of two whose backup or primary failed).  With it
the group's history is bounded: what precedes the checkpoint is dropped
(LLFT §IV-C: a new backup is the checkpoint plus the log after it).

`llft-run --keep N --checkpoint-every S` takes one every S seconds from a
live backup, as a clone is taken, and keeps it whole:

- the image (in /dev/shm, or --checkpoint-dir), listed for its check;
- the ring as the backup's was then, which does not join the ordering
  backend: the records sent since stay in the saved stream, from the
  position the ring copy was made at;
- the data plane's slot, parked (native/dataplane.h, llft_dp_park): the
  sockets the restore will give the program stay open here, with what the
  backup had not read in them; the plane writes them nothing more and
  holds no client back for them, and notes how much of each client's
  input they were given;
- the connections the backup had not been handed yet, and the newest
  connection then.

Once one is stored, the previous one is dropped, the saved stream keeps
only what follows the new ring copy, and the input logs of the
connections done before it are deleted: what a member keeps stays flat
however long the group runs (the input logs of connections that stay open
excepted).  A group that needs its history from the start (a replacement
replaying it, --respawn without CRIU) has it only until the first
checkpoint.

When restored (wake), it becomes a new replica, with the next index: the
plane wakes its slot (each parked socket is fed the logged input from
where it stopped, each connection opened since its whole log), its relay
hands over the connections it was not handed, in order, and its ring is
fed the saved stream from its position, then joins the backend, as a
replica replaying the history does."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time

from llft import private_files
from llft.checkpoint.clone import CLONE_ERRORS, BackupClone, CloneFailed
from llft.determinizer.catchup import CatchUpFeeder
from llft.determinizer.streams import BackupSink, SavedStreamWriter
from llft.replica import RestoredReplica

log = logging.getLogger("llft.checkpoint")

NUMBER_BASE = 1000   # stored checkpoints are numbered apart from replicas until one is restored


class StoredCheckpoint:
    def __init__(self, clone: BackupClone, parked_after: int, dump_s: float):
        self.clone = clone
        self.parked_after = parked_after     # the last connection id when its plane slot was parked
        self.history_at = clone.history_at   # where its records continue in the saved stream
        self.figures = dict(clone.figures(dump_s, 0.0), stored=True)

    @classmethod
    async def take(cls, group, src, number: int) -> "StoredCheckpoint":
        """A checkpoint of backup src, stored; CloneAgain or CloneFailed if
        it cannot be taken (nothing left behind)."""
        c = BackupClone(group, src, NUMBER_BASE + number, store=True)
        started = time.monotonic()
        try:
            await c.take()
            parked_after = group.plane.park(c.slot)
        except CLONE_ERRORS as e:
            c.close_inherited()
            c.keep_logs()
            c.give_up(e)
        c.keep_logs(drop_images=False)
        return cls(c, parked_after, time.monotonic() - started)

    def state(self) -> dict:
        """What llft-status shows of it."""
        return {"source": self.figures["source"], "at": self.figures["at"], "frozen_ms": self.figures["frozen_ms"],
                "image_bytes": self.figures["image_bytes"], "after_connection": self.parked_after}

    async def wake(self, group, k: int) -> RestoredReplica:
        """Restores it as replica k, which catches up from the saved stream;
        CloneFailed (and it is dropped) if it cannot be."""
        c, g = self.clone, group
        r = c.clone
        self._renumber(k)
        log_dir = r.out_dir / "output" if g.opts.log_output else None
        # (no await from the plane's wake to the relay's list: a connection
        # opened in between would be in neither)
        g.plane.wake(c.slot, log_dir)
        g.gateway.add_clone_relay(c.relay, c.unhanded + [(x.conn_id, x.port, x.host, x.client_port)
                                                         for x in g.inputs.connections(c.frozen_last_id)])
        delivered = c.sink.delivered
        c.sink = BackupSink(k, r.stream, r.alive)
        c.sink.delivered = delivered
        started = time.monotonic()
        try:
            pid, proc = await asyncio.to_thread(c.restore)
        except CLONE_ERRORS as e:
            c.close_inherited()
            c.keep_logs()
            c.give_up(e)
        finally:
            c.close_inherited()
        c.keep_logs()
        self.figures["restore_ms"] = round((time.monotonic() - started) * 1000, 1)
        c.adopt(pid, proc, self.figures)
        r.catch_up = {"records": None, "ms": None, "done": False}
        feeder = g.feeders[k] = CatchUpFeeder(g.forwarder, c.sink, start=self.history_at, records=delivered)
        feeder.start()
        log.warning("replica %d (backup) restored from the checkpoint of replica %d taken %.1f s ago: pid %d; "
                    "image %d KiB, restored in %.0f ms; catching up", k, self.figures["source"],
                    time.time() - self.figures["at"], pid, self.figures["image_bytes"] // 1024,
                    self.figures["restore_ms"])
        return r

    def _renumber(self, k: int):
        """The stored replica becomes replica k: a replica's index is its
        precedence, and one restored joins last."""
        c = self.clone
        r = c.clone
        out_dir = c.g.run_dir / f"replica-{k}"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(r.out_dir, out_dir)
        r.index = r.channel.index = c.k = k
        r.out_dir = out_dir
        r.stream.ctl.replica = k
        if r.private_files:
            c.files_plan = private_files.plan_text(private_files.plan(r.files_dir))

    def drop(self):
        """A newer one replaces it, or the group ends: nothing of it stays
        but CRIU's logs."""
        c = self.clone
        c.close_inherited()
        c.undo()
        c.keep_logs()
        shutil.rmtree(c.logs / "replica", ignore_errors=True)


def trim_history(group, stored: StoredCheckpoint):
    """What precedes the stored checkpoint goes: the saved stream's
    records before its ring copy, the input logs and the gateway's list of
    the connections done before it."""
    fwd = group.forwarder
    with fwd.lock:
        fwd.saver.keep_from(stored.history_at)
    stored.history_at = SavedStreamWriter.HEADER
    group.plane.forget_through(stored.parked_after)
    group.inputs.forget_through(stored.clone.frozen_last_id)


__all__ = ["StoredCheckpoint", "CloneFailed", "trim_history"]
