"""Synthetic request records for timing `bench analyze` itself (not a
measurement of llft): N schema-1 request records spread over the
configurations of the serving/latency scenario (6 sizes, plain and llft),
latencies drawn from a log-normal distribution and written to 0.1 µs as
the workloads write them, in several files generated in parallel.

usage: python -m bench.generate --records 10000000 --out /tmp/bench-10m [--files 8]
then:  time python -m bench analyze /tmp/bench-10m --out /tmp/bench-10m-report"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import random
import time
from pathlib import Path

from bench.records import SCHEMA_VERSION

SIZES = (16, 256, 1024, 4096, 16384, 65536)
BACKENDS = (("plain", 1, 45.0), ("llft", 3, 105.0))


def write(args: tuple[Path, int, int, str]) -> int:
    path, first, count, run = args
    rnd = random.Random(first)
    configs = [(s, b, r, m * (1 + s / 16384)) for s in SIZES for b, r, m in BACKENDS]
    heads = [json.dumps({"schema": SCHEMA_VERSION, "run": run, "host": "generated", "commit": "synthetic",
                         "cpus": 2, "suite": "paper", "kind": "request", "scenario": "serving/latency",
                         "backend": b, "replicas": r, "net": "loopback", "size": s, "clients": 1,
                         "outcome": "ok"}, separators=(",", ":"))[:-1] for s, b, r, _ in configs]
    t0 = time.time()
    with open(path, "w") as f:
        for i in range(first, first + count):
            k = i % len(configs)
            lat = rnd.lognormvariate(math.log(configs[k][3]), 0.35)
            f.write(f'{heads[k]},"ts":{t0 + i * 1e-4:.6f},"latency_us":{lat:.1f}}}\n')
    return count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    run = time.strftime("%Y%m%dT%H%M%SZ-synthetic", time.gmtime())
    per = -(-a.records // a.files)
    jobs = [(a.out / f"generated-{k}.jsonl", k * per, min(per, a.records - k * per), run) for k in range(a.files)]
    with mp.Pool() as pool:
        n = sum(pool.map(write, jobs))
    print(f"{n:,} records in {a.files} files in {a.out}/")


if __name__ == "__main__":
    main()
