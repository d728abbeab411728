"""Determinizer micro-benchmark: the cost llft adds per recorded call.

In one run, times examples/bin/determinizer_bench three ways:
  plain    - no llft
  primary  - llft-run --replicas 1 (recording; the controller drains the ring)
  backup   - llft-run --replay-from the primary's saved stream (replaying)
and writes JSON lines (one per benchmark and mode, with medians and the
added ns and ratio against plain) to bench/results/determinizer.jsonl.

usage: python bench/determinizer.py [--ops N] [--reps N] [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "examples" / "bin" / "determinizer_bench"
LLFT_RUN = str(Path(sys.executable).with_name("llft-run"))


def git_rev() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        rec = json.loads(line)
        key = rec["bench"] if rec["bench"] != "mutex_contended" else f"mutex_contended_{rec['threads']}"
        out[key] = rec
    return out


def run_plain(args) -> dict:
    return parse(subprocess.run([BENCH, str(args.ops), str(args.reps)], capture_output=True, text=True,
                                check=True).stdout)


def run_llft(args, tmp: Path, extra: list[str], replica: int) -> dict:
    rd = tmp / f"rd-{time.monotonic_ns()}"
    p = subprocess.run([LLFT_RUN, "--run-dir", str(rd), *extra, "--", BENCH, str(args.ops), str(args.reps)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"llft-run failed ({p.returncode}): {p.stderr}")
    return parse((rd / f"replica-{replica}" / "stdout").read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of plain/primary/backup")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "determinizer.jsonl")
    args = ap.parse_args()
    if not BENCH.exists():
        raise SystemExit(f"{BENCH} is missing: run make -C examples")

    samples: dict[str, dict[str, list[float]]] = {"plain": {}, "primary": {}, "backup": {}}
    with tempfile.TemporaryDirectory(prefix="llft-bench-") as t:
        tmp = Path(t)
        for _ in range(args.rounds):
            stream = tmp / "stream"
            results = {"plain": run_plain(args),
                       "primary": run_llft(args, tmp, ["--replicas", "1", "--save-stream", str(stream)], 0),
                       "backup": run_llft(args, tmp, ["--replay-from", str(stream)], 1)}
            stream.unlink()
            for mode, res in results.items():
                for key, rec in res.items():
                    value = rec["elapsed_ms"] if key == "total" else rec["ns_per_op"]
                    samples[mode].setdefault(key, []).append(value)

    rev = git_rev()
    lines = []
    for key in samples["plain"]:
        base = statistics.median(samples["plain"][key])
        for mode in ("plain", "primary", "backup"):
            med = statistics.median(samples[mode][key])
            unit = "ms" if key == "total" else "ns_per_op"
            lines.append({"suite": "determinizer", "git": rev, "bench": key, "mode": mode, unit: round(med, 2),
                          "added": round(med - base, 2), "ratio": round(med / base, 3) if base else None,
                          "ops": args.ops, "reps": args.reps, "rounds": args.rounds, "cpus": os.cpu_count()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")

    print(f"{'benchmark':22} {'plain':>9} {'primary':>9} {'+ns':>7} {'ratio':>6} {'backup':>9} {'ratio':>6}")
    for key in samples["plain"]:
        row = {l["mode"]: l for l in lines if l["bench"] == key}
        unit = "ms" if key == "total" else "ns_per_op"
        print(f"{key:22} {row['plain'][unit]:>9} {row['primary'][unit]:>9} {row['primary']['added']:>7} "
              f"{row['primary']['ratio']:>6} {row['backup'][unit]:>9} {row['backup']['ratio']:>6}")
    total = {l["mode"]: l["ms"] for l in lines if l["bench"] == "total"}
    print(f"(ns per call, medians; 'total' is the whole run in ms; written to {args.out})")
    print(f"backup/primary, whole run: {total['backup'] / total['primary']:.2f} (target: at most 1.5)")


if __name__ == "__main__":
    main()
