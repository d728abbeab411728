"""The process a checkpoint is restored under (python -m
llft.checkpoint.restore_init).  The restored program keeps the pid it had,
which the replica it was taken from still holds, so it is restored in a PID
namespace of its own; this process makes the namespace, and its child, the
namespace's init, runs `criu restore` there and then waits for the
restored program, as init reaps its orphans.  Its exit status is the
program's as a shell reports it (128+N for signal N), which the
controller reads as a replica's.

    restore_init STATUS_FD [--files-plan FILE] -- CRIU RESTORE ARGV...

STATUS_FD gets one line once CRIU is done: "ok" or "failed: why".  With
--files-plan the namespace gets the replica's private files
(llft/private_files.py) before CRIU runs.  Both processes die with their
parent: the controller's end is the namespace's end."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

# The compiled module alone, not llft.native's wrapper around it: this
# process starts on the path of every restore, and the wrapper's imports
# take 20 ms of it.
from llft._native import lib

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x4000, 1 << 18, 2, 4, 8

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _status(code: int) -> int:
    """A wait status as a shell reports it."""
    if os.WIFSIGNALED(code):
        return 128 + os.WTERMSIG(code)
    return os.WEXITSTATUS(code) if os.WIFEXITED(code) else 1


def _init(status_fd: int, files_plan: bytes | None, criu_argv: list[str]) -> int:
    """pid 1 of the new namespace: restores, then reaps until the program ends."""
    lib.llft_die_with_parent(os.getppid())
    if files_plan is not None:
        from llft import private_files
        private_files.enter(files_plan)   # a mount namespace of its own, with the clone's upper layers
    else:
        _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount / private")
    # A proc of this PID namespace: CRIU reads the restored tasks there.
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    inherited = _inherited(criu_argv)
    # The restored program is CRIU's own process, remapped: where the kernel
    # places its later mmap()s (its mmap base) was fixed when CRIU was
    # exec'd.  Exec'd without address randomisation, as every replica is,
    # the copy's new mappings land where its primary's do (jemalloc's next
    # extent, and whether it adjoins the last: a redis copy took one lock
    # more than its primary in a calloc, and diverged).
    criu = subprocess.run(criu_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          pass_fds=inherited, preexec_fn=lib.llft_disable_aslr)
    if criu.returncode == 0:   # (the pidfile is named through the images directory's fd)
        with open(criu_argv[criu_argv.index("--pidfile") + 1]) as f:
            program = int(f.read())
    _close(inherited)   # the program has them now: a socket it closes must close
    if criu.returncode != 0:
        why = criu.stderr.decode(errors="replace").strip().splitlines()
        os.write(status_fd, f"failed: criu restore exited with {criu.returncode}"
                            f"{': ' + why[-1] if why else ''}\n".encode())
        return 1
    os.write(status_fd, b"ok\n")
    os.close(status_fd)
    while True:   # init reaps every orphan; its own end is the program's
        try:
            pid, code = os.wait()
        except ChildProcessError:
            return 1
        if pid == program:
            return _status(code)


def _inherited(argv: list[str]) -> tuple[int, ...]:
    """The fds CRIU must have open: those --inherit-fd names, and the
    images directory when it is given as /proc/self/fd/N."""
    fds = []
    for i, arg in enumerate(argv[:-1]):
        if arg == "--inherit-fd":
            spec = argv[i + 1]   # fd[N]:key
            fds.append(int(spec[3:spec.index("]")]))
        elif arg == "--images-dir" and argv[i + 1].startswith("/proc/self/fd/"):
            fds.append(int(argv[i + 1].rsplit("/", 1)[1]))
    return tuple(fds)


def _close(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    status_fd = int(argv[0])
    rest = argv[1:]
    files_plan = None
    if rest[:1] == ["--files-plan"]:
        with open(rest[1], "rb") as f:
            files_plan = f.read()
        rest = rest[2:]
    if rest[:1] != ["--"]:
        print("usage: restore_init STATUS_FD [--files-plan FILE] -- CRIU ARGV...", file=sys.stderr)
        return 2
    criu_argv = rest[1:]
    lib.llft_die_with_parent(os.getppid())
    try:
        _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
    except OSError as e:
        os.write(status_fd, f"failed: {e}\n".encode())
        return 1
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = _init(status_fd, files_plan, criu_argv)
        except BaseException as e:   # noqa: BLE001 - the controller waits for a line
            try:
                os.write(status_fd, f"failed: {e}\n".encode())
            except OSError:
                pass
        os._exit(code)
    os.close(status_fd)
    _close(_inherited(criu_argv))   # only the namespace's init hands them on
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
    _, code = os.waitpid(child, 0)
    return _status(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
