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

A replacement is a copy of it, restored with the next index, and it
stays stored for the next one (two failures in a row need it twice): the
copy's ring is copied from its ring, its plane slot from its parked slot,
its sockets primed with what the stored ones hold; the copy's slot wakes
(each parked socket is fed the logged input from where it stopped, each
connection opened since its whole log), its relay hands over the
connections it was not handed, in order, and its ring is fed the saved
stream from its position, then joins the backend, as a replica replaying
the history does."""
from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import time

from llft import private_files
from llft.checkpoint import quiesce, sockets
from llft.checkpoint.clone import CLONE_ERRORS, GIVE_BACK_S, BackupClone, CloneFailed, waiting_conns
from llft.determinizer.catchup import CatchUpFeeder
from llft.determinizer.streams import BackupSink, SavedStreamWriter
from llft.replica import RestoredReplica
from llft.serving.dataplane import LEG_LIVE
from llft.serving.plane_relay import PlaneRelay

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
        except asyncio.CancelledError:   # (given up: its source died, semi-passive's successor waits)
            c.close_inherited()
            c.undo()
            c.keep_logs()
            raise
        c.keep_logs(drop_images=False)
        return cls(c, parked_after, time.monotonic() - started)

    def state(self) -> dict:
        """What llft-status shows of it."""
        return {"source": self.figures["source"], "at": self.figures["at"], "frozen_ms": self.figures["frozen_ms"],
                "image_bytes": self.figures["image_bytes"], "after_connection": self.parked_after}

    async def restore(self, group, k: int) -> RestoredReplica:
        """A copy of it restored as replica k, which catches up from the
        saved stream; it stays stored, for the next replacement.
        CloneFailed if the copy cannot be made or restored."""
        c, g = self.clone, group
        started = time.monotonic()
        try:
            n = self._copy(k)
        except CLONE_ERRORS as e:
            raise CloneFailed(f"the stored checkpoint could not be copied: {e}") from None
        try:
            pid, proc = await asyncio.to_thread(n.restore)
        except CLONE_ERRORS as e:
            n.give_up(e)
        finally:
            n.close_inherited()
        n.keep_logs(drop_images=False)
        figures = dict(self.figures, restore_ms=round((time.monotonic() - started) * 1000, 1))
        n.adopt(pid, proc, figures)
        if c.of_primary:   # (semi-passive) held at a call's entry, its threads make it as a backup's
            quiesce.release(n.clone.stream)
        n.clone.catch_up = {"records": None, "ms": None, "done": False}
        feeder = g.feeders[k] = CatchUpFeeder(g.forwarder, n.sink, start=self.history_at, records=c.sink.delivered)
        feeder.start()
        log.warning("replica %d (backup) restored from the checkpoint of replica %d taken %.1f s ago: pid %d; "
                    "image %d KiB, restored in %.0f ms; catching up", k, self.figures["source"],
                    time.time() - self.figures["at"], pid, self.figures["image_bytes"] // 1024,
                    figures["restore_ms"])
        return n.clone

    def _copy(self, k: int) -> BackupClone:
        """What a restore of it as replica k needs, made anew from it, as a
        clone's is from a frozen backup: a ring copied from its ring, a
        data plane slot copied from its parked one and woken, sockets of
        its own primed with what its sockets hold (connections waiting in
        its listeners included), its files copied.  Runs in the event loop
        without a pause: a connection the gateway opens meanwhile would be
        in neither the woken slot nor the relay's list."""
        c, g = self.clone, self.clone.g
        n = BackupClone(g, c.src, k)
        n.images, n.listed, n.files_at_dump = c.images, c.listed, c.files_at_dump
        n.dump_stats, n.image_bytes, n.taken_at = c.dump_stats, c.image_bytes, c.taken_at
        old = c.clone
        try:
            n.prepare_replica(old.stream.capacity)
            new = n.clone
            new.stream.copy_from(old.stream, k)
            for name in ("stdout", "stderr"):
                shutil.copyfile(old.out_dir / name, new.out_dir / name)
                n.stdio[name] = open(new.out_dir / name, "ab")
            if old.private_files:
                private_files.copy_uppers(old.files_dir, new.files_dir)
            log_dir = new.out_dir / "output" if g.opts.log_output else None
            if log_dir is not None:
                log_dir.mkdir(exist_ok=True)
            n.slot, legs = g.plane.clone_replica(c.slot, log_dir)
            g.plane.release(c.slot)
            by_leg = {ino: conn_id for conn_id, ino, state in legs if state == LEG_LIVE and ino}
            channel = sockets.inode(old.channel.ours)
            listeners = {sockets.inode(ours): (key, ours) for key, ours in old.channel.listeners.items()}
            peers = sockets.unix_peers({sockets.inode(theirs) for theirs, _key in c.inherit})
            for theirs, key in c.inherit:
                peer = peers.get(sockets.inode(theirs))
                if peer == channel:
                    mine = new.channel.theirs
                elif peer in listeners:
                    lkey, old_ours = listeners[peer]
                    ours, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                    ours.setblocking(False)
                    new.channel.listeners[lkey] = ours
                    self._copy_queue(n, theirs, old_ours, ours, by_leg)
                elif peer in by_leg:
                    mine = self._copy_conn(n, by_leg[peer], theirs)
                else:
                    raise CloneFailed(f"a socket of the stored checkpoint ({key}) has no known other end")
                sockets.same_settings(theirs, mine)
                n.inherit.append((mine, key))
        except BaseException:
            n.close_inherited()
            n.undo()
            raise
        n.relay = PlaneRelay(new, g.plane, log_dir=log_dir, slot=n.slot)
        n.sink = BackupSink(k, new.stream, new.alive)
        n.sink.delivered = c.sink.delivered
        g.plane.wake(n.slot, log_dir)
        g.gateway.add_clone_relay(n.relay, c.unhanded + [(x.conn_id, x.port, x.host, x.client_port)
                                                         for x in g.inputs.connections(c.frozen_last_id)])
        return n

    @staticmethod
    def _copy_conn(n: BackupClone, conn_id: int, theirs: socket.socket) -> socket.socket:
        """The copy's socket for connection conn_id, holding what the stored
        one's holds (written here: its leg is parked, and the plane writes
        the logged input after it when it wakes)."""
        ours, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        held = sockets.unread(theirs)
        ours.setblocking(False)
        if held and ours.send(held) != len(held):
            raise CloneFailed(f"connection {conn_id}: what the stored checkpoint's socket holds does not fit a copy")
        n.g.plane.clone_attach(n.slot, conn_id, ours, b"")
        return mine

    def _copy_queue(self, n: BackupClone, theirs: socket.socket, old_ours: socket.socket,
                    ours: socket.socket, by_leg: dict):
        """The connections waiting in a listener of the stored checkpoint:
        taken out, each copied into the copy's listener, in order, and put
        back as they were."""
        waiting = sockets.take_handed(theirs)
        try:
            for s, conn_id in waiting_conns(waiting, by_leg):
                mine = self._copy_conn(n, conn_id, s)
                sockets.send_handed(ours, mine, 0.0)
                mine.close()
        finally:
            for s in waiting:
                sockets.send_handed(old_ours, s, GIVE_BACK_S)
                s.close()

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
