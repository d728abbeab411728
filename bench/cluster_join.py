"""A newcomer across hosts brought up from a checkpoint (issue 20;
llft/cluster/checkpoint_join.py, backup_checkpoint.py): redis holding about
10 MiB and 100 MiB (DEBUG POPULATE, 1 KiB values) on network-namespace
hosts with a --history-limit it is past from the start, a member started
beside them; a client on the gateway's host PINGs the primary throughout.
Two sources: "backup" (a primary and a backup: the backup's replica is
checkpointed, the primary serves on) and "primary" (a group of one: the
primary's own, which pauses it).

Per join: the join end to end (from the newcomer's start to its replica
restored and the state file saying so), the primary's pause (CRIU's
frozen time where the source is the primary, 0 otherwise; and the
client's slowest round trip during the join against the second before
it), the source's frozen time, the checkpoint's time at the source, the
image's size, the restore's time at the newcomer.

Workload `cluster_join` of `python -m bench run` (root and CRIU; skipped
otherwise).  Records: scenario checkpoint/join_across_hosts, net
"netns", variant the size and the source ("100 MiB, backup")."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from bench.checkpoint import cannot_checkpoint_redis
from bench.cluster import GATEWAY_HOST, PORT, BenchCluster
from bench.records import REPO

sys.path.insert(0, str(REPO / "tests"))      # the netns hosts of the tests
from netns import bridged_hosts, in_ns  # noqa: E402

SCENARIO = "checkpoint/join_across_hosts"
LIMIT_MIB = "0.05"        # redis's start alone passes it: every newcomer gets a checkpoint
VALUE_BYTES = 1024

# RESP from the client host: POPULATE once, or PING until stdin closes,
# printing (start, round trip) per PING on CLOCK_MONOTONIC.  The PINGs are
# counted from the moment the group is quiet (20 in a row answered within
# 20 ms): what comes before the join (once, a first PING right after a 100
# MiB POPULATE took 5 s, its records still on their way to the backup) is
# not the join's.
CLIENT = r"""
import socket, sys, time, select
port, what = int(sys.argv[1]), sys.argv[2:]
s = socket.create_connection(("127.0.0.1", port), timeout=600)
f = s.makefile("rwb")
def ask(*args):
    f.write(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in args))
    f.flush()
    return f.readline()
if what[0] == "populate":
    print(ask("DEBUG", "POPULATE", what[1], "key", what[2]).decode().strip(), flush=True)
else:
    quiet, deadline = 0, time.monotonic() + 300
    while quiet < 20 and time.monotonic() < deadline:
        t0 = time.monotonic()
        assert ask("PING") == b"+PONG\r\n"
        quiet = quiet + 1 if time.monotonic() - t0 < 0.02 else 0
        time.sleep(0.01)
    samples = []
    print("go", flush=True)
    while not select.select([sys.stdin], [], [], 0)[0]:
        t0 = time.monotonic()
        assert ask("PING") == b"+PONG\r\n"
        samples.append((round(t0, 6), round(time.monotonic() - t0, 6)))
        time.sleep(0.001)
    print(samples, flush=True)
"""


def _client(c: BenchCluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen(in_ns(c.hosts[GATEWAY_HOST][0], sys.executable, "-c", CLIENT, str(PORT), *args),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def worst_ms(samples, start: float, until: float) -> float | None:
    got = [rt for t, rt in samples if start <= t <= until]
    return round(max(got) * 1000, 2) if got else None


def one_join(ctx, hosts, size_mib: int, trial: int, source: str):
    members = 2 if source == "backup" else 1
    fields = dict(backend="llft", replicas=members + 1, clients=1, net="netns", variant=f"{size_mib} MiB, {source}",
                  size=size_mib)
    tmp = ctx.tmp / f"join-{size_mib}-{source}-{trial}"
    tmp.mkdir(parents=True)
    c = BenchCluster(hosts, tmp)
    pinger = None
    try:
        program = [shutil.which("redis-server"), "--port", str(PORT), "--save", "", "--appendonly", "no",
                   "--enable-debug-command", "yes"]
        c.form(members, "kv", ["--history-limit", LIMIT_MIB], program)
        c.start_gateway(GATEWAY_HOST)
        populate = _client(c, "populate", str(size_mib * (1 << 20) // VALUE_BYTES), str(VALUE_BYTES))
        if populate.communicate(timeout=600)[0].strip() != "+OK":
            raise RuntimeError("DEBUG POPULATE failed")
        deadline = time.monotonic() + 600
        while True:   # the backup has replayed the population
            sts = [c.status(d) for _, d in c.members]
            if all(st and st["replicas"] for st in sts) and \
                    sts[-1]["replicas"][0]["records"] >= sts[0]["replicas"][0]["records"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the backup did not catch up")
            time.sleep(0.2)
        pinger = _client(c, "ping")
        if pinger.stdout.readline().strip() != "go":
            raise RuntimeError("the pinging client did not start")
        time.sleep(1.0)
        started = time.monotonic()
        late = c.start_member(members, program, "kv", ["--history-limit", LIMIT_MIB])
        while True:
            st = c.status(late)
            last = (st or {}).get("last_checkpoint") or {}
            if last.get("restored") and st["replicas"] and st["replicas"][0]["role"] == "backup":
                joined = time.monotonic()
                break
            if time.monotonic() > started + 300:
                raise RuntimeError("the newcomer did not join within 300 s")
            time.sleep(0.005)
        time.sleep(0.5)
        pinger.stdin.close()
        samples = json.loads(pinger.stdout.readline().replace("(", "[").replace(")", "]"))
        newcomer = st["member"]
        taken = next((s["last_checkpoint"] for s in map(c.status, (d for _, d in c.members[:members]))
                      if s and (s.get("last_checkpoint") or {}).get("newcomer") == newcomer), None)
        if taken is None:
            raise RuntimeError("no member says it took the checkpoint")
        if taken["source"] != source:
            raise RuntimeError(f"the checkpoint was of the {taken['source']}, not of the {source}")
        ctx.rec.event(SCENARIO, {
            "join_ms": round((joined - started) * 1000, 1),
            "primary_frozen_ms": taken["frozen_ms"] if source == "primary" else 0.0,
            "source_frozen_ms": taken["frozen_ms"],
            "checkpoint_ms": taken["took_ms"], "image_mib": round(taken["image_bytes"] / 2**20, 1),
            "restore_ms": last["restore_ms"],
            "primary_worst_rtt_before_ms": worst_ms(samples, started - 1.0, started),
            "primary_worst_rtt_during_ms": worst_ms(samples, started, joined)}, round=trial, **fields)
    except (RuntimeError, OSError, AssertionError, subprocess.SubprocessError, ValueError, KeyError) as e:
        ctx.rec.failed(SCENARIO, "event", repr(e), round=trial, **fields)
    finally:
        if pinger is not None and pinger.poll() is None:
            pinger.kill()
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def cluster_join(ctx, sizes_mib=(10, 100), trials: int = 3, sources=("backup", "primary")):
    why = "needs root (network namespaces)" if os.geteuid() != 0 else cannot_checkpoint_redis()
    if why:
        ctx.skip(why)
        return
    ctx.plan(len(sizes_mib) * len(sources) * trials)
    with bridged_hosts(GATEWAY_HOST + 1) as hosts:
        for size in sizes_mib:
            for source in sources:
                for trial in range(trials):
                    one_join(ctx, hosts, size, trial, source)
                    ctx.step()
