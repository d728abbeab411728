"""Checkpoints (issue 20, llft-run --keep): redis holding about 10 MiB,
100 MiB and 1 GiB (DEBUG POPULATE, 1 KiB values) under `--replicas 3
--keep 3`; a backup is killed and replaced by a CRIU clone of another
backup.  And (checkpoint/restore) under `--replicas 2 --keep 2
--checkpoint-every 2`: once a checkpoint of the populated backup is
stored, the backup is killed and replaced by a copy of it, restored.  And
(checkpoint/primary) under `--replicas 2 --keep 2`: the backup is killed
and, with no backup to clone and no checkpoint stored, replaced by a clone
of the primary, held still for it (how long, and how long holding it
took, are recorded too).  Per clone: how long the source was frozen and llft's part
of that, the dump, the restore, the image's size, the join end to end
(from the kill to the clone adopted, as the state file says), the backup's
resident memory; and, for a client of the primary sending PINGs
throughout, its slowest round trip in the second before the kill and
during the clone: the primary is not paused (but for checkpoint/primary)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.failover import state
from bench.memory import anon_kib
from bench.serving import end, free_port, wait_port

SCENARIOS = {"clone": "checkpoint/clone", "restore": "checkpoint/restore", "primary": "checkpoint/primary"}
STORE_EVERY_S = 2
VALUE_BYTES = 1024


def _ask(f, *args: str) -> bytes:
    f.write(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in args))
    f.flush()
    return f.readline()


class Pinger(threading.Thread):
    """PINGs the primary one after another; keeps (time, round trip)."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.f = self.sock.makefile("rwb")
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            if _ask(self.f, "PING") != b"+PONG\r\n":
                raise RuntimeError("no PONG")
            self.samples.append((t0, time.monotonic() - t0))
            time.sleep(0.001)

    def worst_ms(self, start: float, until: float) -> float | None:
        got = [rt for t, rt in self.samples if start <= t <= until]
        return round(max(got) * 1000, 2) if got else None


def _live(st: dict) -> list[dict]:
    return [r for r in st["replicas"] if r["role"] in ("primary", "backup")]


def one_clone(ctx, size_mib: int, trial: int, mode: str):
    port = free_port()
    run_dir = ctx.tmp / f"checkpoint-{size_mib}-{trial}"
    stored = mode == "restore"
    n = 3 if mode == "clone" else 2
    scenario = SCENARIOS[mode]
    argv = [str(Path(sys.executable).with_name("llft-run")), "--replicas", str(n), "--keep", str(n),
            *(["--checkpoint-every", str(STORE_EVERY_S)] if stored else []),
            "--run-dir", str(run_dir), "--port", str(port), "--", shutil.which("redis-server"), "--port", "6379",
            "--save", "", "--appendonly", "no", "--enable-debug-command", "yes"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fields = dict(backend="llft", replicas=n, clients=1, net="loopback", variant=f"{size_mib} MiB", size=size_mib)
    pinger = None
    try:
        wait_port(port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
            f = s.makefile("rwb")
            keys = size_mib * (1 << 20) // VALUE_BYTES
            if _ask(f, "DEBUG", "POPULATE", str(keys), "key", str(VALUE_BYTES)) != b"+OK\r\n":
                raise RuntimeError("DEBUG POPULATE failed")
        deadline = time.monotonic() + 600
        while True:   # the backups have replayed the population
            st = state(run_dir)
            live = _live(st)
            primary = next(r for r in live if r["role"] == "primary")
            if len(live) == n and all(r["records"] >= primary["records"] for r in live):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the backups did not catch up")
            time.sleep(0.2)
        populated = time.time()
        while stored and (state(run_dir).get("stored_checkpoint") or {}).get("at", 0) < populated:
            if time.monotonic() > deadline:
                raise RuntimeError("no checkpoint stored after the population")
            time.sleep(0.1)
        victim = [r for r in live if r["role"] == "backup"][-1]
        backup_kib = anon_kib(victim["pid"])
        pinger = Pinger(port)
        pinger.start()
        time.sleep(1.0)
        killed = time.monotonic()
        subprocess.run(["kill", "-KILL", str(victim["pid"])], check=True)
        while True:
            st = state(run_dir)
            clone = next((r for r in st["replicas"] if r.get("checkpoint") and r["role"] == "backup"), None)
            if clone is not None:
                joined = time.monotonic()
                break
            if time.monotonic() > killed + 120:
                raise RuntimeError("no clone within 120 s")
            time.sleep(0.005)
        time.sleep(0.2)
        ck = clone["checkpoint"]
        held = {"primary_held_ms": ck["held_ms"], "census_ms": ck["census_ms"]} if mode == "primary" else {}
        ctx.rec.event(scenario, {
            **held, "source_frozen_ms": ck["frozen_ms"], "llft_frozen_work_ms": ck["frozen_work_ms"],
            "dump_ms": ck["dump_ms"], "restore_ms": ck["restore_ms"], "image_mib": round(ck["image_bytes"] / 2**20, 1),
            "join_ms": round((joined - killed) * 1000, 1), "backup_rss_mib": round(backup_kib / 1024, 1),
            "primary_worst_rtt_before_ms": pinger.worst_ms(killed - 1.0, killed),
            "primary_worst_rtt_during_ms": pinger.worst_ms(killed, joined)}, round=trial, **fields)
    except (RuntimeError, OSError, subprocess.SubprocessError, StopIteration) as e:
        ctx.rec.failed(scenario, "event", repr(e), round=trial, **fields)
    finally:
        if pinger is not None:
            pinger.stop.set()
        end(proc, 30)
        shutil.rmtree(run_dir, ignore_errors=True)


def cannot_checkpoint_redis() -> str | None:
    """Why redis cannot be checkpointed here (no working CRIU, no redis), or None."""
    from llft.checkpoint.criu import problem
    why = problem()
    if why:
        return f"no working CRIU: {why}"
    if not shutil.which("redis-server"):
        return "redis-server is not installed"
    return None


def checkpoint(ctx, sizes_mib=(10, 100, 1024), trials: int = 3):
    why = cannot_checkpoint_redis()
    if why:
        ctx.skip(why)
        return
    ctx.plan(len(SCENARIOS) * len(sizes_mib) * trials)
    for mode in SCENARIOS:
        for size in sizes_mib:
            for trial in range(trials):
                one_clone(ctx, size, trial, mode)
                ctx.step()
