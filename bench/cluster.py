"""Groups across hosts, on network-namespace hosts joined by one bridge (no
netem on this kernel: no added delay).  Needs root.

1. Issue #4 across hosts: LLFT Fig. 12 (latency p50/p99 vs message size,
   request = reply) and Fig. 13 (throughput vs concurrent clients, 1 KiB)
   for examples/bin/msg_server replicated 3-way (`llft-run --join` on three
   hosts, `llft-gateway` and the C load generator on a fourth) against the
   same server unreplicated on one host, reached directly from the client
   host, in the same run; and redis-benchmark (SET, GET) and memcslap (set)
   with 16 clients against Debian's redis-server and memcached the same
   two ways.
2. Issue #5 across hosts: LLFT Fig. 16 (primary view change vs number of
   replicas, no clients), fault detection time, and Fig. 17 (recovery =
   view change + virtual synchrony, vs concurrent clients, 2- and 3-way)
   with the client-visible stall (longest gap between two replies a client
   sees), with the default fault timeout and another one.

The primary host "crashes": its member controller and its replica are
SIGKILLed together.  Times come from CLOCK_MONOTONIC, shared by every
namespace: the kill here, the member's `failover_at` marks in its state
file (suspected = the first ProposePrimary sent, last_ack = the last
acknowledgment received, elected = the proposer saw every acknowledgment,
took_over = virtual synchrony reached, serving),
the clients' reply stamps.

Workload `cluster` of `python -m bench run` (root; skipped otherwise).
Records: scenarios serving/latency, serving/throughput, redis/*,
memcached/set, failover/view_change and failover/recovery, as on one host,
with net "netns"; the failover events' variant names the fault timeout.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from bench.records import REPO
from bench.servers import have_memcached, have_redis, memcached, memcslap_rps, redis, redis_rps
from bench.serving import BIN, interleaved, latency_measure, real_server, window_measure
from llft.cluster.member import FAULT_TIMEOUT_S
from llft.rundir import STATE_FILE

sys.path.insert(0, str(REPO / "tests"))      # the netns hosts and the Cluster harness of the tests
from netns import bridged_hosts, in_ns  # noqa: E402
from test_multihost import Cluster  # noqa: E402

GATEWAY_HOST = 5          # hosts 0..4 hold members, 5 the gateway and the clients
PORT = 7000               # the gateway's port (and the program's)
PLAIN_PORT = 7100         # the unreplicated server's
STARTUP_GRACE_S = 1.3     # a member suspects nobody in its first second (llft/ordering/llmp/membership/detector.py)
DEFAULT_TIMEOUT_MS = FAULT_TIMEOUT_S * 1000  # the members' default fault timeout, as root
NET = "netns"


class BenchCluster(Cluster):
    """The tests' Cluster, with process output in files (a bench runs long
    enough to fill a pipe) and state read straight from the run dir."""

    def _start(self, host: int, argv: list, env: dict | None = None) -> subprocess.Popen:
        path = self.tmp / f"proc-{len(self.procs)}.log"
        with open(path, "w") as out:
            p = subprocess.Popen(in_ns(self.hosts[host][0], *argv), stdout=out, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, **env) if env else None)
        p.stderr = open(path)            # what Cluster.wait reports when a process ends early
        self.procs.append(p)
        return p

    def status(self, run_dir: Path) -> dict | None:
        try:
            return json.loads((run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None

    def form(self, n: int, group: str, extra=(), program=None) -> list[Path]:
        """n members on hosts 0..n-1 running program (msg_server by default):
        the first founds the group, the others join."""
        program = program or [BIN / "msg_server", PORT]
        first = self.start_member(0, program, group, extra)
        self.wait(lambda: (s := self.status(first)) and s["members"], "the first member to found the group")
        for host in range(1, n):
            self.start_member(host, program, group, extra)
        self.wait_members(n)
        return [d for _, d in self.members]

    def crash_primary(self) -> float:
        """SIGKILLs the primary's controller and replica (a host crash); returns when."""
        st = self.status(self.members[0][1])
        assert st["replicas"][0]["role"] == "primary"
        self.crashed = st
        t0 = time.monotonic()
        for pid in (st["controller_pid"], st["replicas"][0]["pid"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:      # the replica may die with its controller first
                pass
        return t0

    def took_over(self, timeout: float = 15) -> dict:
        """The failover_at marks of the survivor that took over."""
        found = {}

        def done():
            for _, d in self.members[1:]:
                s = self.status(d)
                marks = (s or {}).get("failover_at") or {}
                if marks.get("took_over") and marks.get("promoted"):   # (the state file comes every STATE_EVERY_S)
                    found.update(s["failover_at"])
                    return True
            return False
        self.wait(done, "a backup to take over", timeout=timeout, watch=False)
        return found

    def diagnose(self):
        """What every process logged last, and the gateway's messaging state (a run that hung)."""
        for path in sorted(self.tmp.glob("proc-*.log")):
            print(f"--- {path.name}:", *path.read_text().splitlines()[-8:], sep="\n  ", file=sys.stderr)
        for d in [self.gateway_dir, *(d for _, d in self.members)]:
            st = self.status(d) or {}
            print(f"--- {d.name} messaging:", json.dumps(st.get("messaging"))[:3000], file=sys.stderr)

    def stop(self):
        super().stop()
        for p in self.procs:
            p.stderr.close()
        st = getattr(self, "crashed", None)     # a crashed member leaves its replica's ring behind
        if st:
            try:
                os.unlink(st["replicas"][0]["stream"])
            except OSError:
                pass


# Closed-loop clients that stamp every reply (CLOCK_MONOTONIC), run in the client host.
LOAD = r"""
import json, socket, struct, sys, threading, time
port, clients, size, secs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
msg = struct.pack(">I", size) + b"x" * size
stamps, errors, first = [[] for _ in range(clients)], [], threading.Barrier(clients + 1)
def run(i):
    st = stamps[i]
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as e:
        errors.append(repr(e)); first.abort(); return
    waiting = True
    while True:
        s.sendall(msg)
        got = 0
        while got < len(msg):
            chunk = s.recv(65536)
            if not chunk:
                errors.append(f"client {i}: connection closed"); return
            got += len(chunk)
        st.append(time.monotonic())
        if waiting:
            waiting = False
            first.wait()
        if st[-1] >= end:
            return
end = float("inf")
threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
for t in threads:
    t.start()
first.wait()
end = time.monotonic() + secs
print("go", flush=True)
for t in threads:
    t.join()
print(json.dumps({"stamps": [[round(x, 6) for x in st] for st in stamps], "errors": errors}), flush=True)
"""


def ms(x: float) -> float:
    return round(x * 1000, 3)


def one_failover(hosts, tmp: Path, n: int, clients: int, fault_timeout: float | None) -> dict:
    """One group of n members, `clients` closed-loop 1 KiB clients (0: none,
    no gateway), the primary host crashed; what it cost."""
    tag = f"g{len(list(tmp.iterdir()))}"
    (tmp / tag).mkdir()
    extra = ["--fault-timeout", fault_timeout] if fault_timeout else []
    c = BenchCluster(hosts, tmp / tag)
    load = None
    try:
        c.form(n, tag, extra)
        formed = time.monotonic()
        if clients:
            c.start_gateway(GATEWAY_HOST, tag, PORT)
            load = subprocess.Popen(in_ns(hosts[GATEWAY_HOST][0], sys.executable, "-c", LOAD, PORT, clients, 1024,
                                          2.0), stdout=subprocess.PIPE, text=True)
            assert load.stdout.readline().strip() == "go", "the clients could not start"
            time.sleep(0.4)
        time.sleep(max(0.0, formed + STARTUP_GRACE_S - time.monotonic()))
        t0 = c.crash_primary()
        marks = c.took_over()
        row = {"detection_ms": ms(marks["suspected"] - t0),
               "view_change_ms": ms(marks["took_over"] - marks["suspected"]),
               "phase1_ms": ms(marks["elected"] - marks["suspected"]),
               # the last acknowledgment in: phase 1's messages, without waiting for the next tick
               "acks_ms": ms(marks["last_ack"] - marks["suspected"]) if marks.get("last_ack") else None,
               "phase2_ms": ms(marks["took_over"] - marks["elected"]),
               # PROMOTE reaches the new primary's replica (its feeder thread writes it): after the takeover if > 0
               "promote_ms": ms(marks["promoted"] - marks["took_over"]) if marks.get("promoted") else None,
               "crash_to_primary_ms": ms(marks["took_over"] - t0)}
        if load is not None:
            out, _ = load.communicate(timeout=60)
            got = json.loads(out.splitlines()[-1])
            load = None
            row.update(client_view(got, t0, marks["took_over"]))
        return row
    finally:
        if load is not None:
            load.kill()
            load.wait()
        c.stop()


def client_view(got: dict, t0: float, took_over: float) -> dict:
    """The stall clients saw: the longest gap between two replies of one
    client across the failover (a gap that ends after the crash and begins
    before the new primary serves, +50 ms), the longest gap anywhere in the
    run, and how long after the crash each client had its next reply."""
    stamps = [s for s in got["stamps"] if s]
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:])]
    across = [b - a for s in stamps for a, b in zip(s, s[1:]) if b > t0 and a < took_over + 0.05]
    before = sorted(b - a for s in stamps for a, b in zip(s, s[1:]) if b < t0)
    resumed = [next((x for x in s if x > t0), None) for s in stamps]
    return {"stall_ms": ms(max(across)) if across else None, "max_gap_ms": ms(max(gaps)),
            "crash_to_reply_ms": ms(max(r - t0 for r in resumed)) if all(resumed) else None,
            "takeover_to_reply_ms": ms(max(r - took_over for r in resumed)) if all(resumed) else None,
            "steady_gap_p50_us": round(before[len(before) // 2] * 1e6, 1) if before else None,
            "steady_gap_p99_us": round(before[len(before) * 99 // 100] * 1e6, 1) if before else None,
            "replies": sum(map(len, stamps)), "client_errors": len(got["errors"])}


def serving(ctx, hosts, sizes, clients, count: int, secs: float, rounds: int):
    """Figs. 12 and 13 across hosts: the unreplicated server on host 0,
    reached directly from the clients' host, and the 3-way group through the
    gateway, side by side and measured in turn."""
    ctx.plan(rounds * 2 * (len(sizes) + len(clients)))
    prefix = in_ns(hosts[GATEWAY_HOST][0])
    with ExitStack() as stack:
        plain = subprocess.Popen(in_ns(hosts[0][0], BIN / "msg_server", PLAIN_PORT))
        stack.callback(plain.wait)
        stack.callback(plain.terminate)
        target = f"{hosts[0][1]}:{PLAIN_PORT}"
        for _ in range(100):                       # until it listens
            if subprocess.run([*prefix, str(BIN / "msg_client"), "latency", target, "16", "1"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        (ctx.tmp / "serving").mkdir()
        c = BenchCluster(hosts, ctx.tmp / "serving")
        stack.callback(c.stop)
        c.form(3, "serving")
        c.start_gateway(GATEWAY_HOST, "serving", PORT)
        backends = {"plain": (target, 1), "llft": (str(PORT), 3)}
        for size in sizes:
            interleaved(ctx, rounds, {b: latency_measure(ctx, "serving/latency", t, size, count, prefix=prefix,
                                                         backend=b, replicas=n, net=NET)
                                      for b, (t, n) in backends.items()})
        for k in clients:
            interleaved(ctx, rounds, {b: window_measure(ctx, "serving/throughput", "throughput", t, 1024, k, secs,
                                                        prefix=prefix, backend=b, replicas=n, net=NET)
                                      for b, (t, n) in backends.items()})


def real_servers(ctx, hosts, quick: bool):
    """redis-benchmark (SET, GET) and memcslap (set) with 16 clients from the
    clients' host: against the server unreplicated on host 0, and through
    the gateway to it replicated on hosts 0-2, in the same run."""
    client_ns = in_ns(hosts[GATEWAY_HOST][0])
    n_plain, n_llft = (2000, 500) if quick else (20000, 3000)
    for name, available, program, load in (
            ("redis", have_redis, redis,
             lambda t: {f"redis/{op.lower()}": (t[2], rps) for op, rps in
                        redis_rps(t[1], 16, t[2], t[0], client_ns).items()}),
            ("memcached", have_memcached, memcached,
             lambda t: {"memcached/set": (16 * max(1, t[2] // 16),
                                          memcslap_rps(t[1], 16, max(1, t[2] // 16), t[0], client_ns))})):
        if not available():
            ctx.skip(f"{name} or its load tool is not installed")
            continue
        with ExitStack() as stack:
            plain = subprocess.Popen(in_ns(hosts[0][0], *program(PLAIN_PORT, "0.0.0.0")), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            stack.callback(plain.wait)
            stack.callback(plain.terminate)
            (ctx.tmp / name).mkdir()
            c = BenchCluster(hosts, ctx.tmp / name)
            stack.callback(c.stop)
            c.form(3, name, program=program(PORT, "0.0.0.0"))
            c.start_gateway(GATEWAY_HOST, name, PORT)
            time.sleep(0.5)
            try:
                real_server(ctx, {"plain": ((hosts[0][1], PLAIN_PORT, n_plain), 1),
                                  "llft": (("127.0.0.1", PORT, n_llft), 3)}, load, 1, 16, NET)
            except (subprocess.CalledProcessError, AssertionError) as e:
                print(f"{name} across hosts failed: {e!r}"[:2000], file=sys.stderr)
                c.diagnose()
                ctx.rec.failed(f"{name}/*", "window", repr(e), backend="llft", replicas=3, clients=16, net=NET)


def failovers(ctx, hosts, trials: int, clients, other_timeout: float):
    """Fig. 16 (no clients, 2-5 members) and Fig. 17 with the stall (2 and 3
    members, the default fault timeout and another), one event a trial."""
    fig17 = [(n, k, t) for t in (None, other_timeout) for n in (2, 3) for k in (clients if t is None else [1, 16])]
    ctx.plan(trials * 4 + max(1, (trials + 1) // 2) * len(fig17))
    ft = ctx.tmp / "failover"
    ft.mkdir()

    def trial(scenario, n, k, timeout):
        # the default fault timeout unnamed: the report checks the stall target against those rows
        variant = "host crash" + (f", --fault-timeout {timeout:g}" if timeout else "")
        fields = dict(backend="llft", replicas=n, clients=k, size=1024 if k else None, variant=variant, net=NET)
        try:
            ctx.rec.event(scenario, one_failover(hosts, ft, n, k, timeout), **fields)
        except (AssertionError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
            print(f"failover trial ({n} replicas, {k} clients) failed: {e!r}"[:2000], file=sys.stderr)
            ctx.rec.failed(scenario, "event", repr(e), **fields)
        ctx.step()
    for _ in range(trials):
        for n in [2, 3, 4, 5]:
            trial("failover/view_change", n, 0, None)
    for _ in range(max(1, (trials + 1) // 2)):
        for n, k, timeout in fig17:
            trial("failover/recovery", n, k, timeout)


def cluster(ctx, quick: bool, trials: int, other_timeout: float = 60.0, rounds: int = 1, only=None):
    if os.geteuid() != 0:
        ctx.skip("needs root (network namespaces)")
        return
    sizes = [16, 1024, 65536] if quick else [16, 256, 1024, 4096, 16384, 65536]
    clients = [1, 16] if quick else [1, 2, 4, 8, 16]
    count, secs = (300, 1.0) if quick else (1000, 2.0)
    with bridged_hosts(GATEWAY_HOST + 1) as hosts:
        if only != "failover":
            serving(ctx, hosts, sizes, clients, count, secs, rounds)
            real_servers(ctx, hosts, quick)
        if only != "serving":
            failovers(ctx, hosts, trials, clients, other_timeout)
