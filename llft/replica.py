"""Starting one replica of the user's program under the preload library."""
from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from llft import PRELOAD_LIBRARY, private_files
from llft.members import running, start_time, stopped
from llft.native import (EXIT_DIVERGED, EXIT_NOSTREAM, LISTENER_ANY_PORT, ROLE_NAMES, ROLE_PRIMARY, StreamFile,
                         die_with_parent, disable_aslr, ignore_census_signals)
from llft.native_sockets import bypass_message, bypassing_ports
from llft.process_tree import end_orphans, end_process_group, group_runs
from llft.serving.channel import ProgramChannel

STOP_POLL_S = 0.02


def _child_setup(parent: int, files_plan: bytes | None):
    """Between fork and exec: no address randomisation, ordinary scheduling
    whatever the controller's (a member's runs at real-time priority:
    llft/cluster/priority.py), death with the controller, and the replica's
    own view of the files.  (PDEATHSIG follows the forking thread: replicas
    are started from the event loop, which lives as long as the controller.)"""
    disable_aslr()
    ignore_census_signals()
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    die_with_parent(parent)
    if files_plan is not None:
        private_files.enter(files_plan)


@dataclass
class Replica:
    index: int
    stream: StreamFile
    out_dir: Path
    proc: subprocess.Popen | None = None
    status: int | None = None           # exit status as a shell reports it (128+N for signal N)
    killed_by_llft: bool = False
    problems: list[str] = field(default_factory=list)
    role: str = ""
    started: float | None = None        # process start time: tells this pid from a recycled one
    replaces: int | None = None         # the failed replica this one was started to replace
    catch_up: dict | None = None        # a replacement's progress: records, ms, done
    replaced: bool = False              # failed, and a replacement has been started
    fenced_at: float | None = None      # time.monotonic() when llft-run fenced it (a timing fault)
    private_files: bool = False         # in its own view of the files, kept in files_dir
    serialize: bool = False             # --serialize: its threads take turns (native/serialize.c)
    checkpointing: bool = False         # frozen by CRIU for a checkpoint of it: not a timing fault
    frozen_since: float | None = None   # time.monotonic() when first seen stopped, while it stays so
    forked_streams: list = field(default_factory=list)   # --fork replicate: its processes' streams, when one diverged
    # --fork replicate: (its first process's pid) -> a process of the replica
    # that goes on as it once that process has exited (a daemon whose parent
    # waited for its word), or None; adopted: that process, once it has.
    adopt: Callable[[int], int | None] | None = None
    adopted: int | None = None
    first_status: int | None = None      # its first process's exit status, once adopted
    stopping: bool = False               # stop_replicas: its processes are let end by themselves for a while
    # --fork replicate: the streams of the processes it forked, still open
    forked_files: Callable[[], list[StreamFile]] = lambda: []

    def __post_init__(self):
        self.role = ROLE_NAMES.get(self.stream.role, "?")
        self.channel = ProgramChannel(self.index)   # the program's sockets reach the controller through it
        self.channel.ports.in_use = self.ports_held

    def listeners(self, socktype: int = socket.SOCK_STREAM) -> list[tuple[int, int, str]]:
        """The ports the replica's processes serve (StreamFile.listeners):
        its first process's, and those of the processes it forked (a start
        script's server, run as its child)."""
        out = self.stream.listeners(socktype)
        for f in self.forked_files():
            out += [entry for entry in f.listeners(socktype) if entry not in out]
        return out

    def ports_held(self) -> set[int]:
        """Every port the replica's processes listen on or have bound."""
        return {port for socktype in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_DGRAM | LISTENER_ANY_PORT)
                for port, _family, _addr in self.listeners(socktype)}

    @property
    def files_dir(self) -> Path | None:
        """Where what this replica writes goes (llft/private_files.py)."""
        return self.out_dir / "files" if self.private_files else None

    @property
    def pid(self) -> int | None:
        return self.adopted or (self.proc.pid if self.proc else None)

    def start(self, argv: list[str], base_env: dict[str, str]):
        env = dict(base_env)
        # The stream file and the library go down as fds, not names: a
        # program that drops its privileges before an exec could open
        # neither name (a checkout in a private home, say).  procfs takes no
        # leading zero, so the library's number is padded with slashes.
        stream_fd = os.open(self.stream.path, os.O_RDWR | os.O_CLOEXEC)
        library_fd = os.open(PRELOAD_LIBRARY, os.O_RDONLY | os.O_CLOEXEC)
        preload = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"/proc/self/fd/{library_fd:/>5}{' ' + preload if preload else ''}"
        env["LLFT_SHM"] = f"fd:{stream_fd:05d}"     # one length for all: the same stack layout
        env["LLFT_REPLICA"] = f"{self.index:03d}"
        env.pop("LLFT_SERIALIZE", None)
        if self.serialize:
            env["LLFT_SERIALIZE"] = "1"
        env["LLFT_CHANNEL"] = f"{self.channel.child_fd():05d}"
        files_plan = private_files.prepare(self.files_dir) if self.private_files else None
        try:
            with open(self.out_dir / "stdout", "wb") as out, open(self.out_dir / "stderr", "wb") as err:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                             preexec_fn=functools.partial(_child_setup, os.getpid(), files_plan),
                                             start_new_session=True, close_fds=True,
                                             pass_fds=(self.channel.child_fd(), stream_fd, library_fd))
        except subprocess.SubprocessError:
            raise OSError(f"replica {self.index} could not start: "
                          + (self.last_words() or "its set-up between fork and exec failed")) from None
        finally:
            os.close(stream_fd)
            os.close(library_fd)
        self.channel.started()
        self.started = start_time(self.proc.pid)

    def unreplicable(self) -> str | None:
        """What this replica's processes did that llft cannot replicate, or
        None: a forked child that reached a client (the shim says so in the
        control block), or a port held natively, around the gateway."""
        if self.stream.refused:
            return f"cannot replicate the program: {self.stream.divergence}"
        if not self.alive():
            return None
        ports = bypassing_ports(self.pid)
        return bypass_message(self.index, self.pid, ports) if ports else None

    def poll(self) -> int | None:
        if self.status is None and self.adopted is not None:
            self.status = adopted_status(self.adopted)
        elif self.status is None and self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                status = rc if rc >= 0 else 128 - rc
                daemon = self.adopt(self.proc.pid) if self.adopt is not None and status < 128 else None
                if daemon:
                    # Its process group is left alone: the daemon may be in
                    # it (one that stays in its parent's session, or a
                    # backup's not yet at its setsid), and SIGKILL to the
                    # group would kill it.  What else is there ends with the
                    # replica (release_replicas).
                    self.adopted, self.first_status = daemon, status
                    self.started = start_time(daemon)
                else:
                    if not self.stopping:   # what it forked goes with it (a daemon has a session of its own)
                        end_process_group(self.proc.pid)
                    self.status = status
        return self.status

    def alive(self) -> bool:
        return self.poll() is None

    def took_over(self) -> bool:
        """Its process records as the primary: the first primary, or a
        successor that has replayed its predecessor's records to their end.
        One still replaying them (llft-run names it primary from the moment
        it is chosen) is a backup to its processes: its replayed accepts
        take their connections from their inboxes (--fork replicate).  A
        replica gone on as a daemon it forked counts as the name says."""
        return self.role == "primary" and (self.stream.role == ROLE_PRIMARY or self.adopted is not None)

    def frozen(self) -> bool:
        """Stopped (SIGSTOP, or stopped by a debugger): a timing fault once it lasts."""
        return stopped(self.pid)

    def frozen_for(self, now: float) -> float:
        """Seconds this replica has been stopped (SIGSTOP, a debugger; not
        CRIU's holds) as seen by the calls so far; 0 if it runs: a timing
        fault once longer than the fault timeout."""
        if self.checkpointing or not self.alive() or not self.frozen():
            self.frozen_since = None
            return 0.0
        if self.frozen_since is None:
            self.frozen_since = now
        return now - self.frozen_since

    def refusal(self) -> str | None:
        """Why llft cannot replicate the program, if the shim refused it here."""
        return f"cannot replicate the program: {self.stream.divergence}" if self.stream.refused else None

    def dying(self) -> bool:
        """True once the process has begun to exit (PF_EXITING), even before it
        can be reaped: its sockets close then, and that is no program's close."""
        if self.proc is None or self.poll() is not None:
            return True
        try:
            stat = open(f"/proc/{self.pid}/stat").read()
        except OSError:
            return True
        fields = stat[stat.rindex(")") + 2:].split()
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & 0x4)

    def last_words(self) -> str:
        """The last line the program wrote on its stderr ("" if none)."""
        try:
            lines = (self.out_dir / "stderr").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def divergence_advice(self) -> str:
        """What to try about a divergence of this replica."""
        if self.serialize:
            return ("it ran under --serialize, so its threads took turns in the primary's order: a divergence "
                    "then comes from elsewhere (docs/determinizer.md)")
        return ("a program whose threads share memory outside the locks llft orders (atomics, unlocked "
                "variables) diverges so: run it with --serialize (docs/determinizer.md)")

    def report_divergence(self) -> tuple[str, Path]:
        """What stopped this backup, kept in its dir (divergence.txt) with
        its backtrace, whatever the program did with its stderr."""
        before = ""
        stream = next((f for f in [self.stream, *self.forked_streams] if f.diverged), None)
        if stream is not None:   # (a process it forked, with --fork replicate)
            what, where = stream.divergence, stream.divergence_where
            before = stream.divergence_before
        else:
            what, where = f"exited with status {self.status} while its primary ran (see its stderr)", ""
        report = self.out_dir / "divergence.txt"
        report.write_text(what + ("\n\nwhere the backup was (innermost first):\n" + where if where else "\n")
                          + ("\nthis thread's calls before it, as the primary recorded them (newest first):\n"
                             + before if before else ""))
        return what, report

    def end_problem(self, expected: int | None) -> str | None:
        """Why this backup's end is not its primary's (which ended with
        status expected, None if unknown), or None."""
        if self.stream.diverged:
            return self.stream.divergence
        if self.status == EXIT_DIVERGED:
            return "stopped on a divergence (see its stderr)"
        if self.status == EXIT_NOSTREAM:
            return "stopped: its record stream is missing or incomplete (see its stderr)"
        if expected is not None and self.status != expected and not self.killed_by_llft:
            return f"exited with status {self.status}, the primary with {expected}"
        return None

    def state(self) -> dict:
        """What llft-status shows of this replica, whatever runs it (a local
        group, a member of a group across hosts)."""
        return {"index": self.index, "role": self.role, "pid": self.pid, "started": self.started,
                "stream": self.stream.path, "files": self.files_dir and str(self.files_dir),
                "status": self.status, "records": self.stream.records,
                "serial_steals": self.stream.serial_steals, "clock_offsets_ns": self.stream.clock_offsets()}

    def signal(self, sig: int):
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def own_group(self) -> int | None:
        """The process group its first process leads, while that process
        is the replica (not a daemon it went on as, nor a restored copy)."""
        return self.proc.pid if self.proc is not None and self.adopted is None and self.pid == self.proc.pid else None

    def terminate(self):
        """SIGTERM to the replica's processes, as a service manager stops a
        service: its first process's process group (the server a start
        script runs, with the script), or the daemon it goes on as."""
        for f in [self.stream, *self.forked_files()]:
            f.stopping = True
        group = self.own_group()
        if self.alive() and group is not None:
            try:
                os.killpg(group, signal.SIGTERM)
                return
            except (ProcessLookupError, PermissionError):
                pass
        self.signal(signal.SIGTERM)

    def still_running(self) -> bool:
        """Whether a process of the replica runs: its first (or the daemon
        it went on as), or one of its process group."""
        group = self.own_group()
        return self.alive() or (group is not None and group_runs(group))

    def kill(self):
        self.killed_by_llft = True
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()
            self.poll()


