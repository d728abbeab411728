"""CRIU as llft drives it: found and checked once, and a dump over CRIU's
RPC (`criu swrk`, the protocol pycriu speaks) whose notifications llft
answers itself, so that work can be done while the process is frozen
(pycriu's own dump() does not answer them).

CRIU >= 4.2 is needed: Debian bookworm's 3.17 fails `criu check` on this
kernel and 4.1 cannot dump inet sockets (../shared/notes/criu.md);
scripts/build-criu.sh builds 4.2 into /opt/criu."""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from llft.members import process_state

CRIU_PREFIX = Path(os.environ.get("LLFT_CRIU_PREFIX", "/opt/criu"))
# Where a passed `criu check` is remembered for this boot (the boot id is
# part of what is remembered, /run being no tmpfs on every machine): the
# check takes 60 ms or more, on the path of every newcomer joining and of
# every llft-run start.
CHECKED_DIR = Path(os.environ.get("LLFT_RUN_STATE", "/run/llft"))
MIN_VERSION = (4, 2)
RPC_MAX = 1 << 20
FULL_BELOW = 1 << 20     # free bytes under which an images directory counts as full


class CriuUnavailable(Exception):
    """No working CRIU here; the message says why."""


class CheckpointFailed(Exception):
    """CRIU could not dump or restore; the message says why (and where its log is)."""


@dataclass
class Criu:
    binary: str
    version: tuple[int, ...]

    @property
    def rpc(self):
        """pycriu.rpc: the protobuf messages."""
        return binding().rpc

    @property
    def images(self):
        """pycriu.images: reads and writes image files."""
        return binding().images


@functools.cache
def binding() -> SimpleNamespace:
    """pycriu, imported on first use: its protobuf descriptors take a
    quarter of a second to load, which find() (on the path of a newcomer
    joining) does not wait for; warm_up() loads it aside."""
    try:
        from pycriu import images, rpc
    except ImportError as e:
        raise CheckpointFailed(f"CRIU's Python binding pycriu cannot be loaded ({e})") from None
    return SimpleNamespace(images=images, rpc=rpc)


def warm_up() -> None:
    """Loads pycriu now (in a thread of the caller's choosing), so that the
    first dump or restore does not."""
    try:
        binding()
    except CheckpointFailed:
        pass   # (the first dump or restore says so)


def ordinary_priority():
    """Between fork and exec of CRIU (or its helper): ordinary scheduling.
    A member's controller runs at real-time priority (llft/cluster/priority.py)
    and a child takes its thread's: a `criu check` or a dump at real-time
    priority holds a core of this 2-core host for hundreds of milliseconds,
    and every replica and controller beside it misses its turn."""
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _version(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                             preexec_fn=ordinary_priority).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    m = re.search(r"Version:\s*(\d+(?:\.\d+)*)", out)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


@functools.cache
def find() -> Criu:
    """The CRIU to use, checked once (`criu check`); CriuUnavailable if none works."""
    candidates = [str(CRIU_PREFIX / "sbin" / "criu")]
    on_path = shutil.which("criu")
    if on_path:
        candidates.append(on_path)
    found = [(b, _version(b)) for b in candidates if os.access(b, os.X_OK)]
    usable = [(b, v) for b, v in found if v >= MIN_VERSION]
    if not usable:
        if found:
            raise CriuUnavailable(f"CRIU {'.'.join(map(str, found[0][1])) or '?'} at {found[0][0]} is too old "
                                  f"(llft needs {'.'.join(map(str, MIN_VERSION))} or later: scripts/build-criu.sh)")
        raise CriuUnavailable("CRIU is not installed (scripts/build-criu.sh builds it)")
    binary, version = usable[0]
    if os.geteuid() != 0:
        raise CriuUnavailable("CRIU needs root, and llft-run does not run as root")
    key = _check_key(binary)
    if not _checked_before(key):
        check = subprocess.run([binary, "check"], capture_output=True, text=True, preexec_fn=ordinary_priority)
        if check.returncode != 0:
            last = (check.stderr or check.stdout).strip().splitlines()
            raise CriuUnavailable(f"`{binary} check` fails on this kernel: {last[-1] if last else 'no output'}")
        _remember_checked(key)
    python_dir = str(CRIU_PREFIX / "lib" / "python")
    if python_dir not in sys.path and os.path.isdir(python_dir):
        sys.path.append(python_dir)
    if importlib.util.find_spec("pycriu") is None:
        raise CriuUnavailable("CRIU's Python binding pycriu is not installed (scripts/build-criu.sh installs it)")
    return Criu(binary, version)


