"""The run directory of one llft-run: per-replica output, the controller's
log, and a state file that llft-status and llft-kill read."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

STATE_FILE = "llft-run.json"
RUNS_DIR = "llft-runs"


class RunDirError(Exception):
    pass


def default_run_dir(group: str, cwd: Path | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (cwd or Path.cwd()) / RUNS_DIR / f"{group}-{stamp}-{os.getpid()}"


def prepare(run_dir: Path, replicas: int) -> Path:
    """Creates the run dir and a directory per replica; RunDirError if
    unusable.  Returns it absolute: the replicas' files are named by it, and
    a checkpoint tells the controller's files (a replica's stdout) from the
    program's by the paths the kernel gives, which are absolute."""
    run_dir = Path(os.path.abspath(run_dir))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".llft-write-test"
        probe.write_text("")
        probe.unlink()
        for k in range(replicas):
            (run_dir / f"replica-{k}").mkdir(exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot use run dir {run_dir}: {e.strerror}") from None
    latest = run_dir.parent / "latest"
    if run_dir.parent.name == RUNS_DIR:
        try:
            if latest.is_symlink() or not latest.exists():
                tmp = run_dir.parent / f".latest-{os.getpid()}"
                tmp.symlink_to(run_dir.name)
                tmp.replace(latest)
        except OSError:
            pass
    return run_dir


def write_state(run_dir: Path, state: dict):
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(run_dir / STATE_FILE)


def find(run_dir: str | None, group: str | None = None) -> Path:
    """The run dir a user means: the one given, else ./llft-runs/latest or the
    newest under ./llft-runs (of that group, if given), else the cwd itself."""
    if run_dir:
        p = Path(run_dir)
        if not (p / STATE_FILE).exists():
            raise RunDirError(f"{p} is not an llft run dir (no {STATE_FILE})")
        return p
    cwd = Path.cwd()
    if (cwd / STATE_FILE).exists():
        return cwd
    runs = cwd / RUNS_DIR
    candidates = [d for d in runs.glob("*") if (d / STATE_FILE).exists() and not d.is_symlink()] \
        if runs.is_dir() else []
    if group:
        candidates = [d for d in candidates if read_state(d).get("group") == group]
    if not candidates:
        where = f" of group {group!r}" if group else ""
        raise RunDirError(f"no llft run{where} found here: pass --run-dir DIR")
    return max(candidates, key=lambda d: (d / STATE_FILE).stat().st_mtime)


def read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot read {run_dir / STATE_FILE}: {e}") from None
