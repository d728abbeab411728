"""What a replica's program leaves running: the processes it forked.

A replica runs in a session of its own (its pid is its process group), so
whatever it forks without a setsid of its own goes when the replica goes.
A child that made itself a session of its own (a daemon's) is re-parented
to the controller, which llft-run makes a child subreaper, and is ended
when the group ends.  Nothing a replica started outlives llft-run."""
from __future__ import annotations

import os
import signal

import psutil

from llft.native import lib


def become_subreaper():
    """Orphans of this controller's replicas are re-parented here, not to init."""
    lib.llft_become_subreaper()


def group_runs(pgid: int) -> bool:
    """Whether a process below this controller in process group pgid still
    runs (an orphan that has exited waits for end_orphans to reap it)."""
    try:
        tree = psutil.Process().children(recursive=True)
    except psutil.Error:
        return False
    for p in tree:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def end_process_group(pgid: int):
    """SIGKILL to what is left of a replica's process group (its forked
    children); the group id cannot be reused while any member lives."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_orphans(keep: set[int]):
    """Ends the processes re-parented to this controller, other than keep
    (pids it started and waits for itself), and everything below them,
    and reaps what becomes its own to reap.  The whole tree is taken at
    once: a process below an orphan (the child of a daemon's child, in
    their own session) is re-parented here only once the orphan has died,
    after a look at the direct children alone."""
    try:
        tree = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    ours = [p for p in tree if p.pid not in keep]
    for p in ours:
        try:
            p.kill()
        except psutil.Error:
            pass
    for p in ours:
        try:
            os.waitpid(p.pid, 0)
        except ChildProcessError:
            pass   # (a live parent's to reap, or reaped already)
