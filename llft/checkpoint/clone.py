"""A new backup made from a checkpoint of a live one, on one host (LLFT
§IV-C, adding a backup from a checkpoint taken at an exact point of the
ordering stream; docs/checkpoints.md).

The source, a backup (or the primary, when no backup lives), is dumped
by CRIU and keeps running; while CRIU holds it frozen, everything the
clone will need is taken at that one instant:

- its ring: the control block, the ring header and the records it has yet
  to replay are copied into the clone's ring, and the clone joins the
  ordering backend there, so it replays exactly what follows, nothing
  twice, nothing skipped (the group's history is not needed);
- its client connections: the data plane holds the source's input, so
  that what the source has not read is exactly what is in its sockets,
  and gives the clone a slot that continues the source's legs (output
  offsets, digests); each socket of the source whose other end is the
  controller's gets a new socketpair for the clone, primed with what the
  source had not read of it (read without taking it);
- its files: stdout and stderr so far, and with private files its upper
  layers.

Then the clone is restored in a PID namespace of its own
(restore_init.py) with the new sockets and files in place of the old
(`--inherit-fd`), and the controller adopts it as a backup.

A primary is held still first (quiesce.py): no thread of it is inside a
recorded call when it is frozen, so its ring holds every record of what
the image has done, and the clone, restored with the role ROLE_COPY,
becomes a backup at its first call (native/demote.c) and replays what the
primary records from there on."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from llft import private_files
from llft.checkpoint import criu, images, quiesce, restore, sockets
from llft.determinizer.streams import BackupSink, image_dir, stream_path
from llft.members import start_time
from llft.native import ROLE_BACKUP, ROLE_COPY, ROLE_PRIMARY, StreamFile
from llft.replica import RestoredReplica
from llft.serving.dataplane import LEG_LIVE
from llft.serving.plane_relay import PlaneRelay

log = logging.getLogger("llft.checkpoint")

CHECKPOINT_DIR = "checkpoints"
FROZEN_STEP_S = 5.0      # the most the frozen-time work waits for the event loop
SENT_WAIT_S = 1.0        # the most it waits for the source's ring to hold every record sent
GIVE_BACK_S = 5.0        # the most it waits for room in the source's listener queue


class CloneFailed(Exception):
    pass


class CloneAgain(CloneFailed):
    """The group changed under the clone (a failover began, its source
    stopped being a backup): another clone may well succeed."""


CLONE_ERRORS = (criu.CheckpointFailed, CloneFailed, images.DamagedImage, OSError)


def waiting_conns(waiting: list[socket.socket], by_leg: dict[int, int]) -> list[tuple[socket.socket, int]]:
    """Each connection waiting in a listener's queue, with its id: the
    data plane's end of it is a leg (by_leg: the leg's inode -> id)."""
    peers = sockets.unix_peers({sockets.inode(s) for s in waiting})
    out = []
    for s in waiting:
        conn_id = by_leg.get(peers.get(sockets.inode(s)))
        if conn_id is None:
            raise CloneFailed("a connection waiting in a listener is not one the data plane knows")
        out.append((s, conn_id))
    return out


class BackupClone:
    """One clone of replica src into a new backup with index k: src is a
    backup, or the primary, held still while CRIU takes its image
    (of_primary; llft/checkpoint/quiesce.py).  With
    store, the clone's restore waits (llft/checkpoint/stored.py): k then
    numbers the stored checkpoint, its ring does not join the backend
    (the saved stream keeps what follows, from history_at), and no relay
    hands it connections."""

    def __init__(self, group, src, k: int, store: bool = False):
        self.g = group
        self.src = src
        self.k = k
        self.store = store
        self.loop = asyncio.get_running_loop()
        # The images live in memory unless --checkpoint-dir says where (a
        # clone's are read back at once, then dropped); CRIU's logs are
        # kept in the run dir.
        self.images = Path(image_dir(group.run_id, k, group.opts.checkpoint_dir))
        self.listed: dict[str, tuple[int, int]] = {}   # the image's files as the dump wrote them
        self.logs = group.run_dir / CHECKPOINT_DIR / (f"stored-{k}" if store else f"replica-{k}")
        self.unhanded: list[tuple] = []    # the connections not handed to src when it froze: open() args
        self.frozen_last_id = 0            # the newest connection then
        self.history_at: int | None = None   # store: the saved stream's length when the ring was copied
        self.inherit: list[tuple[socket.socket, str]] = []   # (the clone's socket, CRIU's key for the one it replaces)
        self.clone: RestoredReplica | None = None
        self.sink: BackupSink | None = None
        self.relay: PlaneRelay | None = None
        self.slot: int | None = None
        self.frozen_work_ms = 0.0
        self.taken: list[tuple[socket.socket, list[socket.socket]]] = []   # the source's listeners' queues
        self.stdio: dict[str, object] = {}   # the clone's stdout and stderr, open for the restore
        self.held = False
        self.of_primary = src.role == "primary"
        self.held_at: float | None = None  # a primary's: since when it is held still (quiesce.py)...
        self.census_ms = 0.0               # ...how long holding it took
        self.held_ms = 0.0                 # ...and how long it was held

    # -- the whole clone -------------------------------------------------------
    async def run(self) -> RestoredReplica:
        """The clone, restored and adopted; CloneFailed (with nothing left
        behind) if it cannot be made."""
        started = time.monotonic()
        try:
            await self.take()
            dumped = time.monotonic()
            pid, proc = await asyncio.to_thread(self.restore)
        except CLONE_ERRORS as e:
            self.give_up(e)
        finally:
            self.close_inherited()
            self.keep_logs()
        checkpoint = self.figures(dumped - started, time.monotonic() - dumped)
        # Said before the group adopts it (and writes its state file):
        # whoever sees the clone there finds it in the log too.
        log.warning("replica %d (backup) cloned from replica %d%s: pid %d; the source was %sfrozen %.1f ms (%.1f "
                    "ms of it taking its sockets, files and ring), image %d KiB, restored in %.0f ms", self.k,
                    self.src.index, " (the primary)" if self.of_primary else "", pid,
                    f"held still {self.held_ms:.1f} ms (after {self.census_ms:.1f} ms to hold it) and "
                    if self.of_primary else "", checkpoint["frozen_ms"],
                    checkpoint["frozen_work_ms"], checkpoint["image_bytes"] // 1024, checkpoint["restore_ms"])
        self.adopt(pid, proc, checkpoint)
        if self.of_primary:
            quiesce.release(self.clone.stream)   # its threads held at a call's entry make it as a backup's
        return self.clone

    async def take(self):
        """The checkpoint of src, its image listed; CLONE_ERRORS if not."""
        self._prepare()
        self.src.checkpointing = True   # frozen by CRIU: not a timing fault
        try:
            self.dump_stats = await asyncio.to_thread(
                criu.dump, self.src.pid, self.images, externals=self._externals(), on_frozen=self._frozen,
                before_freeze=self._hold if self.of_primary else None)
        except quiesce.QuiesceFailed as e:
            raise CloneFailed(f"the primary could not be held still: {e}") from None
        except criu.CheckpointFailed:
            self._stop_again()
            raise
        finally:
            self._let_primary_go()
            self.src.checkpointing = False
            await asyncio.to_thread(self._give_back)
        await asyncio.to_thread(restore.no_parent_death_signal, self.images)
        self.listed = await asyncio.to_thread(images.manifest, self.images)
        self.image_bytes = sum(f.stat().st_size for f in self.images.iterdir() if f.is_file())
        self.taken_at = time.time()

    def _hold(self):
        """In CRIU's thread, CRIU about to freeze the primary: it is held
        still (quiesce.py) from here to the freeze (_let_primary_go)."""
        asked = time.monotonic()
        quiesce.hold(self.src.stream, self.src.pid)
        self.held_at = time.monotonic()
        self.census_ms = (self.held_at - asked) * 1000

    def _stop_again(self):
        """A stop sent to the source while CRIU held it makes CRIU give the
        dump up and let the task go on, the stop lost: it is sent again (a
        timing fault, or someone's SIGSTOP, stays what it was)."""
        try:
            said = (self.images / "dump.log").read_text(errors="replace")
        except OSError:
            return
        m = re.search(r"was stopped by (\d+) unexpectedly", said)
        if m and self.src.alive():
            log.info("replica %d was stopped (signal %s) while it was checkpointed: stopped again", self.src.index,
                     m.group(1))
            self.src.signal(int(m.group(1)))

    def give_up(self, e: Exception):
        """Undoes what was made and raises CloneAgain or CloneFailed for e."""
        self.undo()
        # A source that died or left the group meanwhile says nothing of
        # the other backups: the next one to hand is cloned instead.
        again = (isinstance(e, CloneAgain) or isinstance(e.__cause__, CloneAgain) or not self.src.alive()
                 or self.src.role != self.source_role)
        raise (CloneAgain if again else CloneFailed)(str(e).replace(str(self.images), str(self.logs))) from None

    def _let_primary_go(self):
        """A primary held still goes on: once CRIU has it frozen (its
        threads cannot move until CRIU lets them), or the dump is over."""
        if self.held_at is not None:
            quiesce.release(self.src.stream)
            self.held_ms = (time.monotonic() - self.held_at) * 1000
            self.held_at = None

    @property
    def source_role(self) -> str:
        return "primary" if self.of_primary else "backup"

    def figures(self, dump_s: float, restore_s: float) -> dict:
        """What the checkpoint cost, for llft-status."""
        return {"source": self.src.index, "of_primary": self.of_primary, "census_ms": round(self.census_ms, 1),
                "held_ms": round(self.held_ms, 1),
                "frozen_ms": round(self.dump_stats.get("frozen_time", 0) / 1000, 1),
                "frozen_work_ms": round(self.frozen_work_ms, 1), "dump_ms": round(dump_s * 1000, 1),
                "restore_ms": round(restore_s * 1000, 1), "image_bytes": self.image_bytes, "at": self.taken_at}

    def keep_logs(self, drop_images: bool = True):
        """CRIU's logs and figures into the run dir; the images are dropped
        (a stored checkpoint's once it is restored or dropped)."""
        if not self.images.exists():
            return
        restore.keep_logs(self.images, self.logs)
        if drop_images:
            shutil.rmtree(self.images, ignore_errors=True)

    # -- before the dump -----------------------------------------------------------
    def _prepare(self):
        for d in (self.images, self.logs):
            if d.exists():
                shutil.rmtree(d)
        self.images.mkdir(parents=True)
        self.image_bytes = 0
        self.prepare_replica(self.src.stream.capacity)

    def prepare_replica(self, slots: int):
        """The replica the restore makes: its ring (slots long), its
        directory, its view of the files."""
        g, k = self.g, self.k
        path = stream_path(g.run_id, k)
        if os.path.exists(path):
            os.unlink(path)
        stream = StreamFile(path, create=True, slots=slots, role=ROLE_BACKUP, replica=k)
        out_dir = self.logs / "replica" if self.store else g.run_dir / f"replica-{k}"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        self.clone = RestoredReplica(k, stream, out_dir, private_files=self.src.private_files,
                                     serialize=self.src.serialize, source=self.src.index)
        if self.src.private_files:
            self.files_plan = private_files.prepare(self.clone.files_dir)

    def _externals(self) -> list[str]:
        """What CRIU is to leave out of the image, and the restore gives
        anew: the sockets whose other end is this controller's, and the
        files the controller opened for the replica (its ring, the library,
        stdio), which the clone gets its own of.  (Asked again once the
        source is frozen: a socket may come meanwhile.)"""
        self.files_at_dump = self._controller_files()
        return ([f"unix[{ino}]" for _fd, ino, _peer in sockets.foreign_peers(self.src.pid)]
                + [key for _fd, key, _what in self.files_at_dump])

    def _controller_files(self) -> list[tuple[int, str, str]]:
        return restore.controller_files(self.src.pid, self.src.stream.path, self.src.out_dir)

    # -- while the source is frozen ------------------------------------------------
    def _frozen(self) -> list[str]:
        """Runs in CRIU's dump thread once the source is frozen; returns
        the externals found since the dump began."""
        t0 = time.monotonic()
        self._copy_files()
        t1 = time.monotonic()
        plan = asyncio.run_coroutine_threadsafe(self._frozen_in_loop(), self.loop).result(FROZEN_STEP_S)
        t2 = time.monotonic()
        try:
            for conn_id, fd in plan["live"]:
                with sockets.take_fd(self.src.pid, fd) as theirs_now:
                    theirs = self._give_conn(conn_id, sockets.unread(theirs_now))
                    sockets.same_settings(theirs_now, theirs)
                    self.inherit.append((theirs, f"socket:[{sockets.inode(theirs_now)}]"))
            self._copy_ring()
        finally:
            self.g.plane.release(self.src_slot)
            self.held = False
            self._let_primary_go()
        self.files_at_dump = self._controller_files()
        self.frozen_work_ms = (time.monotonic() - t0) * 1000
        log.debug("frozen work: files %.1f ms, loop %.1f ms, sockets and ring %.1f ms", (t1 - t0) * 1000,
                  (t2 - t1) * 1000, (time.monotonic() - t2) * 1000)
        return plan["externals"] + [key for _fd, key, _what in self.files_at_dump]

    def _give_back(self):
        """The connections taken from the source's listeners go back, in
        their order, once the dump is over: the source accepts again then,
        which a queue full of them may need."""
        taken, self.taken = self.taken, []
        for e in sockets.give_back(taken, GIVE_BACK_S):
            log.error("replica %d: a connection waiting to be accepted could not be given back (%s)",
                      self.src.index, e)
        self.loop.call_soon_threadsafe(setattr, self.src.channel, "handing_held", False)

    def _copy_files(self):
        """stdout and stderr so far, and with private files the upper layers."""
        for name in ("stdout", "stderr"):
            shutil.copyfile(self.src.out_dir / name, self.clone.out_dir / name)
            self.stdio[name] = open(self.clone.out_dir / name, "ab")
        if self.src.private_files:
            private_files.copy_uppers(self.src.files_dir, self.clone.files_dir)

    async def _frozen_in_loop(self) -> dict:
        """The part that must not interleave with the relays and the
        gateway: the plane's clone slot, the sockets' inventory, the
        connections in flight, the clone's relay."""
        g, src = self.g, self.src
        if src.role != self.source_role or not src.alive():
            raise CloneAgain(f"replica {src.index} is no longer a live {self.source_role}")
        src.channel.handing_held = True   # until the listeners' queues are given back (_give_back)
        src.channel._readable()   # what the source said on its channel before it froze
        self.src_slot = g._relay_of(src).slot
        log_dir = self.clone.out_dir / "output" if g.opts.log_output else None
        if log_dir is not None:
            log_dir.mkdir(exist_ok=True)   # the plane copies the source's logs there
        self.slot, legs = g.plane.clone_replica(self.src_slot, log_dir)
        self.held = True
        by_leg = {ino: conn_id for conn_id, ino, state in legs if state == LEG_LIVE and ino}
        listeners = {sockets.inode(s): key for key, s in src.channel.listeners.items()}
        live, seen, externals, socks = [], set(), [], set()
        for fd, ino, peer in sockets.foreign_peers(src.pid):
            if ino in socks:
                continue   # a second fd of one socket (frozen between a dup and a close: an fd being placed)
            socks.add(ino)
            externals.append(f"unix[{ino}]")
            if peer == sockets.inode(src.channel.ours):
                self._inherit(fd, self.clone.channel.theirs, ino)
            elif peer in listeners:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                ours.setblocking(False)
                self.clone.channel.listeners[listeners[peer]] = ours
                self._inherit(fd, theirs, ino)
                self._requeue(fd, src.channel.listeners[listeners[peer]], ours, by_leg, seen)
            elif peer in by_leg:
                live.append((by_leg[peer], fd))
                seen.add(by_leg[peer])
            else:
                raise CloneFailed(f"its fd {fd} is a socket llft cannot give a clone (an outgoing connection "
                                  "or a UDP port)")
        missing = set(by_leg.values()) - seen
        if missing:
            raise CloneFailed(f"connection {min(missing)} is neither open in it nor waiting to be accepted")
        self.relay = PlaneRelay(self.clone, g.plane, log_dir=log_dir, slot=self.slot)
        self.unhanded = list(g._relay_of(src).unhanded.values())
        self.frozen_last_id = g.inputs.newest() if g.inputs is not None else 0
        if not self.store:
            g.gateway.add_clone_relay(self.relay, self.unhanded)
        return {"live": live, "externals": externals}

    def _requeue(self, fd: int, src_ours: socket.socket, clone_ours: socket.socket, by_leg: dict, seen: set):
        """The connections handed to the source and not accepted yet wait
        in its listener's queue, which CRIU cannot dump: they are taken out
        until the dump is written (_give_back), and the clone's listener
        gets a socket of its own for each, in the same order, primed with
        what is queued on the source's."""
        with sockets.take_fd(self.src.pid, fd) as lsock:
            waiting = sockets.take_handed(lsock)
        self.taken.append((src_ours, waiting))
        for s, conn_id in waiting_conns(waiting, by_leg):
            seen.add(conn_id)
            theirs = self._give_conn(conn_id, sockets.unread(s))
            sockets.send_handed(clone_ours, theirs, 0.0)   # (a new queue: it holds what the source's held)
            theirs.close()

    def _give_conn(self, conn_id: int, prefix: bytes) -> socket.socket:
        """A new socketpair for the clone's side of connection conn_id: the
        plane's end attached with prefix first; the program's end is
        returned."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.g.plane.clone_attach(self.slot, conn_id, ours, prefix)
        return theirs

    def _inherit(self, fd: int, theirs: socket.socket, ino: int):
        """theirs takes the place of the source's socket fd (inode ino) in
        the clone, set up as the program set that one up."""
        with sockets.take_fd(self.src.pid, fd) as now:
            sockets.same_settings(now, theirs)
        self.inherit.append((theirs, f"socket:[{ino}]"))

    def _copy_ring(self):
        """The clone's ring as the source's is now, joined to the backend:
        every record sent so far is in the source's ring (waited for), and
        every record sent from here on reaches the clone too."""
        if self.of_primary:
            self._follow_primary()
            return
        g = self.g
        src_sink = g.sinks[self.src.index]
        fwd = g.forwarder
        with fwd.lock:
            if fwd.promoting or self.src.role != "backup":
                raise CloneAgain("a failover began meanwhile")   # (its PROMOTE is written outside the lock)
            deadline = time.monotonic() + SENT_WAIT_S
            while src_sink.delivered < fwd.sent:
                if time.monotonic() > deadline or src_sink.dead:
                    raise CloneFailed("the source's ring did not receive the records sent to it in time")
                time.sleep(0.0005)
            self.clone.stream.copy_from(self.src.stream, self.k)
            self.sink = BackupSink(self.k, self.clone.stream, self.clone.alive)
            self.sink.delivered = src_sink.delivered
            if self.store:
                self.history_at = fwd.saver.position   # what follows waits in the saved stream
            else:
                g.ordering.add(self.sink)

    def _follow_primary(self):
        """A primary's clone: its ring, empty, joins the backend once every
        record the primary's holds has been sent (the primary is frozen, and
        was held: its ring holds no call half recorded), so the clone
        replays exactly what the primary records from its checkpoint on."""
        g, fwd = self.g, self.g.forwarder
        deadline = time.monotonic() + SENT_WAIT_S
        while True:
            with fwd.lock:
                if fwd.promoting or self.src.role != "primary" or self.src.stream.role != ROLE_PRIMARY:
                    raise CloneAgain("a failover began meanwhile")
                if fwd.sent_all_of(self.src.stream):
                    self.clone.stream.copy_from(self.src.stream, self.k)
                    self.clone.stream.role = ROLE_COPY
                    self.sink = BackupSink(self.k, self.clone.stream, self.clone.alive)
                    self.sink.delivered = fwd.sent
                    if self.store:
                        self.history_at = fwd.saver.position
                    else:
                        g.ordering.add(self.sink)
                    return
            if time.monotonic() > deadline:
                raise CloneFailed(f"the record pump did not read the primary's ring in time (read up to "
                                  f"{fwd.sent_to}, written up to {self.src.stream.head})")
            time.sleep(0.0005)

    # -- the restore -----------------------------------------------------------------
    def restore(self) -> tuple[int, subprocess.Popen]:
        try:
            return restore.restore(self.images, self.listed, self.files_at_dump, self.inherit,
                                   self.clone.stream.path, self.stdio,
                                   self.files_plan if self.src.private_files else None)
        except restore.RestoreFailed as e:
            raise CloneFailed(str(e)) from None

    def close_inherited(self):
        for obj in [sock for sock, _key in self.inherit] + list(self.stdio.values()):
            obj.close()
        self.inherit.clear()
        self.stdio.clear()

    # -- afterwards -------------------------------------------------------------------
    def adopt(self, pid: int, proc: subprocess.Popen, checkpoint: dict):
        g, r = self.g, self.clone
        r.proc, r.program_pid, r.checkpoint = proc, pid, checkpoint
        r.started = start_time(pid)
        r.channel.started()
        g.plane.set_pid(self.slot, pid)
        g.sinks[self.k] = self.sink
        g.adopt(r, self.relay)

    def undo(self):
        g = self.g
        if self.held:
            g.plane.release(self.src_slot)
        if self.relay is not None:
            g.gateway.remove_relay(self.relay)
        elif self.slot is not None:
            g.plane.remove_replica(self.slot)
        if self.sink is not None:
            self.sink.dead = True
            if self.sink in g.ordering.members():   # (a stored checkpoint's never joined it)
                g.ordering.remove(self.sink, crashed=True)
        if self.clone is not None:
            self.clone.channel.close()
            self.clone.stream.close()
            self.clone.stream.unlink()
