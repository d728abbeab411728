"""Re-adding replicas to a group on this host (llft-run --respawn, --keep,
--checkpoint-every): each failed replica not yet replaced gets a new
backup with a new index (its precedence), never reused, ranked last.
With --keep it is cloned from a live backup (llft/checkpoint/clone.py),
one at a time; with no backup to clone, a copy of the stored checkpoint
is restored (llft/checkpoint/stored.py), or, with none stored, it is
cloned from the primary, held still for it; otherwise, or when none of
these can be done, it replays the group's history, OrderInfo and client
input alike, from the start, then follows the live stream like any
backup."""
from __future__ import annotations

import asyncio
import logging
import time

from llft.determinizer.catchup import CatchUpFeeder
from llft.native import ROLE_BACKUP, ROLE_PRIMARY
from llft.replica import Replica, watch_exit

log = logging.getLogger("llft.group")

# Semi-passive: how long a primary's successor waits for a checkpoint that
# was being stored of it when it died (CRIU gives such a dump up at once,
# or within its dead-source grace: criu.py) before it is given up.
STORE_WAIT_S = 3.0


class Replacements:
    def __init__(self, group):
        self.g = group
        self.cloning: asyncio.Task | None = None   # the clone, store or restore under way (one at a time)
        self.clone_refused: str | None = None      # --keep: why replacements cannot be cloned here
        self.stored = None                # --checkpoint-every: the stored checkpoint (llft/checkpoint/stored.py)
        self.stores = 0                   # checkpoints stored so far
        self.next_store = 0.0             # time.monotonic() when the next one is due
        self.history_from_start = True    # the saved stream and input logs go back to the group's start

    def respawn(self):
        """A replacement for each failed replica not yet replaced (this
        module's docstring says which kind)."""
        g = self.g
        if not g.opts.respawn or g.gateway is None or g.source.finished() or g.interrupted is not None:
            return
        if self.cloning is not None:
            return
        for failed in [r for r in g.replicas if r.role == "failed" and not r.replaced]:
            self._drop_if_it_diverged(failed)
            if g.opts.keep is not None:
                live = sum(1 for r in g.replicas if r.role in ("primary", "backup") and r.alive())
                if live >= g.opts.keep:
                    failed.replaced = True   # the group has its N
                    continue
                source = self.clone_source()
                if source is not None:
                    failed.replaced = True
                    self.cloning = asyncio.create_task(self._clone(source, failed))
                    return
                if self.stored is None and self._primary_settling():
                    return   # the next look clones the new primary, once it has taken over
            failed.replaced = True
            if self._replace_without_clone(failed):
                return

    def _drop_if_it_diverged(self, failed: Replica):
        """A copy of the stored checkpoint that diverged says the checkpoint
        is bad (every copy of it would): it is dropped, not restored again
        and again, and the next one is stored as soon as a backup lives.  A
        clone that diverged says the program does not run alike once
        restored (it reads something of its surroundings llft does not
        record: its parent, its namespace): no more clones are made, each
        would diverge and be made again, and the replacements replay the
        history."""
        ck = getattr(failed, "checkpoint", None) or {}
        if not failed.stream.diverged or not ck:
            return
        if self.stored is not None and ck.get("stored") and ck.get("at") == self.stored.figures["at"]:
            log.error("replica %d, restored from the stored checkpoint, diverged: the checkpoint is dropped",
                      failed.index)
            self.stored.drop()
            self.stored = None
            self.next_store = 0.0
        elif not ck.get("stored") and self.clone_refused is None:
            self.clone_refused = f"replica {failed.index}, a clone, diverged"
            log.error("replica %d, a clone of replica %s, diverged: no more clones are made (the program does not "
                      "run alike once restored); replacements replay the history", failed.index, ck.get("source"))

    def _replace_without_clone(self, failed: Replica, primary_too: bool = True) -> bool:
        """No backup to clone: a copy of the stored checkpoint, restored
        (True: under way), or a clone of the primary (with --keep), or a
        replay of the history while it goes back to the start."""
        if self.stored is not None:
            self.cloning = asyncio.create_task(self._wake_stored(failed))
            return True
        primary = self.primary_source() if primary_too and self.g.opts.keep is not None else None
        if primary is not None:
            self.cloning = asyncio.create_task(self._clone(primary, failed))
            return True
        if self.history_from_start:
            self._replay_replacement(failed)
        else:
            log.error("replica %d cannot be replaced: no backup lives to be cloned, no checkpoint is stored, and "
                      "the history before the last one is dropped", failed.index)
        return False

    async def restored_successor(self, failed: Replica) -> Replica | None:
        """Semi-passive (LLFT sec. II-E): the primary failed and no backup
        executes.  Its successor is a copy of the stored checkpoint,
        restored, or, before the first one is stored, a replica that replays
        the history from the start; it catches up from the saved stream and
        the input logs, and takes over at their end (the record pump waits
        for it).  None if neither can be had."""
        if self.cloning is not None:   # a store under way gives up (its source is gone), or ends
            done, _ = await asyncio.wait([self.cloning], timeout=STORE_WAIT_S)
            if not done:
                log.warning("the checkpoint being stored of replica %d did not end within %.0f s of its death: "
                            "given up, the last one stored is restored", failed.index, STORE_WAIT_S)
                self.cloning.cancel()
                await asyncio.gather(self.cloning, return_exceptions=True)
        failed.replaced = True
        if self.stored is not None:
            return await self._restore_stored(failed, "the primary")
        if self.history_from_start:
            return self._replay_replacement(failed)
        return None

    def store_due(self):
        """--checkpoint-every: a checkpoint of a live backup (semi-passive:
        of the primary, held still) is stored when one is due and nothing
        else is under way (a clone, a restore, a replay of the history,
        which reads what storing drops)."""
        g = self.g
        every = g.opts.checkpoint_every
        if (not every or self.cloning is not None or g.gateway is None or g.source.finished()
                or g.interrupted is not None or time.monotonic() < self.next_store
                or any(f.is_alive() for f in g.feeders.values())):
            return
        source = self.clone_source() or (self.primary_source() if g.opts.semi_passive else None)
        if source is not None:
            self.next_store = time.monotonic() + every
            self.cloning = asyncio.create_task(self._store(source))

    async def _store(self, source: Replica):
        g = self.g
        from llft.checkpoint.stored import CloneFailed, StoredCheckpoint, trim_history
        self.stores += 1
        try:
            stored = await StoredCheckpoint.take(g, source, self.stores)
        except CloneFailed as e:
            log.warning("no checkpoint stored of replica %d this time (%s)", source.index, e)
            return
        finally:
            if self.cloning is asyncio.current_task():
                self.cloning = None
            g.exited.set()
        old, self.stored = self.stored, stored
        if old is not None:
            old.drop()
        trim_history(g, stored)
        self.history_from_start = False
        log.info("checkpoint %d stored, of replica %d: image %d KiB, the source frozen %.1f ms; the history "
                 "before it is dropped", self.stores, source.index, stored.figures["image_bytes"] // 1024,
                 stored.figures["frozen_ms"])
        g.write_state("running")

    async def _wake_stored(self, failed: Replica):
        try:
            await self._restore_stored(failed, f"replica {failed.index}")
        finally:
            if self.cloning is asyncio.current_task():
                self.cloning = None
            self.g.exited.set()

    async def _restore_stored(self, failed: Replica, who: str) -> Replica | None:
        """A copy of the stored checkpoint, restored in failed's place; None
        (said in the log) if it cannot be."""
        from llft.checkpoint.stored import CloneFailed
        g = self.g
        k, g.next_index = g.next_index, g.next_index + 1
        try:
            r = await self.stored.restore(g, k)
        except CloneFailed as e:
            log.error("%s cannot be replaced: the stored checkpoint could not be restored (%s)", who, e)
            return None
        r.replaces = failed.index
        return r

    def clone_source(self) -> Replica | None:
        """The backup a replacement is cloned from: the last-ranked live one
        that follows the live stream (not one still catching up, nor one
        stopped, whose image would be restored stopped)."""
        g = self.g
        if self.clone_refused is not None:
            return None
        for r in reversed(g.replicas):
            sink = g.sinks.get(r.index)
            if (r.role == "backup" and r.alive() and not r.frozen() and sink is not None and not sink.dead
                    and sink.joined.is_set() and (r.catch_up is None or r.catch_up["done"])):
                return r
        return None

    def primary_source(self) -> Replica | None:
        """The primary, when a clone may be made of it: alive, running, the
        record pump's source with no failover under way, and not under
        --serialize (whose turns it records outside the calls a hold
        stops)."""
        g = self.g
        if self.clone_refused is not None or g.opts.serialize or g.forwarder is None or g.forwarder.promoting:
            return None
        primary = g.primary()
        if (primary is None or not primary.alive() or primary.frozen() or primary.stream.role != ROLE_PRIMARY
                or primary.stream is not getattr(g.source, "stream", None)):
            return None
        return primary

    def _primary_settling(self) -> bool:
        """A backup is taking over: it replays the failed primary's last
        records before it records as the primary does."""
        g = self.g
        if g.forwarder is not None and g.forwarder.promoting:
            return True
        primary = g.primary()
        return primary is not None and primary.alive() and primary.stream.role != ROLE_PRIMARY

    async def _clone(self, source: Replica, failed: Replica):
        g = self.g
        from llft.checkpoint.clone import BackupClone, CloneAgain, CloneFailed
        k, g.next_index = g.next_index, g.next_index + 1
        try:
            r = await BackupClone(g, source, k).run()
            r.replaces = failed.index
        except CloneAgain as e:
            log.warning("replica %d could not be cloned from replica %d (%s); another clone replaces replica %d",
                        k, source.index, e, failed.index)
            failed.replaced = False   # the next look at the group starts it, from a backup as it is then
        except CloneFailed as e:
            log.warning("replica %d could not be cloned from replica %d (%s); replica %d is replaced %s", k,
                        source.index, e, failed.index, "from the stored checkpoint" if self.stored is not None
                        else "by one that replays the group's history")
            if not g.source.finished() and g.interrupted is None:
                self.cloning = None
                self._replace_without_clone(failed, primary_too=False)   # (what failed would fail it too)
                return
        finally:
            if self.cloning is asyncio.current_task():
                self.cloning = None
            g.exited.set()   # the wait loop looks again: more may be missing

    def _replay_replacement(self, failed: Replica) -> Replica:
        g = self.g
        k, g.next_index = g.next_index, g.next_index + 1
        r = g._new_replica(k, ROLE_BACKUP)
        r.replaces = failed.index
        r.catch_up = {"records": None, "ms": None, "done": False}
        r.start(g.argv, g.env)
        watch_exit(r, g.exited.set)
        g.tasks.append(asyncio.create_task(g.outgoing.serve()))
        g.gateway.add_relay(g._relay(r))
        feeder = g.feeders[k] = CatchUpFeeder(g.forwarder, g.sinks[k])
        feeder.start()
        log.warning("replica %d started to replace replica %d: pid %d, catching up", k, failed.index, r.pid)
        g.write_state("running")
        return r

    def check_caught_up(self):
        """A replacement has caught up once it has replayed every record the
        history held when it joined the live stream, or (semi-passive) taken
        over at the end of the failed primary's."""
        g = self.g
        for r in g.replicas:
            feeder = g.feeders.get(r.index)
            if feeder is None or r.catch_up["done"] or feeder.joined_at is None:
                continue
            if r.stream.records < feeder.records and r.stream.role != ROLE_PRIMARY:
                continue
            if g.forked is not None and r.stream.role != ROLE_PRIMARY and not g.forked.caught_up(r.index):
                continue   # (its forked processes still replay their histories, or are still to be forked)
            ms = (time.monotonic() - feeder.started_at) * 1000
            r.catch_up.update(records=feeder.records, ms=round(ms, 1), done=True)
            log.warning("replica %d started to replace replica %d; caught up after %d records in %.0f ms",
                        r.index, r.replaces, feeder.records, ms)
            g.write_state("running")

    async def stop(self):
        """The group ends: what is under way stops, the stored checkpoint goes."""
        if self.cloning is not None:
            self.cloning.cancel()
            await asyncio.gather(self.cloning, return_exceptions=True)
        if self.stored is not None:
            self.stored.drop()

    def state(self) -> dict:
        """What the state file says of them (llft-status)."""
        saver = self.g.forwarder.saver if self.g.forwarder is not None else None
        return {"stored_checkpoint": dict(self.stored.state(), number=self.stores) if self.stored else None,
                "history": {"from_start": self.history_from_start, "bytes": saver.position} if saver else None}
