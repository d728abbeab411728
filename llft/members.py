"""What the command-line tools can learn about a running replica from its
state-file entry, its process and its stream file."""
from __future__ import annotations

import hashlib

import psutil

from llft.native import StreamError, StreamFile


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def process_stat(pid: int) -> list[str] | None:
    """pid's fields in /proc/PID/stat after its name (state, ppid, pgrp,
    session, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def process_state(pid: int) -> str | None:
    """pid's state letter in /proc (R, S, T, Z...), or None if it is gone."""
    fields = process_stat(pid)
    return fields[0] if fields else None


def running(pid: int) -> bool:
    """pid is a process that has not exited (not a zombie)."""
    state = process_state(pid)
    return state is not None and state not in "ZX"


PF_EXITING = 0x4   # (include/linux/sched.h) set as a process starts to exit, before its files close


def dying(pid: int) -> bool:
    """pid has exited, or has started to: gone, a zombie, or exiting."""
    fields = process_stat(pid)
    return fields is None or fields[0] in "ZX" or bool(int(fields[6]) & PF_EXITING)


def stopped(pid: int | None) -> bool:
    """pid is stopped (SIGSTOP, or held by a tracer: a debugger, CRIU)."""
    state = process_state(pid) if pid is not None else None
    return state is not None and state in "Tt"


def owns(pid: int | None, started: float | None) -> bool:
    """True if pid is still the replica llft-run started (not a recycled pid):
    same start time.  (Not its environment: redis, for one, overwrites it
    when it sets its process title.)"""
    return bool(pid) and started is not None and start_time(pid) == started


def live(pid: int | None, started: float | None) -> bool:
    """pid is the replica llft-run started and has not exited, nor begun
    to: a killed replica stays a zombie until its controller reaps it, and
    its state entry names it until the group has failed over."""
    return owns(pid, started) and not dying(pid)


def member_view(entry: dict) -> dict:
    view = dict(entry, state="exited", records=None, threads=None, divergence=None)
    pid, path = entry.get("pid"), entry.get("stream")
    if owns(pid, entry.get("started")):
        try:
            view["state"] = "stopped" if psutil.Process(pid).status() == psutil.STATUS_STOPPED else "running"
        except psutil.Error:
            pass
    try:
        with StreamFile(path) as s:
            # A primary does not count its records (a shared counter on the
            # hot path): its ring's head is the slots it wrote.
            view["records"] = s.head if entry.get("role") == "primary" else s.records
            view["threads"] = s.threads + 1
            view["clock_offsets_ns"] = s.clock_offsets()
            view["divergence"] = s.divergence if s.diverged else None
    except (StreamError, TypeError):
        pass
    return view


def output_digest(outputs: dict) -> dict:
    """One replica's output (its state entry's "outputs": per connection,
    the bytes it sent and their SHA-256) summed up: connections, bytes, and
    a short digest of the whole, equal at two replicas that sent the same
    bytes on the same connections."""
    h = hashlib.sha256()
    conns = total = 0
    for conn, out in sorted(outputs.items()):
        h.update(f"{conn} {out['bytes']} {out['sha256']}\n".encode())
        conns += out.get("connections", 1)   # "closed" sums up many
        total += out["bytes"]
    return {"connections": conns, "bytes": total, "digest": h.hexdigest()[:12]}


def output_differs(primary: dict, other: dict) -> list[str]:
    """Connections on which `other` sent as many bytes as the primary, but
    other bytes: a divergence of what the replicas sent (a backup that is
    merely behind has sent fewer).  The "closed" summary of a member's
    relay folds connections each replica closed in its own time: skipped."""
    return [conn for conn, out in sorted(primary.items())
            if conn != "closed" and conn in other
            and other[conn]["bytes"] == out["bytes"] and other[conn]["sha256"] != out["sha256"]]
