"""A replica group on this host: the primary and its backups, each under
the preload library, with the primary's OrderInfo stream forwarded to the
backups through the ordering backend (llft/ordering/).  Its lifecycle and
serve loop are here; its view changes (membership.py), its checks while
it serves (checks.py), its state file (state_file.py) and its exit status
(verdict.py) beside it.  (Across hosts, llft/cluster/member.py runs one
member per host over LLFT's messaging.)"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from pathlib import Path

from llft.determinizer.catchup import CatchUpFeeder
from llft.determinizer.forked import ForkedStreams
from llft.determinizer.forwarder import RecordForwarder
from llft.determinizer.streams import (BackupSink, PrimarySource, SavedStreamSource, SavedStreamWriter,
                                       stream_path, sweep_dead_rings)
from llft.follow import FollowWatch
from llft.native import ROLE_BACKUP, ROLE_PRIMARY, StreamFile
from llft.ordering.backend import RecordOrdering, ordering_for
from llft.replacements import Replacements
from llft.replica import Replica, release_replicas, stop_replicas, stop_replicas_in_loop, watch_exit
from llft.replication.checks import GroupChecks
from llft.replication.membership import GroupMembership
from llft.replication.options import GroupOptions
from llft.replication.state_file import GroupStateFile
from llft.replication.verdict import GroupVerdict
from llft.serving.dataplane import DataPlane
from llft.serving.gateway import Gateway
from llft.serving.inputlog import InputLog
from llft.serving.outgoing import OutgoingService
from llft.serving.plane_relay import PlaneRelay
from llft.serving.routes import ConnectionRoutes

log = logging.getLogger("llft.group")

HISTORY_FILE = "history.orderinfo"   # the group's OrderInfo since it started (--respawn)
INPUT_DIR = "input"                  # every client connection's bytes (--respawn)


class LocalGroup(GroupMembership, GroupChecks, GroupStateFile, GroupVerdict):
    def __init__(self, argv: list[str], run_dir: Path, options: GroupOptions, group: str):
        self.argv = argv
        self.run_dir = run_dir
        self.opts = options
        self.group = group
        self.run_id = f"{os.getpid()}"
        self.replicas: list[Replica] = []
        self.forwarder: RecordForwarder | None = None
        self.ordering: RecordOrdering | None = None
        self.source = None
        self.interrupted: int | None = None
        self.steals_said = False          # --serialize: a steal has been logged
        self.failed: str | None = None
        self.relays: list[PlaneRelay] = []
        self.plane: DataPlane | None = None   # the client connections' byte path
        self.gateway: Gateway | None = None
        self.outgoing = OutgoingService()   # the program's connect()s
        self.sinks: dict[int, BackupSink] = {}
        self.inputs: InputLog | None = None
        self.feeders: dict[int, CatchUpFeeder] = {}
        self.exited = asyncio.Event()   # set as soon as any replica exits (pidfd)
        self.tasks: list[asyncio.Task] = []
        self.failovers: list[dict] = []   # each view change: who failed, who took over, when (time.monotonic)
        self.follow = FollowWatch(options.stall_alarm)
        self.lost: list[str] = []         # backups that diverged (or whose stream broke) while the group ran
        self.replacements = Replacements(self)   # --respawn, --keep, --checkpoint-every
        self.routes = ConnectionRoutes() if options.replicate_forks else None
        self.forked = ForkedStreams(self, run_dir, self.routes,
                                    lambda stream: ordering_for(options.order, self.run_id, options, stream)) \
            if options.replicate_forks else None

    # -- start ----------------------------------------------------------
    def _new_replica(self, k: int, role: int) -> Replica:
        path = stream_path(self.run_id, k)
        if os.path.exists(path):
            os.unlink(path)  # left by an earlier run with our pid
        stream = StreamFile(path, create=True, slots=self.opts.ring_slots, role=role, replica=k)
        stream.set_timeouts(stall_ms=self.opts.stall_timeout_ms, end_grace_ms=self.opts.end_grace_ms)
        stream.forks_replicated = self.opts.replicate_forks
        out_dir = self.run_dir / f"replica-{k}"
        out_dir.mkdir(exist_ok=True)
        r = Replica(k, stream, out_dir, private_files=self.opts.private_files,
                    serialize=self.opts.serialize)
        self.replicas.append(r)
        if self.forked is not None:
            r.channel.on_stream = functools.partial(self.forked.handed_over, r)
            r.adopt = functools.partial(self._adopt_daemon, r)
            r.forked_files = functools.partial(self.forked.files_of, k)
        self.outgoing.listen(r)   # before it starts: its first connect() finds the name
        if role == ROLE_BACKUP:
            self.sinks[k] = BackupSink(k, stream, r.alive)
        return r

    def start(self):
        sweep_dead_rings()
        replaying = self.opts.replay_from is not None
        # Semi-passive: the backups are the stored checkpoint and the log after it.
        indices = [1] if replaying else [0] if self.opts.semi_passive else list(range(self.opts.replicas))
        for k in indices:
            self._new_replica(k, ROLE_PRIMARY if k == 0 else ROLE_BACKUP)
        self.next_index = max(indices) + 1   # indices (precedences) are never reused

        if replaying:
            self.source = SavedStreamSource(self.opts.replay_from)
        else:
            self.source = PrimarySource(self.replicas[0].stream)
            self.outgoing.primary = self.replicas[0].index
        saved = self.opts.save_stream
        if self.opts.respawn:
            saved = saved or self.run_dir / HISTORY_FILE
            self.inputs = InputLog(self.run_dir / INPUT_DIR)
        saver = SavedStreamWriter(saved) if saved else None
        if self.opts.keep is not None or self.opts.semi_passive:
            from llft.checkpoint import criu
            why = criu.problem()
            if why is None:   # (a clone or a checkpoint loads pycriu, 0.25 s: aside, now)
                threading.Thread(target=criu.warm_up, name="llft-criu-warm-up", daemon=True).start()
            elif self.opts.keep is not None:
                self.replacements.clone_refused = why
                log.warning("--keep: %s; a failed replica is replaced by one that replays the group's history",
                            why)
        self.ordering = ordering_for(self.opts.order, self.run_id, self.opts)
        self.forwarder = RecordForwarder(self.source, self.sinks.values(), self.ordering, saver)
        if self.routes is not None:
            self.forwarder.on_chunk = functools.partial(self.routes.accepted, 0)

        self.env = dict(os.environ)
        for r in self.replicas:
            r.start(self.argv, self.env)
            log.info("replica %d (%s) started: pid %d", r.index, r.role, r.pid)
        self.forwarder.start()
        self.write_state("running")

    def replica_at(self, index: int) -> Replica | None:
        """The replica of that index (its precedence), or None."""
        return next((r for r in self.replicas if r.index == index), None)

    def primary(self) -> Replica | None:
        """The replica whose role is primary (None while none is)."""
        return next((r for r in self.replicas if r.role == "primary"), None)

    # -- run to completion -----------------------------------------------
    def wait(self) -> int:
        """Serves clients until every replica has finished; returns llft-run's exit status."""
        try:
            import uvloop
            return uvloop.run(self._serve())
        except ImportError:
            return asyncio.run(self._serve())

    def _relay(self, r: Replica) -> PlaneRelay:
        rl = PlaneRelay(r, self.plane, log_dir=(r.out_dir / "output") if self.opts.log_output else None,
                        routes=self.routes)
        self.relays.append(rl)
        self.tasks.append(asyncio.create_task(rl.run()))
        return rl

    async def _serve(self) -> int:
        primary = self.replicas[0] if isinstance(self.source, PrimarySource) else None
        self.plane = DataPlane(self.inputs.dir if self.inputs is not None else None)
        if self.routes is not None:
            self.routes.serve()
        await self.outgoing.serve()
        for r in list(self.replicas):
            self._relay(r)
            watch_exit(r, self.exited.set)
            if self.forked is not None:
                r.channel.attach()
        self.gateway = None
        if primary is not None:
            self.gateway = Gateway(self.plane, self.relays, self.relays[0], self.opts.port_map, self.opts.host,
                                   self.inputs)
            self.tasks.append(asyncio.create_task(self.gateway.watch()))
        try:
            await self._wait_replicas(primary)
            # The replicas are gone: read what they last wrote, then let it reach the clients.
            for rl in self.relays:
                await rl.drained(timeout=2.0)
        finally:
            await self.replacements.stop()
            if self.gateway:
                await self.gateway.close()
            self.plane.stop()
            self.outgoing.close()
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        primary = self.primary() or primary
        if primary is not None:
            self.source.finish()
        if self.forked is not None:
            self.forked.close()
        self.forwarder.join(timeout=10)
        for feeder in self.feeders.values():
            feeder.join(timeout=5)
        self.write_state("finished")
        return self._verdict(primary)

    # -- re-adding replicas (llft/replacements.py) ------------------------
    def adopt(self, r: Replica, relay: PlaneRelay):
        """A replica made outside _new_replica (a clone) joins the group."""
        self.replicas.append(r)
        self.relays.append(relay)
        watch_exit(r, self.exited.set)
        self.outgoing.listen(r)
        self.tasks.append(asyncio.create_task(self.outgoing.serve()))
        self.tasks.append(asyncio.create_task(relay.run()))
        self.write_state("running")

    async def _wait_replicas(self, primary):
        deadline = None
        next_state = time.monotonic() + 1
        # --fork replicate: the primary's first process has exited and the
        # replica goes on as a daemon it forked (_adopt_daemon); the first
        # processes' stream has ended, the program has not.
        daemon_era = False
        adopted = 0
        # (Semi-passive: a primary's death leaves no replica alive, and the
        # group goes on with a copy of its checkpoint.)
        while any(r.alive() for r in self.replicas) or (self.opts.semi_passive and not self.source.finished()):
            self._check_frozen()
            if time.monotonic() > next_state:  # live counters for llft-status
                self.write_state("running")
                next_state = time.monotonic() + 1
                self._check_serial_steals(primary)
                if self.forked is not None:
                    self.forked.tidy()
                    self._prune_routes()
                    self._check_forked_divergence()
                if self._check_unreplicable():
                    break
            if self.interrupted is not None:
                await stop_replicas_in_loop(self.replicas, each=functools.partial(self._primary_stopped, primary),
                                            lead=primary)
                break
            if self.gateway is not None and self.gateway.errors:
                self.failed = self.gateway.errors[0]  # clients could never reach the group
                self.stop()
                break
            if primary is not None and primary.adopted and not daemon_era:
                daemon_era = True
                self.source.finish(primary.first_status)   # the backups' first processes exit as it did
            now_adopted = sum(1 for r in self.replicas if r.adopted)
            if now_adopted != adopted:
                adopted = now_adopted
                self.write_state("running")   # their pids, for llft-status and llft-kill
            running = daemon_era or not self.source.finished()
            if primary is not None and not primary.alive() and running:
                # A successor that ends before it has taken over (still
                # replaying its predecessor's records) failed as a backup
                # does: another takes over.  Killed by a signal: a fault.
                # Any other exit is the program's own end.
                unpromoted = not primary.took_over()
                if primary.status < 128 and not unpromoted and self._check_unreplicable():
                    break   # the shim stopped it, saying why: not the program's own end
                if unpromoted and primary.status < 128:
                    self._successor_lost(primary)
                fault = primary.status >= 128 or unpromoted
                successor = self._successor() if fault else None
                if successor is None and fault and self.opts.semi_passive:
                    successor = await self.replacements.restored_successor(primary)
                if successor is not None:
                    self._fail_over(primary, successor)
                    primary = successor
                    self.replacements.respawn()
                    continue
                log.info("primary exited with status %d", primary.status)
                self.source.finish(primary.status)
                daemon_era = running = False
            gone = [r for r in self.replicas if r.role == "backup" and not r.alive() and running]
            # A backup that could not bind the port its primary holds natively.
            if any(r.status < 128 for r in gone) and self._check_unreplicable():
                break
            for r in gone:
                if r.status >= 128:
                    self._backup_failed(r, f"was killed (status {r.status})")
                else:
                    self._backup_lost(r)
            if primary is not None and running and not daemon_era:
                self._check_following()
            self.replacements.respawn()
            self.replacements.check_caught_up()
            self.replacements.store_due()
            if deadline is None and not running:
                deadline = time.monotonic() + self.opts.backup_exit_timeout
            if deadline is not None and time.monotonic() > deadline:
                for r in self.replicas:
                    if r.alive():
                        r.problems.append(f"did not finish within {self.opts.backup_exit_timeout:g}s "
                                          "after the primary; killed")
                        r.kill()
            try:
                await asyncio.wait_for(self.exited.wait(), 0.01)
            except asyncio.TimeoutError:
                pass
            self.exited.clear()

    def _adopt_daemon(self, r: Replica, first: int) -> int | None:
        """--fork replicate: r's first process (pid first) exited on its
        own, leaving a process it forked running (a daemon whose parent
        waited for its word, then exited: lighttpd without -D, in a session
        of its own, or one that stays in its parent's): r goes on as that
        process, whose stream the backups replay as any forked process's,
        and fails over with it.  (The
        daemon handed its stream over before its word let the first process
        exit: the channel is read to its end first.)"""
        r.channel.read_pending()
        primary = self.primary()
        if r.stream.diverged or (r.role == "backup" and (primary is None or not primary.adopted)):
            # A backup's first process exits only once its primary's has (its exit waits for the end
            # of the primary's stream): one that exits before diverged, whatever it leaves running.
            return None
        pid = self.forked.daemon_of(r, first, primary)
        if pid is None:
            return None
        log.info("replica %d's first process exited; the replica goes on as process %d, which it forked and "
                 "which runs in a session of its own (a daemon)", r.index, pid)
        if self.plane is not None and r in self.replicas and self.relays:
            self.plane.set_pid(self._relay_of(r).slot, pid)
        return pid

    def stop(self):
        """Ends every replica: SIGTERM, then SIGKILL after 3 s."""
        stop_replicas(self.replicas)

    def problems(self) -> list[tuple[Replica, str]]:
        return [(r, p) for r in self.replicas for p in r.problems]

    def primary_last_words(self) -> str:
        """The last line the primary wrote on its stderr: why a program that
        failed did ("" if none)."""
        return (self.primary() or self.replicas[0]).last_words()

    def cleanup(self):
        if self.ordering is not None:
            self.ordering.close()
        release_replicas(self.replicas)
