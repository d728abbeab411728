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

Writes JSON lines to bench/results/cluster.jsonl and prints tables.
usage: sudo .venv/bin/python bench/cluster.py [--quick] [--trials N]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / "examples" / "bin"
sys.path.insert(0, str(REPO / "tests"))      # the netns hosts and the Cluster harness of the tests
from netns import bridged_hosts, in_ns  # noqa: E402
from test_multihost import Cluster  # noqa: E402

from servers import have_memcached, have_redis, memcached, memcslap_rps, redis, redis_rps  # noqa: E402

from llft.cluster.member import FAULT_TIMEOUT_S  # noqa: E402
from llft.rundir import STATE_FILE  # noqa: E402

GATEWAY_HOST = 5          # hosts 0..4 hold members, 5 the gateway and the clients
PORT = 7000               # the gateway's port (and the program's)
PLAIN_PORT = 7100         # the unreplicated server's
STARTUP_GRACE_S = 1.3     # a member suspects nobody in its first second (llft/cluster/detector.py)
DEFAULT_TIMEOUT_MS = FAULT_TIMEOUT_S * 1000  # the members' default fault timeout, as root


def git_rev() -> str:
    """The commit, with "+dirty" when tracked files differ from it."""
    r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty=+dirty", "--abbrev=7"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


class BenchCluster(Cluster):
    """The tests' Cluster, with process output in files (a bench runs long
    enough to fill a pipe) and state read straight from the run dir."""

    def _start(self, host: int, argv: list) -> subprocess.Popen:
        path = self.tmp / f"proc-{len(self.procs)}.log"
        with open(path, "w") as out:
            p = subprocess.Popen(in_ns(self.hosts[host][0], *argv), stdout=out, stderr=subprocess.STDOUT)
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


