"""What the command-line tools can learn about a running replica from its
state-file entry, its process and its stream file."""
from __future__ import annotations

import psutil

from llft.native import StreamError, StreamFile


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def owns(pid: int | None, started: float | None) -> bool:
    """True if pid is still the replica llft-run started (not a recycled pid):
    same start time.  (Not its environment: redis, for one, overwrites it
    when it sets its process title.)"""
    return bool(pid) and started is not None and start_time(pid) == started


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
            view["records"], view["threads"] = s.records, s.threads + 1
            view["clock_offsets_ns"] = s.clock_offsets()
            view["divergence"] = s.divergence if s.diverged else None
    except (StreamError, TypeError):
        pass
    return view
