"""The faults the nemesis injects into a group on one host, as a user
would with llft-kill: crashes (SIGKILL) and timing faults (SIGSTOP past
the fault timeout) of the primary or a backup, under load or while the
clients are idle, right after the clients' connections closed, and the
new primary right after a view change (a cascade).  Each one waits until
the group has recovered: a primary serving, and with --respawn every
replica back and caught up."""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from llft import rundir
from llft.members import live, owns, stopped

RECOVERY_TIMEOUT_S = 60.0

# kind -> (what it does, what the clients do meanwhile)
KINDS = {
    "kill-primary": "SIGKILL of the primary under load",
    "kill-backup": "SIGKILL of a backup under load",
    "freeze-primary": "SIGSTOP of the primary past the fault timeout, under load",
    "freeze-backup": "SIGSTOP of a backup past the fault timeout, under load",
    "kill-primary-idle": "SIGKILL of the primary while no client sends",
    "kill-after-close": "SIGKILL of the primary right after every client connection closed",
    "kill-while-connecting": "SIGKILL of the primary while every client opens a new connection",
    "cascade": "SIGKILL of the primary, then of its successor the moment it has taken over",
}
# A cascade kills two replicas: a group of two has none left to serve.
REPLICAS_NEEDED = {"cascade": 3}
IDLE_KINDS = {"kill-primary-idle", "kill-after-close"}
RECONNECT_KINDS = {"kill-after-close", "kill-while-connecting"}   # the clients close their connections first


class GroupLost(Exception):
    """The group stopped serving: no primary, or no recovery in time."""


@dataclass
class Replica:
    index: int
    role: str
    pid: int
    started: float | None
    catch_up: dict | None


class Group:
    """A group on this host, seen through its run dir's state file."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def state(self) -> dict:
        try:
            return rundir.read_state(self.run_dir)
        except (rundir.RunDirError, json.JSONDecodeError, OSError):
            return {}

    def replicas(self) -> list[Replica]:
        return [Replica(r["index"], r["role"], r.get("pid"), r.get("started"), r.get("catch_up"))
                for r in self.state().get("replicas", [])]

    def primary(self) -> Replica | None:
        return next((r for r in self.replicas() if r.role == "primary" and live(r.pid, r.started)), None)

    def backups(self) -> list[Replica]:
        return [r for r in self.replicas() if r.role == "backup" and live(r.pid, r.started)]

    def signal(self, r: Replica, sig: int):
        if owns(r.pid, r.started):
            try:
                os.kill(r.pid, sig)
            except ProcessLookupError:
                pass

    def wait_recovered(self, replicas: int, faulted: set[int]):
        """The faulted replicas out of the group, a primary serving, and
        `replicas` live replicas, every replacement caught up."""
        end = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < end:
            all_ = self.replicas()
            live_ones = [r for r in all_ if r.role in ("primary", "backup") and live(r.pid, r.started)]
            gone = not any(r.index in faulted and r.role in ("primary", "backup") for r in all_)
            caught_up = all(r.catch_up is None or r.catch_up.get("done") for r in live_ones)
            if gone and self.primary() is not None and len(live_ones) >= replicas and caught_up:
                return
            time.sleep(0.01)
        raise GroupLost(f"no recovery within {RECOVERY_TIMEOUT_S:g} s: replicas {self.replicas()}")

    def wait_new_primary(self, old_pid: int):
        end = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < end:
            p = self.primary()
            if p is not None and p.pid != old_pid:
                return p
            time.sleep(0.0005)
        raise GroupLost("no backup took over")


def inject(group: Group, kind: str, fault_timeout_s: float, rng) -> tuple[str, set[int]]:
    """Injects one fault of this kind; returns what was done and the
    replicas it struck.  The caller has paused the clients for the idle
    kinds."""
    p = group.primary()
    if p is None:
        raise GroupLost("the group has no primary")
    if kind in ("kill-primary", "kill-primary-idle", "kill-after-close", "kill-while-connecting"):
        group.signal(p, signal.SIGKILL)
        return f"SIGKILL replica {p.index} (primary)", {p.index}
    if kind == "cascade":
        group.signal(p, signal.SIGKILL)
        nxt = group.wait_new_primary(p.pid)
        group.signal(nxt, signal.SIGKILL)
        return f"SIGKILL replica {p.index} (primary), then replica {nxt.index} once it took over", {p.index, nxt.index}
    if kind == "freeze-primary":
        return freeze(group, p, "primary", fault_timeout_s), {p.index}
    backups = group.backups()
    if not backups:
        raise GroupLost("the group has no backup")
    b = rng.choice(backups)
    if kind == "kill-backup":
        group.signal(b, signal.SIGKILL)
        return f"SIGKILL replica {b.index} (backup)", {b.index}
    if kind == "freeze-backup":
        return freeze(group, b, "backup", fault_timeout_s), {b.index}
    raise ValueError(f"unknown fault {kind}")


def freeze(group: Group, r: Replica, role: str, fault_timeout_s: float) -> str:
    """A timing fault: stopped past the fault timeout, and kept stopped
    until llft-run fences it (a loaded host may take it a while to look;
    resumed sooner, the replica would only have been slow).  Stopped again
    if it runs meanwhile: a checkpoint that CRIU was taking of it gives up
    when the stop comes, and lets the task go on (--keep)."""
    group.signal(r, signal.SIGSTOP)
    start = time.monotonic()
    end = start + max(fault_timeout_s * 3, RECOVERY_TIMEOUT_S)
    time.sleep(fault_timeout_s)
    while time.monotonic() < end and any(x.index == r.index and x.role == role and owns(x.pid, x.started)
                                         for x in group.replicas()):
        if not stopped(r.pid):
            group.signal(r, signal.SIGSTOP)
        time.sleep(0.005)
    group.signal(r, signal.SIGCONT)
    return f"SIGSTOP replica {r.index} ({role}) until fenced, {(time.monotonic() - start) * 1000:.0f} ms"
