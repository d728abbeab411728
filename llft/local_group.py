"""A replica group on this host: the primary and its backups, each under
the preload library, with the primary's OrderInfo stream forwarded to the
backups through shared memory.  (Across hosts the stream rides on the
messaging protocol instead; the forwarder's interface stays the same.)"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from llft import rundir
from llft.determinizer.catchup import CatchUpFeeder
from llft.determinizer.forked import ForkedStreams
from llft.follow import STALL_S, FollowWatch
from llft.determinizer.forwarder import RecordForwarder
from llft.determinizer.streams import (BackupSink, PrimarySource, SavedStreamSource, SavedStreamWriter,
                                       stream_path, sweep_dead_rings)
from llft.native import (DEFAULT_SLOTS, EXIT_DIVERGED, ROLE_BACKUP, ROLE_PRIMARY,
                         StreamFile)
from llft.ordering.backend import RecordOrdering, ordering_for
from llft.thread_snapshot import keep_stall_snapshot
from llft.replica import Replica, release_replicas, stop_replicas, stop_replicas_in_loop, watch_exit
from llft.serving.dataplane import DataPlane
from llft.serving.gateway import Gateway
from llft.serving.inputlog import InputLog
from llft.serving.plane_relay import PlaneRelay
from llft.serving.routes import ConnectionRoutes
from llft.serving.outgoing import OutgoingService
from llft.replacements import Replacements
from llft.replication.faults import frozen_past
from llft.replication.verdict import backup_end

log = logging.getLogger("llft.group")


@dataclass
class GroupOptions:
    replicas: int = 3
    ring_slots: int = DEFAULT_SLOTS
    stall_timeout_ms: int = 60_000
    end_grace_ms: int = 3_000
    backup_exit_timeout: float = 60.0
    save_stream: Path | None = None
    replay_from: Path | None = None
    fault_timeout: float = 0.03   # a replica frozen this long is failed (LLFT: about 10-30 ms)
    port_map: dict[int, int] = field(default_factory=dict)   # program port -> public port (0: any)
    host: str | None = None
    log_output: bool = False
    respawn: bool = False         # a failed replica is replaced by a new backup that replays the history
    keep: int | None = None       # --keep N: replacements cloned from a live backup (CRIU), else replayed
    checkpoint_dir: str | None = None   # --checkpoint-dir: where a clone's image is written (None: memory)
    checkpoint_every: float | None = None   # --checkpoint-every: seconds between stored checkpoints
    semi_passive: bool = False    # --mode semi-passive: only the primary executes (llft/replacements.py)
    stall_alarm: float = STALL_S  # a backup that replays nothing this long while records wait is flagged
    private_files: bool = False   # each replica in its own view of the files (llft/private_files.py)
    serialize: bool = False       # --serialize: threads take turns (native/serialize.c)
    order: str = "llft"           # --order: the backend that carries the records (llft/ordering/)
    mailbox_copies: int = 3       # --order mailbox: copies of the mailbox (n; n − 1 may fail)
    mailbox_protocol: int = 1     # --order mailbox: 1 (crash failures) or 2 (timing failures too)
    replicate_forks: bool = False # --fork replicate: what the program forks is replicated (determinizer/forked.py)

HISTORY_FILE = "history.orderinfo"   # the group's OrderInfo since it started (--respawn)
INPUT_DIR = "input"                  # every client connection's bytes (--respawn)
# How long a failover waits for the forwarder to write PROMOTE before it
# goes on (a successor still catching up with --respawn takes longer).
PROMOTE_WAIT_S = 0.05


class LocalGroup:
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

    def ranks(self) -> dict[int, int]:
        """LLFT's ranks: the primary 1, then the live backups in precedence
        order.  A replica's precedence is its index, never reused."""
        live = [r for r in self.replicas if r.role == "primary"]
        live += [r for r in self.replicas if r.role == "backup" and r.alive()]
        return {r.index: rank for rank, r in enumerate(live, 1)}

    def write_state(self, phase: str):
        ranks = self.ranks()
        primary = getattr(self.primary(), "index", None)
        rundir.write_state(self.run_dir, {
            "group": self.group,
            # each primary change starts a new view, as in LLFT's membership
            "view": {"pvn": 1 + len(self.failovers), "primary": primary},
            "phase": phase,
            "controller_pid": os.getpid(),
            "argv": self.argv,
            "respawn": self.opts.respawn,
            "keep": self.opts.keep,
            **self.replacements.state(),
            "replicas": [dict(r.state(), precedence=r.index, rank=ranks.get(r.index),
                              replaces=r.replaces, catch_up=r.catch_up,
                              follow=self.follow.view(r.index) if r.role == "backup" else None,
                              outputs=rl.output_summary() if rl else {},
                              outgoing=self.outgoing.summary(r.index),
                              datagrams=self.gateway.datagrams.summary(r.index) if self.gateway else {})
                         for r, rl in zip(self.replicas, self.relays or [None] * len(self.replicas))],
            "gateway": dict(self.gateway.stats, errors=self.gateway.errors) if self.gateway else None,
            "failovers": self.failovers,
            "outgoing": dict(self.outgoing.stats, errors=self.outgoing.errors),
            "order": dict(self.ordering.counters(), backend=self.ordering.name) if self.ordering else None,
            "forked": self.forked.state() if self.forked else None,
        })

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
        what, report = r.report_divergence()
        left = sum(1 for x in self.replicas if x.role in ("primary", "backup") and x is not r and x.alive())
        log.error("replica %d (backup) diverged from the primary and left the group: %s.  %d replica%s left%s.  "
                  "The report is in %s.  %s", r.index, what, left, "" if left == 1 else "s",
                  ": no backup to fail over to" if left <= 1 else "", report, r.divergence_advice())
        self.lost.append(f"replica {r.index} diverged: {what}")
        r.problems.append(what)
        self._backup_failed(r, "diverged")
        shared = self.forked.shared_memory if self.forked is not None else None
        if shared:
            # Its processes read each other's writes in memory llft does not order.
            self.failed = (f"cannot replicate the program: its processes share memory ({shared}), which llft does "
                           f"not order, and a backup diverged (replica {r.index}: {what})")
            log.info("%s; stopping the group", self.failed)
            self.stop()

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
                if primary.status < 128 and self._check_unreplicable():
                    break   # the shim stopped it, saying why: not the program's own end
                # Killed by a signal: a fault.  An exit is the program's own end.
                successor = self._successor() if primary.status >= 128 else None
                if successor is None and primary.status >= 128 and self.opts.semi_passive:
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

    def _primary_stopped(self, primary: Replica | None):
        """While the group stops: once the primary has exited, its backups
        are told its end, and exit as it did rather than wait for it."""
        if primary is not None and not primary.alive() and not self.source.finished():
            self.source.finish(primary.status)

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

    def stop(self):
        """Ends every replica: SIGTERM, then SIGKILL after 3 s."""
        stop_replicas(self.replicas)

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
