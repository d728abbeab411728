"""The record streams of the processes a replica forks (llft-run --fork
replicate; native/fork_stream.c).

Each forked process makes a stream of its own and hands it to the
controller on its replica's channel, under an id every replica derives
alike.  Per id, the primary's child's ring is the source and each
backup's child's ring a sink, with a record pump of its own (the root
stream's RecordForwarder) that keeps the stream's history, so that a
backup's child, which exists only once its parent has replayed the fork,
catches up from it whenever it comes (CatchUpFeeder).  A stream ends, for
the backups, when the primary's child has exited while its replica lives
(END); when the primary fails, every stream's successor is the
successor's child of that id, promoted once it has replayed the failed
child's records to their end, as the replica's own stream is."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import select
import signal
from pathlib import Path
from typing import Callable

from llft.determinizer.catchup import CatchUpFeeder
from llft.determinizer.forwarder import RecordForwarder
from llft.determinizer.streams import BackupSink, PrimarySource, SavedStreamWriter
from llft.members import dying, process_stat, running
from llft.native import ROLE_PRIMARY, StreamError, StreamFile
from llft.ordering.backend import RecordOrdering

log = logging.getLogger("llft.forked")

DYING_RECHECK_S = 0.02   # how soon to look again at a dying replica's exit status


def _session(pid: int) -> int | None:
    fields = process_stat(pid)
    return int(fields[3]) if fields else None


class ForkedStream:
    """One forked process, at every replica."""

    def __init__(self, stream_id: int, saved: Path, ordering: Callable[[int], RecordOrdering]):
        self.id = stream_id
        self.saved = saved
        self.ordering = ordering   # (stream id) -> the backend that carries its records
        self.files: dict[int, StreamFile] = {}   # replica index -> its process's stream
        self.sinks: dict[int, BackupSink] = {}
        self.feeders: list[CatchUpFeeder] = []
        self.forwarder: RecordForwarder | None = None
        self.ordering_closed = False
        self.source = None
        self.owner: int | None = None             # the replica whose process is the source
        self.successor: int | None = None         # takes over once its process hands its stream over
        self.pidfd: int | None = None             # the source's process (pidfds name one process for good)
        self.on_promoted = None                   # (replica index) -> None
        self.on_chunk = None                      # (records) -> None: the accepts among them routed

    def start(self, source, owner: int):
        self.source, self.owner = source, owner
        self.forwarder = RecordForwarder(source, [], self.ordering(self.id), SavedStreamWriter(self.saved))
        self.forwarder.name = f"llft-fork-{self.id:016x}"
        self.forwarder.on_chunk = self.on_chunk
        self.forwarder.start()
        for sink in self.sinks.values():
            self._catch_up(sink)

    def _catch_up(self, sink: BackupSink):
        feeder = CatchUpFeeder(self.forwarder, sink)
        self.feeders.append(feeder)
        feeder.start()

    def add_backup(self, index: int, stream: StreamFile):
        pid = stream.attached_pid
        sink = BackupSink(index, stream, lambda: running(pid))
        self.sinks[index] = sink
        if self.forwarder is not None:
            self._catch_up(sink)
        if self.successor == index:
            self._promote(index)

    def fence(self, wait_s: float = 1.0):
        """The failed primary's process of this id: killed (a setsid one
        escapes its replica's process group), and gone before its ring is
        drained, so that nothing is written into it after."""
        if self.pidfd is None:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not select.select([self.pidfd], [], [], wait_s)[0]:
            log.warning("the failed primary's forked process of stream %x did not end within %.1f s", self.id,
                        wait_s)
            return
        try:   # its parent died first: llft-run, the subreaper, has it to reap
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except (ChildProcessError, OSError):
            pass   # (its parent's to reap)

    def fail_over(self, successor: int):
        """The primary failed (its processes are gone): the successor's
        process of this id takes over, now or once it exists."""
        if self.forwarder is not None and self.forwarder.ended:
            return
        self.successor = successor
        if successor in self.sinks:
            self._promote(successor)

    def _promote(self, index: int):
        self.successor = None
        sink, new_source = self.sinks.pop(index), PrimarySource(self.files[index])
        if self.forwarder is None:
            # No process of the failed primary's handed this stream over:
            # there is no record to forward first, and the successor's
            # process takes over at once (the other replicas' follow it).
            if not sink.stream.write_promote(timeout_ms=5000):
                log.error("replica %d: could not tell its process of stream %x to take over", index, self.id)
            self.start(new_source, index)
        else:
            self.forwarder.fail_over(new_source, sink)
            old, self.source, self.owner = self.source, new_source, index
            old.finish()
        if self.on_promoted is not None:
            self.on_promoted(index)

    def ended(self) -> bool:
        return self.forwarder is not None and self.forwarder.ended and not any(f.is_alive() for f in self.feeders)

    def watch(self, pid: int) -> int | None:
        """A pidfd of the source's process pid (None if it is gone)."""
        self.forget_pidfd()
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:
            self.pidfd = None
        return self.pidfd

    def forget_pidfd(self):
        if self.pidfd is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.pidfd)
            except RuntimeError:
                pass
            os.close(self.pidfd)
            self.pidfd = None

    def close(self, keep_history: bool = False):
        """Ends it for everyone, and forgets its history unless
        keep_history (--respawn: a replacement's process of this id, forked
        as its replay reaches the fork, replays it, then its end)."""
        if self.source is not None:
            self.source.finish()
        if self.forwarder is not None:
            self.forwarder.join(timeout=5)
        for feeder in self.feeders:
            feeder.join(timeout=5)
        self.forget_pidfd()
        if (self.forwarder is None or not self.forwarder.is_alive()) and not any(f.is_alive() for f in self.feeders):
            if self.forwarder is not None and not self.ordering_closed:
                self.ordering_closed = True   # (a late joiner of an ended stream is given END without it)
                self.forwarder.ordering.close()
            for f in self.files.values():   # (a thread still at it would read freed memory)
                f.close()
        if keep_history:
            self.source = None   # (its stream is closed: the pump kept what it needs, the exit status)
            return
        try:
            self.saved.unlink()
        except OSError:
            pass


