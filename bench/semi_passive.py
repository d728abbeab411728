"""Semi-passive replication (llft-run --mode semi-passive, issue 20):
what the checkpoint interval costs and buys, against the unreplicated
server and semi-active llft in the same run.

semi_passive/throughput: examples/bin/msg_server, closed-loop clients
sending 1 KiB requests for `secs`, measured in turn (plain, semi-active
with 2 replicas, semi-passive with 2 replicas at each interval): every
checkpoint holds the primary still and frozen while CRIU dumps it.

semi_passive/failover: per interval and trial, the same server under
semi-passive, C clients back to back, the primary killed (SIGKILL) 0.9
of an interval after its second checkpoint was stored; a copy of that
checkpoint is restored, replays what came after it and takes over.  On this host's monotonic clock:

  failover_ms   the kill -> every client has its first reply after its
                longest gap that ends after the kill
  stall_ms      the longest gap between two replies of one client across
                the kill (bench/failover.py's definition)
  restore_ms    the copy's restore (CRIU), from the state file
  since_checkpoint_ms  how old the checkpoint restored was at the kill
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import ExitStack

from bench.failover import Client, state, stop_clients
from bench.serving import NET, interleaved, msg_server, servers, window_measure

SIZE = 1024


def _mode(interval: float) -> list[str]:
    return ["--mode", "semi-passive", "--checkpoint-every", str(interval)]


def _failover(ctx, interval: float, clients: int, trial: int):
    fields = dict(backend="llft-semi-passive", replicas=2, clients=clients, net=NET, variant=f"{interval:g} s",
                  interval_s=interval, round=trial)
    stop = threading.Event()
    with ExitStack() as stack:
        srv = servers(ctx, stack)(msg_server, 2, _mode(interval))
        rd = ctx.tmp / f"rd-{srv.port}"
        try:
            load = [Client(srv.port, stop) for _ in range(clients)]
            for c in load:
                c.start()
            # Killed late in an interval: a checkpoint stored under load,
            # then 0.9 of an interval's records and input to replay.
            deadline = time.monotonic() + 30
            while (state(rd).get("stored_checkpoint") or {}).get("number", 0) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("no second checkpoint stored within 30 s")
                time.sleep(0.01)
            time.sleep(0.9 * interval)
            st = state(rd)
            primary = next(r for r in st["replicas"] if r["role"] == "primary")
            stored_at = st["stored_checkpoint"]["at"]
            killed, killed_wall = time.monotonic(), time.time()
            os.kill(primary["pid"], signal.SIGKILL)
            while True:
                st = state(rd)
                new = next((r for r in st["replicas"] if r["role"] == "primary" and r["index"] != primary["index"]
                            and r["catch_up"] and r["catch_up"]["done"]), None)
                if new is not None:
                    break
                if time.monotonic() > killed + 60:
                    raise RuntimeError("no copy took over within 60 s")
                time.sleep(0.01)
            time.sleep(0.3)
            stop_clients(stop, load)
            # Each client's longest gap that ends after the kill: replies
            # the gateway had before it still arrive just after it.
            stalls = [max(((b - a, b) for a, b in zip(c.stamps, c.stamps[1:]) if b > killed)) for c in load]
            ctx.rec.event("semi_passive/failover", {
                "failover_ms": round((max(b for _gap, b in stalls) - killed) * 1000, 1),
                "stall_ms": round(max(gap for gap, _b in stalls) * 1000, 1),
                "restore_ms": new["checkpoint"]["restore_ms"],
                "replayed_records": new["catch_up"]["records"],
                "since_checkpoint_ms": round((killed_wall - stored_at) * 1000, 1)}, **fields)
        except (RuntimeError, OSError, StopIteration, KeyError, TypeError) as e:
            ctx.rec.failed("semi_passive/failover", "event", repr(e), **fields)
        finally:
            stop.set()


def semi_passive(ctx, intervals=(0.2, 0.5, 1.0, 2.0), clients: int = 4, rounds: int = 3, secs: float = 2.0,
                 trials: int = 3):
    from llft.checkpoint.criu import problem as criu_problem
    problem = criu_problem()
    if problem:
        ctx.skip(f"no working CRIU: {problem}")
        return
    ctx.plan((2 + len(intervals)) * rounds + len(intervals) * trials)
    with ExitStack() as stack:
        start = servers(ctx, stack)
        measures = {
            "plain": window_measure(ctx, "semi_passive/throughput", "throughput", start(msg_server, None).port,
                                    SIZE, clients, secs, backend="plain", replicas=1, net=NET),
            "semi-active": window_measure(ctx, "semi_passive/throughput", "throughput",
                                          start(msg_server, 2).port, SIZE, clients, secs,
                                          backend="llft", replicas=2, net=NET)}
        for i in intervals:
            measures[f"semi-passive {i:g}"] = window_measure(
                ctx, "semi_passive/throughput", "throughput", start(msg_server, 2, _mode(i)).port, SIZE, clients,
                secs, backend="llft-semi-passive", replicas=2, net=NET, variant=f"{i:g} s", interval_s=i)
        interleaved(ctx, rounds, measures)
    for i in intervals:
        for trial in range(trials):
            _failover(ctx, i, clients, trial)
            ctx.step()