def failover_trial(hosts, tmp: Path, n: int, clients: int, fault_timeout: float | None) -> dict:
    try:
        return one_failover(hosts, tmp, n, clients, fault_timeout)
    except (AssertionError, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        print(f"failover trial ({n} replicas, {clients} clients) failed: {e!r}"[:2000], file=sys.stderr)
        return {"replicas": n, "clients": clients, "fault_timeout_ms": fault_timeout or DEFAULT_TIMEOUT_MS,
                "error": repr(e)[:500]}


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
        row = {"replicas": n, "clients": clients,
               "fault_timeout_ms": fault_timeout or DEFAULT_TIMEOUT_MS,
               "detection_ms": ms(marks["suspected"] - t0),
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
            "replies": sum(map(len, stamps)), "client_errors": got["errors"]}


def msg_client(hosts, *args, timeout: float) -> dict:
    try:
        r = subprocess.run(in_ns(hosts[GATEWAY_HOST][0], BIN / "msg_client", *args), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"msg_client {' '.join(map(str, args))}: no end after {timeout:.0f} s", file=sys.stderr)
        return {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode != 0:
        raise SystemExit(f"msg_client {args}: {r.returncode} {r.stderr}")
    return json.loads(r.stdout)


def serving(hosts, tmp: Path, sizes, clients, count, secs) -> list[dict]:
    rows = []

    def measure(mode, target, cluster=None):
        for size in sizes:
            rows.append({"bench": "latency", "mode": mode, "size": size,
                         **msg_client(hosts, "latency", target, size, count, timeout=30 + count * 0.02)})
            if "error" in rows[-1] and cluster is not None:
                cluster.diagnose()
        for k in clients:
            rows.append({"bench": "throughput", "mode": mode, "clients": k, "size": 1024,
                         **msg_client(hosts, "throughput", target, 1024, k, secs, timeout=secs + 30)})
            if "error" in rows[-1] and cluster is not None:
                cluster.diagnose()

    plain = subprocess.Popen(in_ns(hosts[0][0], BIN / "msg_server", PLAIN_PORT))
    try:
        target = f"{hosts[0][1]}:{PLAIN_PORT}"
        for _ in range(100):                       # until it listens
            if subprocess.run(in_ns(hosts[GATEWAY_HOST][0], BIN / "msg_client", "latency", target, 16, 1),
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        measure("plain", target)
    finally:
        plain.terminate()
        plain.wait()
    (tmp / "serving").mkdir()
    c = BenchCluster(hosts, tmp / "serving")
    try:
        c.form(3, "serving")
        c.start_gateway(GATEWAY_HOST, "serving", PORT)
        measure("llft", str(PORT), c)
    finally:
        c.stop()
    base = {(r["bench"], r.get("size"), r.get("clients")): r for r in rows if r["mode"] == "plain"}
    for r in rows:
        p = base[(r["bench"], r.get("size"), r.get("clients"))]
        r["replicas"] = 3 if r["mode"] == "llft" else 1
        if r["mode"] != "llft" or "error" in r or "error" in p:
            continue
        if r["bench"] == "latency":
            r["added_p50_us"] = round(r["p50_us"] - p["p50_us"], 1)
            r["added_p99_us"] = round(r["p99_us"] - p["p99_us"], 1)
            r["ratio_p50"] = round(r["p50_us"] / p["p50_us"], 2)
            r["ratio_p99"] = round(r["p99_us"] / p["p99_us"], 2)
        else:
            r["ratio_rps"] = round(r["rps"] / p["rps"], 3)
    return rows


def real_servers(hosts, tmp: Path, quick: bool) -> list[dict]:
    """redis-benchmark (SET, GET) and memcslap (set) with 16 clients from the
    clients' host: against the server unreplicated on host 0, then through
    the gateway to it replicated on hosts 0-2, in the same run."""
    rows = []
    client_ns = in_ns(hosts[GATEWAY_HOST][0])
    plain_host = hosts[0][1]
    for name, available, program, load in (
            ("redis", have_redis, redis,
             lambda host, port, n: {f"redis_{op.lower()}": rps for op, rps in
                                    redis_rps(port, 16, n, host, client_ns).items()}),
            ("memcached", have_memcached, memcached,
             lambda host, port, n: {"memcached_set": memcslap_rps(port, 16, max(1, n // 16), host, client_ns)})):
        if not available():
            continue
        n_plain, n_llft = (2000, 500) if quick else (20000, 3000)
        plain = subprocess.Popen(in_ns(hosts[0][0], *program(PLAIN_PORT, "0.0.0.0")), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            results = {"plain": load(plain_host, PLAIN_PORT, n_plain)}
        finally:
            plain.terminate()
            plain.wait()
        (tmp / name).mkdir()
        c = BenchCluster(hosts, tmp / name)
        try:
            c.form(3, name, program=program(PORT, "0.0.0.0"))
            c.start_gateway(GATEWAY_HOST, name, PORT)
            time.sleep(0.5)
            results["llft"] = load("127.0.0.1", PORT, n_llft)
        except (subprocess.CalledProcessError, AssertionError) as e:
            print(f"{name} across hosts failed: {e!r}"[:2000], file=sys.stderr)
            c.diagnose()
        finally:
            c.stop()
        for bench, rps in results["plain"].items():
            row = {"bench": bench, "mode": "plain", "clients": 16, "rps": round(rps, 1), "replicas": 1}
            rows.append(row)
            got = results.get("llft", {}).get(bench)
            rows.append({"bench": bench, "mode": "llft", "clients": 16, "replicas": 3,
                         **({"rps": round(got, 1), "ratio_rps": round(got / rps, 4)} if got else
                            {"error": "no result"})})
    return rows


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, len(xs) * 99 // 100)]


def summary(rows: list[dict], key: str):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return (statistics.median(xs), p99(xs)) if xs else (float("nan"), float("nan"))


def report(lines: list[dict], out: Path):
    print(f"\nlatency (one client), p50/p99 us{'':8} {'plain':>16} {'llft 3-way':>18} {'added p50':>10} {'ratio':>6}")
    plain = {(l["bench"], l.get("size"), l.get("clients")): l for l in lines if l.get("mode") == "plain"}
    for l in lines:
        if l.get("mode") != "llft":
            continue
        p = plain[(l["bench"], l.get("size"), l.get("clients"))]
        if "error" in l or "error" in p:
            print(f"  {l['bench']} {l.get('size', '')} {l.get('clients', '')}: plain {p.get('error', 'ok')}, "
                  f"llft {l.get('error', 'ok')}")
        elif l["bench"] == "latency":
            print(f"  {l['size']:>6} B {'':28} {p['p50_us']:>7.1f}/{p['p99_us']:>8.1f} "
                  f"{l['p50_us']:>8.1f}/{l['p99_us']:>9.1f} {l['added_p50_us']:>+10.1f} {l['ratio_p50']:>6}")
        elif l["bench"] == "throughput":
            print(f"  throughput {l['clients']:>2} clients, 1 KiB {'':13} {p['rps']:>12.0f}/s {l['rps']:>14.0f}/s "
                  f"{'':10} {l['ratio_rps']:>6}")
        else:
            print(f"  {l['bench']:<14} {l['clients']:>2} clients {'':14} {p['rps']:>12.0f}/s {l['rps']:>14.0f}/s "
                  f"{'':10} {l['ratio_rps']:>6}")
    fo = [l for l in lines if l["bench"] in ("view_change", "failover")]
    if fo:
        print("\nprimary change, median / p99 over trials (ms):")
        print(f"  {'bench':11} {'n':>2} {'cl':>3} {'timeout':>7} {'detect':>15} {'view change':>15} {'acks':>15} "
              f"{'crash->primary':>15} {'stall':>15} {'longest gap':>15}")
        groups = {}
        for l in fo:
            groups.setdefault((l["bench"], l["fault_timeout_ms"], l["replicas"], l["clients"]), []).append(l)
        for (bench, ft, n, cl), rs in sorted(groups.items()):
            cells = [summary(rs, k) for k in ("detection_ms", "view_change_ms", "acks_ms", "crash_to_primary_ms",
                                               "stall_ms", "max_gap_ms")]
            print(f"  {bench:11} {n:>2} {cl:>3} {ft:>7.0f} " +
                  " ".join(f"{a:>7.2f}/{b:>7.2f}" for a, b in cells) + f"   ({len(rs)} trials"
                  + (f", {sum('error' in r for r in rs)} failed" if any('error' in r for r in rs) else "") + ")")
    print(f"(written to {out})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, clients, trials and requests")
    ap.add_argument("--trials", type=int, help="failovers per configuration (default 5, quick 2)")
    ap.add_argument("--other-timeout", "--short-timeout", dest="other_timeout", type=float, default=50.0,
                    metavar="MS", help="another --fault-timeout also measured (default 50; the members' default is "
                    f"{DEFAULT_TIMEOUT_MS:g} as root)")
    ap.add_argument("--only", choices=["serving", "failover"], help="run one part")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cluster.jsonl")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/cluster.py needs root (network namespaces)")
    subprocess.run(["make", "-s", "-C", str(REPO / "examples")], check=True)
    q = args.quick
    trials = args.trials or (2 if q else 5)
    sizes = [16, 1024, 65536] if q else [16, 256, 1024, 4096, 16384, 65536]
    clients = [1, 16] if q else [1, 2, 4, 8, 16]
    count, secs = (300, 1.0) if q else (1000, 2.0)
    base = {"suite": "cluster", "git": git_rev(), "host": "netns", "cpus": os.cpu_count()}
    lines: list[dict] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="llft-bench-") as t:
        hosts = stack.enter_context(bridged_hosts(GATEWAY_HOST + 1))
        tmp = Path(t)
        if args.only != "failover":
            lines += [{**base, **r} for r in serving(hosts, tmp, sizes, clients, count, secs)]
            lines += [{**base, **r} for r in real_servers(hosts, tmp, q)]
        if args.only != "serving":
            ft = (tmp / "failover")
            ft.mkdir()
            for _ in range(trials):           # Fig. 16: no clients
                for n in [2, 3, 4, 5]:
                    lines.append({**base, "bench": "view_change", **failover_trial(hosts, ft, n, 0, None)})
            for _ in range(max(1, (trials + 1) // 2)):  # Fig. 17 and the stall
                for timeout in (None, args.other_timeout):
                    for n in [2, 3]:
                        for k in clients if timeout is None else [1, 16]:
                            lines.append({**base, "bench": "failover",
                                          **failover_trial(hosts, ft, n, k, timeout)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")
    report(lines, args.out)


if __name__ == "__main__":
    main()
