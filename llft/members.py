"""What the command-line tools can learn about a running replica from its
state-file entry, its process and its stream file."""
from __future__ import annotations

import psutil

from llft.native import StreamError, StreamFile


def owns(pid: int | None, stream_path: str) -> bool:
    """True if pid is still the replica started with this stream (not a
    recycled pid): its environment names the stream file."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).environ().get("LLFT_SHM") == stream_path
    except (psutil.Error, OSError):
        return False


def member_view(entry: dict) -> dict:
    view = dict(entry, state="exited", records=None, threads=None, divergence=None)
    pid, path = entry.get("pid"), entry.get("stream")
    if owns(pid, path):
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
