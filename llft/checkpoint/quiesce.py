"""Holding a primary still for a checkpoint of itself (native/quiesce.c,
native/quiesce_hold.c; docs/checkpoints.md).

While held, no thread of the primary is inside the real blocking call of
a primary branch (a read, an accept, a poll): those that were are
interrupted and wait at the call's entry, as does any thread that comes
to one; the rest run on.  An image taken then holds no call that would
start again in a copy and take input no record accounts for."""
from __future__ import annotations

import contextlib
import errno
import os

from llft._native import ffi, lib

# The clients wait while the census runs: one that does not complete soon
# will not complete (a thread waiting for what a held one would do).
DEFAULT_TIMEOUT_MS = 200


class QuiesceFailed(Exception):
    pass


def hold(stream, pid: int, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> int:
    """Holds the primary whose control block is stream's (process pid);
    returns how many of its threads answered.  Raises QuiesceFailed (the
    primary released again) when the census does not complete in time: a
    thread blocked in a call it cannot interrupt (a connect waiting for
    its answer, a read of a child's pipe), its signals ignored, or gone."""
    threads = ffi.new("int *")
    rc = lib.llft_quiesce_hold(stream.ctl, pid, timeout_ms, threads)
    if rc == 0:
        return threads[0]
    if rc == -errno.ETIMEDOUT:
        raise QuiesceFailed(f"of the primary's {threads[0]} threads, {stream.ctl.q_census & 0xFFFFFFFF} answered within "
                            f"{timeout_ms} ms (the others are in calls that cannot be interrupted, or do not take "
                            f"the census's signal)")
    raise QuiesceFailed(f"the primary (pid {pid}) could not be held: {os.strerror(-rc)}")


def release(stream) -> None:
    lib.llft_quiesce_release(stream.ctl)


@contextlib.contextmanager
def held(stream, pid: int, timeout_ms: int = DEFAULT_TIMEOUT_MS):
    threads = hold(stream, pid, timeout_ms)
    try:
        yield threads
    finally:
        release(stream)
