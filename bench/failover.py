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
  stall_ms        the longest gap between two replies of one client across
                  the failover: a gap that ends after the fault and begins
                  before the successor was primary + 50 ms (the client-visible
                  stall; bench/cluster.py's definition too)
  max_gap_ms      the longest gap between two replies anywhere in the run,
                  failover or not (this shared machine's own hiccups)

Workloads (bench/suites.py): view_change (LLFT Fig. 16: vs replicas, no
clients), recovery (LLFT Fig. 17: vs concurrent clients, 2 and 3
replicas), detect (a crash and a freeze, 2 replicas, 1 client).  One
event record per trial; the clients' steady gap between replies before
the fault (steady_gap_us) is the trial's own baseline for its stall.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import threading
import time
from pathlib import Path

from bench.serving import BIN, LLFT_RUN, NET, free_port, wait_port
from llft.native import StreamFile
from llft.ordering.backend import ORDERS

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


def stop_clients(stop: threading.Event, load: list[Client]):
    """The clients stop; RuntimeError if any of them failed."""
    stop.set()
    for c in load:
        c.join()
    errors = [c.error for c in load if c.error]
    if errors:
        raise RuntimeError(f"a client failed: {errors}")


def state(rd: Path) -> dict:
    for _ in range(100):
        try:
            return json.loads((rd / "llft-run.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise RuntimeError(f"no state in {rd}")


def trial(replicas: int, clients: int, sig: signal.Signals, tmp: Path, order: str = "llft") -> dict:
    port = free_port()
    rd = tmp / f"rd-{port}"
    chosen = ["--order", order] if order != "llft" else []
    proc = subprocess.Popen([LLFT_RUN, "--replicas", str(replicas), "--run-dir", str(rd), "--port", str(port),
                             *chosen, "--", str(BIN / "msg_server"), "7000"], stdout=subprocess.DEVNULL,
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
            raise RuntimeError(f"{replicas} replicas, {clients} clients: no takeover within 10 s")
        time.sleep(0.3)
        stop_clients(stop, load)
        fo = state(rd)["failovers"][0]
        decided = fo["fenced"] or fo["detected"]
        row = {"detection_ms": round((decided - killed) * 1000, 3),
               "view_change_ms": round((promoted - decided) * 1000, 3)}
        if load:
            firsts = [next(t for t in c.stamps if t >= promoted) for c in load]
            gaps = [b - a for c in load for a, b in zip(c.stamps, c.stamps[1:])]
            across = [b - a for c in load for a, b in zip(c.stamps, c.stamps[1:])
                      if b > killed and a < promoted + 0.05]
            before = [b - a for c in load for a, b in zip(c.stamps, c.stamps[1:]) if b < killed]
            row.update(recovery_ms=round((max(firsts) - decided) * 1000, 3),
                       stall_ms=round(max(across) * 1000, 3), max_gap_ms=round(max(gaps) * 1000, 3),
                       requests=sum(len(c.stamps) for c in load),
                       steady_gap_us=round(statistics.median(before) * 1e6, 1))
        return row
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)


# scenario, and its configurations: (replicas, clients, signal, ordering backend).
PLANS = {
    "view_change": ("failover/view_change",
                    lambda counts, clients: [(n, 0, signal.SIGKILL, "llft") for n in counts]),
    "recovery": ("failover/recovery",
                 lambda counts, clients: [(n, c, signal.SIGKILL, "llft") for n in counts for c in clients]),
    "detect": ("failover/detect",
               lambda counts, clients: [(2, 1, signal.SIGKILL, "llft"), (2, 1, signal.SIGSTOP, "llft")]),
    "orders": ("failover/orders",
               lambda counts, clients: [(n, c, signal.SIGKILL, o) for n in counts for c in clients for o in ORDERS]),
}


def failovers(ctx, plan: str, trials: int, replicas=(2, 3), clients=(1,)):
    """`trials` failovers of each configuration of the plan, one event each."""
    scenario, configs = PLANS[plan]
    configs = configs(replicas, clients)
    ctx.plan(len(configs) * trials)
    for _ in range(trials):
        for n, c, sig, order in configs:
            fields = dict(backend=order, replicas=n, clients=c, size=1024 if c else None, variant=sig.name,
                          net=NET)
            try:
                ctx.rec.event(scenario, trial(n, c, sig, ctx.tmp, order), **fields)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                ctx.rec.failed(scenario, "event", repr(e), **fields)
            ctx.step()
