"""Failover benchmark (one host): how long clients wait when the primary
crashes.  A client sends 1 KiB requests back to back to examples/bin/
msg_server under llft-run; the primary is SIGKILLed mid-run.  Reported per
trial: the client-visible stall (longest gap between two replies in the
run) and the recovery time (from the kill to the reply that ends the
longest gap within 100 ms after it: detection, replay to the end of the
failed primary's stream, takeover).
Writes JSON lines to bench/results/failover.jsonl.

usage: python bench/failover.py [--trials 5] [--replicas 2 3]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from determinizer import git_rev  # noqa: E402
from serving import LLFT_RUN, BIN, free_port, wait_port  # noqa: E402


def trial(replicas: int, tmp: Path) -> dict:
    port = free_port()
    rd = tmp / f"rd-{port}"
    proc = subprocess.Popen([LLFT_RUN, "--replicas", str(replicas), "--run-dir", str(rd), "--port", str(port),
                             "--", str(BIN / "msg_server"), "7000"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_port(port, proc)
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = struct.pack(">I", 1024) + b"x" * 1024
        stamps = []
        stop = threading.Event()

        def load():
            while not stop.is_set():
                s.sendall(payload)
                got = 0
                while got < len(payload):
                    chunk = s.recv(65536)
                    if not chunk:
                        raise SystemExit("connection closed during failover")
                    got += len(chunk)
                stamps.append(time.monotonic())

        t = threading.Thread(target=load)
        t.start()
        time.sleep(0.5)
        state = json.loads((rd / "llft-run.json").read_text())
        pid = next(r["pid"] for r in state["replicas"] if r["role"] == "primary")
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        stop.set()
        t.join()
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        near = [i for i in range(len(gaps)) if killed - 0.001 <= stamps[i + 1] and stamps[i] <= killed + 0.1]
        takeover = max(near, key=gaps.__getitem__)
        before = sum(1 for x in stamps if x <= killed)
        steady = statistics.median(gaps[: max(1, before - 1)])
        return {"replicas": replicas, "requests": len(stamps),
                "stall_ms": round(max(gaps) * 1000, 2),
                "recovery_ms": round((stamps[takeover + 1] - killed) * 1000, 2),
                "steady_gap_us": round(steady * 1e6, 1)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "failover.jsonl")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="llft-bench-") as t:
        for n in args.replicas:
            for _ in range(args.trials):
                rows.append({"suite": "failover", "git": git_rev(), "host": "loopback", **trial(n, Path(t))})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{'replicas':>8} {'stall p50':>10} {'stall max':>10} {'recovery p50':>13} {'steady gap':>11}")
    for n in args.replicas:
        rs = [r for r in rows if r["replicas"] == n]
        print(f"{n:>8} {statistics.median(r['stall_ms'] for r in rs):>8.2f}ms {max(r['stall_ms'] for r in rs):>8.2f}ms "
              f"{statistics.median(r['recovery_ms'] for r in rs):>11.2f}ms "
              f"{statistics.median(r['steady_gap_us'] for r in rs):>9.1f}us")
    print(f"({args.trials} trials each; written to {args.out})")


if __name__ == "__main__":
    main()
