"""Restoring a replica's image beside the controller that adopts it, on
whichever host: CRIU restores the program in a PID namespace of its own
(restore_init.py), the sockets and files the controller hands it in place
of those the image left out (`--inherit-fd`).  Also what an image needs
before it can be restored so: the controller's files for the source
(its ring, the library, stdio), which CRIU leaves out, and no death
signal tied to the source's parent.  Used by clones on one host
(clone.py) and by newcomers across hosts (llft/cluster/checkpoint_join.py)."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from llft import PRELOAD_LIBRARY
from llft.checkpoint import criu, images, sockets
from llft.members import stopped

log = logging.getLogger("llft.checkpoint")


class RestoreFailed(Exception):
    pass


def controller_files(pid: int, ring_path: str, out_dir: Path) -> list[tuple[int, str, str]]:
    """(fd, CRIU's external key, which) for each fd of replica process pid
    that is one of the controller's files for it: its ring, the library,
    its stdout and stderr, /dev/null."""
    # (the kernel names a file by its absolute path, symbolic links resolved)
    wanted = {os.path.realpath(path): which for path, which in (
        (ring_path, "ring"), (PRELOAD_LIBRARY, "library"), (out_dir / "stdout", "stdout"),
        (out_dir / "stderr", "stderr"), ("/dev/null", "null"))}
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        which = wanted.get(target)
        if which is None:
            continue
        key = sockets.file_key(pid, int(name))
        if key is not None:
            out.append((int(name), key, which))
    return out


def keep_logs(images_dir: Path, logs_dir: Path):
    """CRIU's logs and figures (and llft's restore plan) from an image's
    directory into logs_dir, which outlives the image."""
    if not images_dir.exists():
        return
    logs_dir.mkdir(parents=True, exist_ok=True)
    for f in images_dir.iterdir():
        if f.suffix in (".log", ".plan") or f.name.startswith("stats-"):
            shutil.copyfile(f, logs_dir / f.name)


def no_parent_death_signal(images_dir: Path):
    """A replica dies with its controller (PR_SET_PDEATHSIG, llft/replica.py),
    which CRIU would restore, and the restored program's parent is CRIU,
    which exits at once: it would be killed as soon as it runs.  It dies
    with its namespace instead, which dies with the controller."""
    c = criu.find()
    for path in Path(images_dir).glob("core-*.img"):
        with open(path, "rb") as f:
            image = c.images.load(f)
        cores = [e["thread_core"] for e in image["entries"] if "pdeath_sig" in e.get("thread_core", {})]
        if cores:
            for core in cores:
                del core["pdeath_sig"]
            with open(path, "wb") as f:
                c.images.dump(image, f)


def _let_run(pid: int):
    """CRIU restores a task stopped, or with a stop pending, as it dumped
    it: a source that someone stopped (SIGSTOP) while it was dumped, a
    timing fault of the source's, not the program's.  Its copy must run
    (the controller would fence it at once): SIGCONT ends the stop and
    discards a pending one."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return
    stop_bits = (1 << (signal.SIGSTOP - 1)) | (1 << (signal.SIGTSTP - 1))
    pending = int(fields.get("SigPnd", "0").strip(), 16) | int(fields.get("ShdPnd", "0").strip(), 16)
    if stopped(pid) or pending & stop_bits:
        log.info("process %d was restored stopped, as its source was being stopped when it was dumped: continued",
                 pid)
        os.kill(pid, signal.SIGCONT)


def restore(images_dir: Path, listed: dict, files_at_dump: list[tuple[int, str, str]],
            inherit: list[tuple[socket.socket, str]], ring_path: str, stdio: dict,
            files_plan: bytes | None = None) -> tuple[int, subprocess.Popen]:
    """Restores the image in images_dir (checked against listed first):
    inherit gives the sockets that replace those CRIU left out (by CRIU's
    key), ring_path the replica's ring, stdio its open stdout and stderr,
    files_plan its view of the files.  Returns the program's pid and the
    namespace's helper process; RestoreFailed (or DamagedImage, OSError)
    if it does not run."""
    c = criu.find()
    images.check(images_dir, listed)
    files = {which: (fd, key) for fd, key, which in files_at_dump}
    opened = {"ring": lambda: os.open(ring_path, os.O_RDWR),
              "library": lambda: os.open(PRELOAD_LIBRARY, os.O_RDONLY),
              "null": lambda: os.open("/dev/null", os.O_RDWR),
              "stdout": lambda: stdio["stdout"].fileno(), "stderr": lambda: stdio["stderr"].fileno()}
    keyed = [(opened[which](), key) for which, (_fd, key) in files.items()]
    fds = [(sock.fileno(), key) for sock, key in inherit] + keyed
    try:   # (a stored checkpoint is restored again and again from one directory)
        os.unlink(images_dir / "restored.pid")
    except FileNotFoundError:
        pass
    dir_fd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    # Every path through the directory's fd: CRIU runs in the replica's
    # view of the files, where /dev/shm may be the replica's own (its
    # overlay), and a pidfile written there would be the replica's file,
    # carried to every replica made of it.
    argv = [c.binary, "restore", "--images-dir", f"/proc/self/fd/{dir_fd}", "--restore-detached",
            "--pidfile", f"/proc/self/fd/{dir_fd}/restored.pid", "-v4", "--log-file", "restore.log"]
    for fd, key in fds:
        argv += ["--inherit-fd", f"fd[{fd}]:{key}"]
    status_r, status_w = os.pipe()
    helper = [sys.executable, "-m", "llft.checkpoint.restore_init", str(status_w)]
    if files_plan is not None:
        plan = images_dir / "files.plan"
        plan.write_bytes(files_plan)
        helper += ["--files-plan", str(plan)]
    try:
        proc = subprocess.Popen(helper + ["--"] + argv, pass_fds=[status_w, dir_fd] + [fd for fd, _ in fds],
                                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(images_dir / "restore_init.log", "wb"),
                                preexec_fn=criu.ordinary_priority)
    finally:
        os.close(status_w)
        os.close(dir_fd)
        for fd, _ in keyed:
            if fd not in {f.fileno() for f in stdio.values()}:
                os.close(fd)
    with os.fdopen(status_r, "rb") as f:
        word = f.readline().decode(errors="replace").strip()
    if word != "ok":
        proc.kill()
        proc.wait()
        if not word:
            said = (images_dir / "restore_init.log").read_text(errors="replace").strip().splitlines()
            word = f"the restore helper ended{': ' + said[-1] if said else ''}"
        raise RestoreFailed(f"{word} (see {images_dir / 'restore.log'})")
    pid = sockets.namespace_child(proc.pid)
    if pid is None:
        proc.kill()
        proc.wait()
        raise RestoreFailed("the restored program is not running")
    _let_run(pid)
    return pid, proc
