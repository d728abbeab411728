"""Failover benchmark (one host): how long a primary change takes, LLFT
Figs. 16 and 17, and what clients see of it.

Each trial starts examples/bin/msg_server under llft-run, lets C clients
send 1 KiB requests back to back (closed loop), then fails the primary:
SIGKILL (a crash), or SIGSTOP (a timing fault, detected after
--fault-timeout and fenced).  Per trial, on this host's monotonic clock:

  detection_ms    the fault (signal sent) -> llft-run decides the primary failed
                  (pidfd wake-up for a crash; fault timeout + fencing for a freeze)
  view_change_ms  that decision -> the successor is primary (the shim's
                  promotion time: it has replayed the failed primary's last
                  records, every thread has taken its last record, and the
                  role has flipped)
  recovery_ms     the decision -> every client has a reply from the new
                  primary (view change + virtual synchrony + the resent
                  output reaching the clients), LLFT Fig. 17
  stall_ms        the longest gap between two replies any client saw in the
                  run (the client-visible stall)

  --figure 16: view change vs replicas (2-5), no clients
  --figure 17: recovery vs concurrent clients (1-16), 2 and 3 replicas
  --figure detect: detection of a crash and of a freeze, 2 replicas, 1 client

Writes JSON lines to bench/results/failover.jsonl (one per trial).

usage: python bench/failover.py [--trials 5] [--figure 16 17 detect]
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

from llft.native import StreamFile  # noqa: E402

PAYLOAD = struct.pack(">I", 1024) + b"x" * 1024


class Client(threading.Thread):
    def __init__(self, port: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.stop = stop
        self.stamps: list[float] = []
        self.error = None

    def run(self):
        try:
            while not self.stop.is_set():
                self.sock.sendall(PAYLOAD)
                got = 0
                while got < len(PAYLOAD):
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("connection closed during failover")
                    got += len(chunk)
                self.stamps.append(time.monotonic())
        except OSError as e:
            self.error = str(e)


def state(rd: Path) -> dict:
    for _ in range(100):
        try:
            return json.loads((rd / "llft-run.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise SystemExit(f"no state in {rd}")


def trial(replicas: int, clients: int, sig: signal.Signals, tmp: Path) -> dict:
    port = free_port()
    rd = tmp / f"rd-{port}"
    proc = subprocess.Popen([LLFT_RUN, "--replicas", str(replicas), "--run-dir", str(rd), "--port", str(port),
                             "--", str(BIN / "msg_server"), "7000"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    stop = threading.Event()
    try:
        wait_port(port, proc)
        load = [Client(port, stop) for _ in range(clients)]
        for c in load:
            c.start()
        time.sleep(0.5)
        members = state(rd)["replicas"]
        primary = next(r for r in members if r["role"] == "primary")
        successor = next(r for r in members if r["role"] == "backup")
        with StreamFile(successor["stream"]) as s:
            killed = time.monotonic()
            os.kill(primary["pid"], sig)
            end = killed + 10
            while not s.promoted_ns and time.monotonic() < end:
                time.sleep(0.0005)
            promoted = s.promoted_ns / 1e9
        if not promoted:
            raise SystemExit(f"{replicas} replicas, {clients} clients: no takeover within 10 s")
        time.sleep(0.3)
        stop.set()
        for c in load:
            c.join()
        errors = [c.error for c in load if c.error]
        if errors:
            raise SystemExit(f"a client failed: {errors}")
        fo = state(rd)["failovers"][0]
        decided = fo["fenced"] or fo["detected"]
        row = {"replicas": replicas, "clients": clients, "signal": sig.name,
               "detection_ms": round((decided - killed) * 1000, 3),
               "view_change_ms": round((promoted - decided) * 1000, 3)}
        if load:
            firsts = [next(t for t in c.stamps if t >= promoted) for c in load]
            gaps = [b - a for c in load for a, b in zip(c.stamps, c.stamps[1:])]
            before = [b - a for c in load for a, b in zip(c.stamps, c.stamps[1:]) if b < killed]
            row.update(recovery_ms=round((max(firsts) - decided) * 1000, 3),
                       stall_ms=round(max(gaps) * 1000, 3),
                       requests=sum(len(c.stamps) for c in load),
                       steady_gap_us=round(statistics.median(before) * 1e6, 1))
        return row
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)


def pct(values, q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def summary(rows, key: str) -> str:
    vals = [r[key] for r in rows if key in r]
    return f"{statistics.median(vals):8.3f} / {pct(vals, 0.99):8.3f}" if vals else f"{'-':>19}"


PLANS = {
    "16": [(n, 0, signal.SIGKILL) for n in (2, 3, 4, 5)],
    "17": [(n, c, signal.SIGKILL) for n in (2, 3) for c in (1, 2, 4, 8, 16)],
    "detect": [(2, 1, signal.SIGKILL), (2, 1, signal.SIGSTOP)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--figure", nargs="+", choices=sorted(PLANS), default=["16", "17", "detect"])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "failover.jsonl")
    args = ap.parse_args()
    rows = []
    rev = git_rev()
    with tempfile.TemporaryDirectory(prefix="llft-bench-") as t:
        for fig in args.figure:
            for replicas, clients, sig in PLANS[fig]:
                for _ in range(args.trials):
                    rows.append({"suite": "failover", "figure": fig, "git": rev, "host": "loopback",
                                 **trial(replicas, clients, sig, Path(t))})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{'fig':>6} {'repl':>4} {'cli':>3} {'signal':>7}   {'detection p50 / p99':>19}   "
          f"{'view change p50 / p99':>19}   {'recovery p50 / p99':>19}   {'stall p50 / p99':>19}  (ms)")
    for fig in args.figure:
        for replicas, clients, sig in PLANS[fig]:
            rs = [r for r in rows if r["figure"] == fig and r["replicas"] == replicas and r["clients"] == clients
                  and r["signal"] == sig.name]
            print(f"{fig:>6} {replicas:>4} {clients:>3} {sig.name:>7}   {summary(rs, 'detection_ms')}   "
                  f"{summary(rs, 'view_change_ms')}   {summary(rs, 'recovery_ms')}   {summary(rs, 'stall_ms')}")
    print(f"({args.trials} trials each, git {rev}; written to {args.out})")


if __name__ == "__main__":
    main()