def _check_key(binary: str) -> str | None:
    """What a passed `criu check` holds for: this boot of this kernel, and
    this very binary (a rebuilt or replaced CRIU is checked again)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        st = os.stat(binary)
    except OSError:
        return None
    return f"{boot} {os.uname().release} {os.path.realpath(binary)} {st.st_ino} {st.st_size} {st.st_mtime_ns}\n"


def _checked_before(key: str | None) -> bool:
    try:
        return key is not None and (CHECKED_DIR / "criu-checked").read_text() == key
    except OSError:
        return False


def _remember_checked(key: str | None) -> None:
    """Only a pass is remembered: a failure is looked at afresh each time
    (a module loaded, a setting changed, may mend it)."""
    if key is None:
        return
    try:
        CHECKED_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = CHECKED_DIR / f"criu-checked.{os.getpid()}"
        tmp.write_text(key)
        os.replace(tmp, CHECKED_DIR / "criu-checked")
    except OSError:
        pass   # (not remembered: checked again next time)


def problem() -> str | None:
    """Why CRIU cannot be used here (find's refusal), or None if it can."""
    try:
        find()
    except CriuUnavailable as e:
        return str(e)
    return None


def _swrk(criu: Criu, pid: int, keep_fd: int) -> tuple[socket.socket, subprocess.Popen]:
    """A `criu swrk` to talk RPC to, in the mount and PID namespaces of
    process pid: there a replica with private files has no mount tree of
    its own to dump and its paths are the program's, and a replica
    restored from a checkpoint (in a PID namespace of its own) is found
    under the pid it has there.  keep_fd stays open in it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = ["nsenter", f"--target={pid}", "--mount", "--pid", "--", criu.binary, "swrk", str(theirs.fileno())]
    proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(), keep_fd), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=ordinary_priority)
    theirs.close()
    return ours, proc


def namespace_pid(pid: int) -> int:
    """pid as its own PID namespace numbers it."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


# A dump whose process died meanwhile: CRIU may wait on it for good (seen
# with a primary killed while CRIU held it frozen for a stored checkpoint:
# no answer, and llft-run waited for one instead of failing over); it is
# given this long to say so itself, then stopped.
DEAD_SOURCE_GRACE_S = 1.0
WATCH_EVERY_S = 0.1


def _gone(pid: int) -> bool:
    """pid has exited (a zombie not yet reaped, or no more)."""
    state = process_state(pid)
    return state is None or state in "ZX"


def _exchange(sk: socket.socket, criu: Criu, req, pid: int, proc: subprocess.Popen):
    """req to CRIU, and its answer; CheckpointFailed (CRIU stopped) if
    process pid dies and CRIU does not answer within DEAD_SOURCE_GRACE_S."""
    sk.send(req.SerializeToString())
    dead_since = None
    while not select.select([sk], [], [], WATCH_EVERY_S)[0]:
        if dead_since is None and _gone(pid):
            dead_since = time.monotonic()
        if dead_since is not None and time.monotonic() - dead_since > DEAD_SOURCE_GRACE_S:
            proc.kill()
            raise CheckpointFailed(f"process {pid} died while CRIU dumped it, and CRIU did not say so")
    resp = criu.rpc.criu_resp()
    resp.ParseFromString(sk.recv(RPC_MAX))
    return resp


def dump(pid: int, images_dir: Path, *, externals: list[str], on_frozen, before_freeze=None) -> dict:
    """Dumps process pid (and its children) into images_dir, leaving it
    running.  CRIU asks which files are external once the process is
    frozen: on_frozen() runs then and returns more externals; what it
    reads of the process is of the instant the image holds, as the
    process stays frozen until the image is written.  Returns CRIU's dump
    statistics (frozen_time in us, ...); CheckpointFailed if CRIU fails or
    on_frozen raises (CRIU is then told, and thaws the process).

    before_freeze(), if given, runs when CRIU is about to freeze the
    process (its "pre-dump" notification): CRIU's own start-up is over by
    then, 30-50 ms on this machine, whose /run is no tmpfs and so keeps no
    cache of what CRIU learns of the kernel (its kerndat), and what the
    caller does to the process there lasts only until the freeze, a
    millisecond later.  Whatever it raises is raised again, the process
    untouched by CRIU."""
    criu = find()
    dir_fd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    sk, proc = _swrk(criu, pid, dir_fd)
    try:
        req = criu.rpc.criu_req(type=criu.rpc.DUMP)
        o = req.opts
        o.pid = namespace_pid(pid)
        o.images_dir_fd = -1   # (CRIU would look for it in this process, which its namespace may not show)
        o.images_dir = f"/proc/self/fd/{dir_fd}"
        o.leave_running = True
        o.log_level = 4
        o.log_file = "dump.log"
        o.notify_scripts = True
        o.external.extend(externals)
        failure, failed_at = None, None
        resp = _exchange(sk, criu, req, pid, proc)
        while resp.type == criu.rpc.NOTIFY:
            ack = criu.rpc.criu_req(type=criu.rpc.NOTIFY, notify_success=True)
            try:
                if failure is None and resp.notify.script == "pre-dump" and before_freeze is not None:
                    before_freeze()
                elif failure is None and resp.notify.script == "query-ext-files":
                    ack.opts.external.extend(on_frozen())
                    ack.opts.images_dir_fd = -1   # (a required field of the options)
            except Exception as e:   # noqa: BLE001 - CRIU must hear of any failure, or it waits
                failure, failed_at = e, resp.notify.script
                ack = criu.rpc.criu_req(type=criu.rpc.NOTIFY, notify_success=False)
            resp = _exchange(sk, criu, ack, pid, proc)
        if failed_at == "pre-dump":
            raise failure   # (before the freeze: the caller's own failure, the process untouched)
        if failure is not None:
            raise CheckpointFailed(f"while process {pid} was frozen: {failure}") from failure
        if not resp.success:
            raise CheckpointFailed(f"criu could not dump process {pid}: {failure_said(resp.cr_errno, images_dir)} "
                                   f"(see {images_dir / 'dump.log'})")
        return stats(images_dir, "dump")
    finally:
        sk.close()
        proc.wait()
        os.close(dir_fd)


def failure_said(errno: int, images_dir: Path, log_name: str = "dump.log") -> str:
    """Why CRIU failed, in its own words where its log has them: the first
    error it logged (what follows is its consequences, down to the closing
    "Dumping FAILED"; it also logs, and survives, that it may not raise
    its own RLIMIT_NOFILE), else the error number it returned (a log that
    could not be written, as in a full directory, has none)."""
    try:
        with open(images_dir / log_name, errors="replace") as f:
            errors = [line.strip() for line in f
                      if "Error (" in line and "FAILED" not in line and "RLIMIT_NOFILE" not in line]
    except OSError:
        errors = []
    if errors:
        return re.sub(r"^\(?[\d.]+\)?\s*(\d+\s*)?Error \([^)]*\):\s*", "", errors[0])
    if errno:
        return os.strerror(errno)
    try:   # a directory too full to hold the image holds no log of it either
        fs = os.statvfs(images_dir)
    except OSError:
        return "no reason given"
    if fs.f_bavail * fs.f_frsize < FULL_BELOW:
        return f"No space left on device in {images_dir.parent} ({fs.f_bavail * fs.f_frsize // 1024} KiB free)"
    return "no reason given"


def stats(images_dir: Path, kind: str) -> dict:
    """CRIU's own figures for a dump or a restore (stats-dump, stats-restore)."""
    try:
        with open(images_dir / f"stats-{kind}", "rb") as f:
            entry = find().images.load(f)["entries"][0]
        return dict(entry.get(kind, {}))
    except (OSError, KeyError, IndexError, ValueError, CheckpointFailed):
        return {}