@dataclass
class RestoredReplica(Replica):
    """A replica restored from a checkpoint of another (llft/checkpoint/):
    proc is the namespace it runs in (llft/checkpoint/restore_init.py,
    whose exit status is the program's), program_pid the program's pid as
    this controller sees it."""
    program_pid: int | None = None
    source: int | None = None            # the replica it was cloned from
    checkpoint: dict | None = None       # what the checkpoint cost: llft-status

    @property
    def pid(self) -> int | None:
        return self.program_pid

    def state(self) -> dict:
        return dict(super().state(), cloned_from=self.source, checkpoint=self.checkpoint)


def adopted_status(pid: int) -> int | None:
    """The exit status (as a shell reports it) of a process a replica went
    on as: llft-run is the subreaper of what the replicas leave, so it is
    llft-run's child to reap; None while it runs."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:   # not ours after all: all that can be told is whether it runs
        return None if running(pid) else 0
    if got == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def stop_replicas(replicas: Iterable[Replica], grace: float = 3.0):
    """Ends every replica: SIGTERM to its processes, then SIGKILL to
    what still runs after grace seconds.  Meanwhile they end by
    themselves, a start script's server too (SIGTERM may end the script
    at once, and the server its shutdown takes its time)."""
    for _ in _stop_looks(replicas, grace, None):
        time.sleep(STOP_POLL_S)


async def stop_replicas_in_loop(replicas: Iterable[Replica], grace: float = 3.0,
                                each: Callable[[], None] = lambda: None, lead: Replica | None = None):
    """stop_replicas, letting the event loop run meanwhile (a backup's
    forked process ends once the loop has seen its primary's end:
    llft/determinizer/forked.py), and calling each() at every look.
    With a lead (the group's primary, running), only the lead is
    signalled: its backups replay its handlers and its end from its
    records.  A real signal at a backup runs none of the program's
    handlers there (the primary's are replayed), ends a backup still
    behind its primary by the default action (it has not installed
    the handler yet), and can interrupt a call the shim does not
    record (a sleep) where the primary's was not."""
    for _ in _stop_looks(replicas, grace, lead):
        each()
        await asyncio.sleep(STOP_POLL_S)


def _stop_looks(replicas: Iterable[Replica], grace: float, lead: Replica | None):
    """The stop, one look at a time: yields while a replica still runs
    and grace has not run out; then kills what runs."""
    replicas = list(replicas)
    signalled = [lead] if lead is not None and lead.still_running() else replicas
    for r in replicas:
        r.stopping = True
    for r in signalled:
        r.terminate()
    end = time.monotonic() + grace
    while any(r.still_running() for r in replicas) and time.monotonic() < end:
        yield
    _stopped(replicas)


def _stopped(replicas: list[Replica]):
    for r in replicas:
        r.stopping = False
        if r.alive():
            r.kill()
        group = r.own_group()
        if group is not None:
            end_process_group(group)


def watch_exit(r: Replica, on_exit: Callable[[], None]):
    """Calls on_exit from the running event loop as soon as r's process
    exits (a pidfd turns readable), so that whatever follows (a failover,
    the member's end) starts at once rather than at the next poll."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(r.pid)
    except (OSError, AttributeError, TypeError):
        return

    def exited():
        loop.remove_reader(fd)
        os.close(fd)
        on_exit()
    loop.add_reader(fd, exited)


def release_replicas(replicas: Iterable[Replica]):
    """After a run: ends what the replicas left running in the background
    (llft/process_tree.py) and removes their record streams."""
    replicas = list(replicas)
    end_orphans(keep={r.pid for r in replicas if r.alive()})
    for r in replicas:
        r.stream.close()
        r.stream.unlink()