class ForkedStreams:
    """Every forked process's stream of one group on this host.  group
    answers replicas and replica_at(index)."""

    def __init__(self, group, run_dir: Path, routes, ordering: Callable[[int], RecordOrdering]):
        self.group = group
        self.routes = routes   # which process accepted each connection (llft/serving/routes.py)
        self.ordering = ordering   # (stream id) -> a backend of the group's --order for that stream
        self.dir = run_dir / "forks"
        self.streams: dict[int, ForkedStream] = {}
        self.drops = 0
        self.shared_memory: str | None = None   # said once: the first memory processes were found to share

    def handed_over(self, replica, msg, fd: int):
        """A process of replica's forked under stream id msg.stream: its
        stream file is fd (ours to close)."""
        try:
            stream = StreamFile(f"{replica.out_dir}/fork-{msg.stream:016x}", fd=fd)
        except StreamError as e:
            self.drops += 1
            log.warning("replica %d: a forked process's stream is unusable: %s", replica.index, e)
            return
        finally:
            os.close(fd)
        if stream.stream_id != msg.stream:
            self.drops += 1
            log.warning("replica %d: a forked process's stream says it is %x, its message %x", replica.index,
                        stream.stream_id, msg.stream)
            stream.close()
            return
        self.dir.mkdir(exist_ok=True)
        s = self.streams.get(msg.stream)
        if s is None:
            s = self.streams[msg.stream] = ForkedStream(msg.stream, self.dir / f"{msg.stream:016x}", self.ordering)
            s.on_promoted = lambda index, s=s: self._watch_exit(s, self.group.replica_at(index), s.files[index].attached_pid)
            s.on_chunk = functools.partial(self.routes.accepted, s.id)
        if replica.index in s.files:
            self.drops += 1
            log.warning("replica %d handed over the stream %x twice; the second is ignored", replica.index,
                        msg.stream)
            stream.close()
            return
        s.files[replica.index] = stream
        log.debug("replica %d: forked process %d has stream %x (parent %x, %s)", replica.index,
                  stream.attached_pid, msg.stream, msg.parent, "primary" if msg.type == ROLE_PRIMARY else "backup")
        if msg.type == ROLE_PRIMARY and stream.shared_memory and self.shared_memory is None:
            self.shared_memory = stream.shared_memory
            log.warning("the program's processes share memory (%s, mapped before process %d was forked): what one "
                        "writes there and another reads is not ordered by llft, and a backup that reads otherwise "
                        "than its primary diverges and is reported (docs/forked-processes.md)",
                        stream.shared_memory, stream.attached_pid)
        if msg.type == ROLE_PRIMARY:
            if s.forwarder is not None:
                self.drops += 1
                log.warning("replica %d: a second primary process for stream %x; ignored", replica.index, msg.stream)
                return
            s.start(PrimarySource(stream), replica.index)
            self._watch_exit(s, replica, stream.attached_pid)
        else:
            if s.forwarder is None and replica.role == "primary":
                # The new primary's process forked it while being taken over
                # (before its fork was on record), so it came as a backup's;
                # no other replica's process began this stream: it is the
                # stream's primary process.
                s.fail_over(replica.index)
            s.add_backup(replica.index, stream)

    def _watch_exit(self, s: ForkedStream, replica, pid: int):
        """The primary's process of s ends the stream when it exits, unless
        its replica failed: a failed primary's processes are failed over
        instead (fail_over).  A process its replica's death ended (SIGPIPE
        on a pipe to it) exits before that death is known here, so while the
        replica's first process is dying its exit status is waited for."""
        loop = asyncio.get_running_loop()
        fd = s.watch(pid)

        def decide():
            if replica.alive() and dying(replica.pid):
                loop.call_later(DYING_RECHECK_S, decide)
                return
            # (a replica being stopped dies of the SIGTERM, and its processes end as its group does)
            killed = not replica.alive() and replica.status >= 128 and not replica.stopping
            if s.owner == replica.index and not killed:
                s.source.finish()

        def exited():
            if fd is not None:
                loop.remove_reader(fd)
            decide()
        if fd is None:
            exited()
        else:
            loop.add_reader(fd, exited)

    def fail_over(self, failed, successor):
        """The group's primary failed and successor takes over: so does
        each of its processes, once the failed one's are gone."""
        failed.channel.read_pending()   # every stream its processes handed over before they died
        failing = [s for s in self.streams.values() if s.owner in (failed.index, None)]
        for s in failing:
            s.fence()
        for s in failing:
            s.fail_over(successor.index)

    def files_of(self, index: int) -> list[StreamFile]:
        """Replica index's processes' streams, those still open."""
        return [s.files[index] for s in self.streams.values() if index in s.files and s.files[index].ctl is not None]

    def caught_up(self, index: int) -> bool:
        """Replica index (a replacement catching up) has a process of every
        stream whose primary process runs, each fed the stream's history
        and following it live, with that history replayed: it could take
        over the program's every process."""
        for s in self.streams.values():
            if s.forwarder is None or s.forwarder.ended or s.owner == index:
                continue
            sink = s.sinks.get(index)
            feeder = next((f for f in s.feeders if f.sink is sink), None)
            if sink is None or feeder is None or feeder.joined_at is None or s.files[index].records < feeder.records:
                return False
        return True

    def refusal(self) -> str | None:
        """What a forked process did that llft cannot replicate (its shim
        says so in its control block), or None."""
        for s in self.streams.values():
            for f in s.files.values():
                if f.ctl is not None and f.refused:
                    return f"cannot replicate the program: {f.divergence}"
        return None

    def daemon_of(self, replica, first: int, primary=None) -> int | None:
        """A process of replica's still running in a session other than its
        first process's (pid first), or one its first process waited for as
        it began (a daemon that stays in its parent's session, whose parent
        exits once it has its word, as it goes on unreplicated), or None.
        A backup's is its process of the stream the primary went on as, in
        whatever session (the backup's may not have reached its setsid
        yet)."""
        if primary is not None and primary is not replica and primary.adopted:
            for s in self.streams.values():
                mine, theirs = s.files.get(replica.index), s.files.get(primary.index)
                if mine is not None and theirs is not None and theirs.attached_pid == primary.adopted:
                    return mine.attached_pid if running(mine.attached_pid) else None
        for s in self.streams.values():
            f = s.files.get(replica.index)
            if f is None or f.ctl is None:
                continue
            pid = f.attached_pid
            if running(pid) and (f.waited_for or _session(pid) not in (None, first)):
                return pid
        return None

    def diverged_backups(self) -> dict[int, list]:
        """Backups one of whose forked processes stopped on a divergence:
        replica index -> those processes' streams."""
        out: dict[int, list] = {}
        for s in self.streams.values():
            for index, f in s.files.items():
                if index in s.sinks and f.ctl is not None and f.diverged:
                    out.setdefault(index, []).append(f)
        return out

    def backup_failed(self, index: int):
        for s in self.streams.values():
            sink = s.sinks.get(index)
            if sink is not None:
                sink.dead = True

    def tidy(self):
        """Closes the streams that have ended for everyone, every live
        backup's process of it included, and forgets them (their saved
        history with them) unless a replacement may need them (--respawn)."""
        backups = [r.index for r in self.group.replicas if r.role == "backup" and r.alive()]
        keep = self.group.opts.respawn
        for sid in [sid for sid, s in self.streams.items()
                    if s.ended() and all(k in s.files for k in backups)
                    and any(f.ctl is not None for f in s.files.values())]:
            if keep:
                self.streams[sid].close(keep_history=True)
            else:
                self.streams.pop(sid).close()

    def close(self):
        """The group has ended: every stream with it (their histories too)."""
        for s in self.streams.values():
            s.close()
        self.streams.clear()
        try:
            self.dir.rmdir()
        except OSError:
            pass

    def state(self) -> dict:
        return {"streams": len(self.streams), "drops": self.drops, "shared_memory": self.shared_memory}
