"""Where a process's threads are, from /proc: what llft-run keeps when a
backup stops following, so that a stall can be explained after the fact
(which thread of the primary or the backup sits in which system call)."""
from __future__ import annotations

import time
from pathlib import Path


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return "?"


def thread_snapshot(pid: int) -> str:
    """One line per thread: id, name, state, kernel wait channel, and the
    system call it is in (/proc/PID/task/TID/syscall: number, arguments,
    stack pointer and program counter; "running" when in none)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = sorted(int(t.name) for t in tasks.iterdir())
    except OSError as e:
        return f"process {pid}: {e.strerror}"
    lines = []
    for tid in tids:
        task = tasks / str(tid)
        stat = _read(task / "stat")
        state = stat[stat.rindex(")") + 2] if ")" in stat else "?"
        lines.append(f"thread {tid} ({_read(task / 'comm')}) state {state} wchan {_read(task / 'wchan')} "
                     f"syscall {_read(task / 'syscall')}")
    return "\n".join(lines)


def keep_stall_snapshot(path: Path, processes: dict[str, int | None]) -> Path:
    """Writes the threads of each named process (the stalled backup, its
    primary) to path; returns path."""
    parts = [f"taken at {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    for name, pid in processes.items():
        parts.append(f"\n{name} (pid {pid}):\n" + (thread_snapshot(pid) if pid else "not running"))
    path.write_text("\n".join(parts) + "\n")
    return path
