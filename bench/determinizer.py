"""Determinizer micro-benchmark: the cost llft adds per recorded call.

Each round times examples/bin/determinizer_bench five ways, in turn:
  plain    - no llft (backend plain)
  primary  - llft-run --replicas 1 (recording; the controller drains the ring)
  backup   - llft-run --replay-from the primary's saved stream (replaying)
and primary and backup again with --serialize (backend llft-serialize:
threads take turns at the calls llft sees)
and records one event per call measured and way: its median ns per call
over the program's repetitions (scenario determinizer/CALL), and the
whole run's elapsed time (determinizer/total)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.records import REPO

BENCH = REPO / "examples" / "bin" / "determinizer_bench"
LLFT_RUN = str(Path(sys.executable).with_name("llft-run"))


def parse(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        rec = json.loads(line)
        key = rec["bench"] if rec["bench"] != "mutex_contended" else f"mutex_contended_{rec['threads']}"
        out[key] = rec
    return out


def run_plain(ops: int, reps: int) -> dict:
    return parse(subprocess.run([BENCH, str(ops), str(reps)], capture_output=True, text=True, check=True).stdout)


def run_llft(ops: int, reps: int, tmp: Path, extra: list[str], replica: int) -> dict:
    rd = tmp / f"rd-{time.monotonic_ns()}"
    p = subprocess.run([LLFT_RUN, "--run-dir", str(rd), *extra, "--", BENCH, str(ops), str(reps)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llft-run failed ({p.returncode}): {p.stderr[-2000:]}")
    return parse((rd / f"replica-{replica}" / "stdout").read_text())


def determinizer(ctx, ops: int, reps: int, rounds: int):
    if not BENCH.exists():
        raise RuntimeError(f"{BENCH} is missing: run make -C examples")
    ctx.plan(rounds)
    for rnd in range(rounds):
        stream = ctx.tmp / "stream"
        results = {("plain", None): run_plain(ops, reps)}
        for backend, extra in (("llft", []), ("llft-serialize", ["--serialize"])):
            results[(backend, "primary")] = run_llft(ops, reps, ctx.tmp, ["--replicas", "1", "--save-stream",
                                                                          str(stream), *extra], 0)
            results[(backend, "backup")] = run_llft(ops, reps, ctx.tmp, ["--replay-from", str(stream), *extra], 1)
            stream.unlink()
        for (backend, role), res in results.items():
            for key, rec in res.items():
                metrics = {"elapsed_ms": rec["elapsed_ms"]} if key == "total" else {"ns_per_op": rec["ns_per_op"]}
                ctx.rec.event(f"determinizer/{key}", metrics, backend=backend, variant=role, replicas=1,
                              round=rnd, ops=ops, net="loopback")
        ctx.step()
