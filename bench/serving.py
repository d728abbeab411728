"""Replicated-server benchmark: LLFT Fig. 12 (latency vs message size) and
Fig. 13 (throughput vs concurrent clients), and redis-benchmark and
memcslap throughput, each through llft-run (3 replicas by default) and
against the same server unreplicated, in the same run.

Throughput also has a ceiling row: as many unreplicated servers as there
are replicas, each client sending every request to all of them and
waiting for every reply (`msg_client fanout`).  That is the work a
replication layer costing nothing would still leave this machine (every
replica executes every request), so its ratio to the plain server bounds
what any semi-active replication of that many replicas can reach here.

Plain, llft and the ceiling run side by side and are measured in turn,
five rounds each (one with --quick), and each figure is the median of its
rounds: this shared machine's speed drifts within minutes.

Writes JSON lines to bench/results/serving.jsonl and prints a table.
usage: python bench/serving.py [--replicas 3] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "examples" / "bin"
LLFT_RUN = str(Path(sys.executable).with_name("llft-run"))
sys.path.insert(0, str(REPO / "bench"))
from determinizer import git_rev  # noqa: E402
from servers import have_memcached, have_redis, memcached, memcslap_rps, redis, redis_rps  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen):
    for _ in range(500):
        if proc.poll() is not None:
            raise SystemExit(f"server exited early: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port}")


class Server:
    """The server under test, plain or under llft-run, on a free port."""

    def __init__(self, argv_for_port, replicas: int | None, tmp: Path):
        self.port = free_port()
        if replicas is None:
            cmd = argv_for_port(self.port)
        else:
            cmd = [LLFT_RUN, "--replicas", str(replicas), "--run-dir", str(tmp / f"rd-{self.port}"),
                   "--port", str(self.port), "--", *argv_for_port(7000)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_port(self.port, self.proc)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def client(*args) -> dict:
    out = subprocess.run([BIN / "msg_client", *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def msg_server(port):
    return [str(BIN / "msg_server"), str(port)]


def interleaved(rounds: int, measures: dict) -> dict:
    """Runs each mode's measurement in turn, `rounds` times (plain, llft,
    ..., plain, llft, ...), after one warm-up turn each, so that the
    machine's drift over the run falls on every mode alike; returns each
    mode's median of every number."""
    for measure in measures.values():
        measure()
    got = {mode: [] for mode in measures}
    for _ in range(rounds):
        for mode, measure in measures.items():
            got[mode].append(measure())
    return {mode: {k: statistics.median(r[k] for r in rs) if isinstance(rs[0][k], float) else rs[0][k]
                   for k in rs[0]} | {"rounds": rounds} for mode, rs in got.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, clients, rounds and requests")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serving.jsonl")
    args = ap.parse_args()
    sizes = [16, 1024, 65536] if args.quick else [16, 256, 1024, 4096, 16384, 65536]
    clients = [1, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    rounds, count, secs = (1, 300, 1.0) if args.quick else (5, 1000, 1.0)
    base = {"git": git_rev(), "replicas": args.replicas, "host": "loopback", "cpus": os.cpu_count(),
            "suite": "serving"}
    lines = []

    def add(bench: str, results: dict, **fields):
        for mode, r in results.items():
            lines.append({**base, "bench": bench, "mode": mode, **fields, **r})

    with tempfile.TemporaryDirectory(prefix="llft-bench-") as t, ExitStack() as running:
        tmp = Path(t)

        def start(argv_for_port, replicas):
            srv = Server(argv_for_port, replicas, tmp)
            running.callback(srv.stop)
            return srv

        plain, llft = start(msg_server, None), start(msg_server, args.replicas)
        # The ceiling's unreplicated servers (module doc).
        fan = ",".join(str(start(msg_server, None).port) for _ in range(args.replicas))
        for size in sizes:
            add("latency", interleaved(rounds, {m: lambda s=s: client("latency", s.port, size, count)
                                                for m, s in (("plain", plain), ("llft", llft))}))
        for c in clients:
            add("throughput", interleaved(rounds, {
                "plain": lambda: client("throughput", plain.port, 1024, c, secs),
                "llft": lambda: client("throughput", llft.port, 1024, c, secs),
                "ceiling": lambda: client("fanout", fan, 1024, c, secs)}))
        running.close()
        if have_redis():
            plain, llft = start(redis, None), start(redis, args.replicas)
            n = 5000 if args.quick else 20000
            both = interleaved(rounds, {m: lambda s=s: redis_rps(s.port, 16, n) for m, s in (("plain", plain),
                                                                                             ("llft", llft))})
            for op in ("SET", "GET"):
                add(f"redis_{op.lower()}", {m: {"rps": r[op]} for m, r in both.items()}, clients=16)
            running.close()
        if have_memcached():
            plain, llft = start(memcached, None), start(memcached, args.replicas)
            n = 500 if args.quick else 2000
            add("memcached_set", interleaved(rounds, {m: lambda s=s: {"rps": round(memcslap_rps(s.port, 16, n), 1)}
                                                      for m, s in (("plain", plain), ("llft", llft))}), clients=16)
            running.close()

    plain = {(l["bench"], l.get("size"), l.get("clients")): l for l in lines if l["mode"] == "plain"}
    for l in lines:
        p = plain.get((l["bench"], l.get("size"), l.get("clients")))
        if l["mode"] != "plain" and p:
            if "p50_us" in l:
                l["added_p50_us"] = round(l["p50_us"] - p["p50_us"], 1)
                l["ratio_p50"] = round(l["p50_us"] / p["p50_us"], 2)
                l["ratio_p99"] = round(l["p99_us"] / p["p99_us"], 2)
            else:
                l["ratio_rps"] = round(l["rps"] / p["rps"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")

    print(f"{'benchmark':24} {'plain':>18} {'llft':>18} {'ratio':>7} {'added':>9}")
    for l in lines:
        if l["mode"] == "plain":
            continue
        p = plain[(l["bench"], l.get("size"), l.get("clients"))]
        if "p50_us" in l:
            name = f"latency {l['size']} B"
            print(f"{name:24} {p['p50_us']:>8.1f}/{p['p99_us']:>7.1f}us {l['p50_us']:>8.1f}/{l['p99_us']:>7.1f}us "
                  f"{l['ratio_p50']:>7} {l['added_p50_us']:>7.1f}us")
        elif l["mode"] == "ceiling":
            print(f"{'  ceiling ' + str(l['clients']) + 'c':24} {'':>18} {l['rps']:>14.0f} rps {l['ratio_rps']:>7}"
                  f"  ({args.replicas} plain servers, each request to every one)")
        else:
            name = f"{l['bench']} {l.get('clients')}c"
            print(f"{name:24} {p['rps']:>14.0f} rps {l['rps']:>14.0f} rps {l['ratio_rps']:>7}")
    print(f"(medians of {rounds} interleaved rounds; latency: p50/p99 of one client's round trips; "
          f"written to {args.out})")


if __name__ == "__main__":
    main()
