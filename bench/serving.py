"""Replicated-server benchmark: LLFT Fig. 12 (latency vs message size) and
Fig. 13 (throughput vs concurrent clients), and redis-benchmark and
memcslap throughput, each through llft-run (3 replicas by default) and
against the same server unreplicated, in the same run.

Writes JSON lines to bench/results/serving.jsonl and prints a table.
usage: python bench/serving.py [--replicas 3] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, clients and requests")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serving.jsonl")
    args = ap.parse_args()
    sizes = [16, 1024, 65536] if args.quick else [16, 256, 1024, 4096, 16384, 65536]
    clients = [1, 16] if args.quick else [1, 2, 4, 8, 16, 32]
    count, secs = (300, 1.0) if args.quick else (2000, 2.0)
    base = {"git": git_rev(), "replicas": args.replicas, "host": "loopback", "cpus": os.cpu_count()}
    lines = []

    with tempfile.TemporaryDirectory(prefix="llft-bench-") as t:
        tmp = Path(t)
        for mode, replicas in (("plain", None), ("llft", args.replicas)):
            srv = Server(msg_server, replicas, tmp)
            try:
                for size in sizes:
                    r = client("latency", srv.port, size, count)
                    lines.append({**base, "suite": "serving", "bench": "latency", "mode": mode, **r})
                for c in clients:
                    r = client("throughput", srv.port, 1024, c, secs)
                    lines.append({**base, "suite": "serving", "bench": "throughput", "mode": mode, **r})
            finally:
                srv.stop()
            if have_redis():
                srv = Server(redis, replicas, tmp)
                try:
                    for op, rps in redis_rps(srv.port, 16, 5000 if args.quick else 20000).items():
                        lines.append({**base, "suite": "serving", "bench": f"redis_{op.lower()}", "mode": mode,
                                      "clients": 16, "rps": rps})
                finally:
                    srv.stop()
            if have_memcached():
                srv = Server(memcached, replicas, tmp)
                try:
                    rps = memcslap_rps(srv.port, 16, 500 if args.quick else 2000)
                    lines.append({**base, "suite": "serving", "bench": "memcached_set", "mode": mode,
                                  "clients": 16, "rps": round(rps, 1)})
                finally:
                    srv.stop()

    plain = {(l["bench"], l.get("size"), l.get("clients")): l for l in lines if l["mode"] == "plain"}
    for l in lines:
        p = plain.get((l["bench"], l.get("size"), l.get("clients")))
        if l["mode"] == "llft" and p:
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
        if l["mode"] != "llft":
            continue
        p = plain[(l["bench"], l.get("size"), l.get("clients"))]
        if "p50_us" in l:
            name = f"latency {l['size']} B"
            print(f"{name:24} {p['p50_us']:>8.1f}/{p['p99_us']:>7.1f}us {l['p50_us']:>8.1f}/{l['p99_us']:>7.1f}us "
                  f"{l['ratio_p50']:>7} {l['added_p50_us']:>7.1f}us")
        else:
            name = f"{l['bench']} {l.get('clients')}c"
            print(f"{name:24} {p['rps']:>14.0f} rps {l['rps']:>14.0f} rps {l['ratio_rps']:>7}")
    print(f"(latency: p50/p99 of one client's round trips; written to {args.out})")


if __name__ == "__main__":
    main()
