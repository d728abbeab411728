"""Replicated servers on one host, each through llft-run and against the
same server unreplicated, in the same run:

  latency     LLFT Fig. 12: one client's round trips vs message size
  throughput  LLFT Fig. 13: closed-loop clients, 1 KiB, with the ceiling
  replicas    LLFT Fig. 14: one client's round trips, 1 KiB, vs replicas
  nondet      LLFT Fig. 15: one client's round trips, 1 KiB, vs the
              gettimeofday calls the server makes per request
  redis       redis-benchmark SET and GET, 16 clients
  memcached   memcslap set (memcached -t 4), 16 clients

Throughput also has a ceiling backend: as many unreplicated servers as
there are replicas, each client sending every request to all of them and
waiting for every reply (`msg_client fanout`).  That is the work a
replication layer costing nothing would still leave this machine (every
replica executes every request), so its ratio to the plain server bounds
what any semi-active replication of that many replicas can reach here.

The servers compared run side by side and are measured in turn, round
after round (after one warm-up turn each that is not recorded): this
shared machine's speed drifts within minutes, and interleaving puts the
drift on every backend alike."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from bench.records import REPO
from bench.servers import have_memcached, have_redis, memcached, memcslap_rps, redis, redis_rps
from llft.ordering.backend import ORDERS

BIN = REPO / "examples" / "bin"
LLFT_RUN = str(Path(sys.executable).with_name("llft-run"))
NET = "loopback"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen):
    for _ in range(500):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


class Server:
    """The server under test, plain or under llft-run, on a free port."""

    def __init__(self, argv_for_port, replicas: int | None, tmp: Path, extra=()):
        self.port = free_port()
        if replicas is None:
            cmd = argv_for_port(self.port)
        else:
            cmd = [LLFT_RUN, "--replicas", str(replicas), "--run-dir", str(tmp / f"rd-{self.port}"),
                   "--port", str(self.port), *extra, "--", *argv_for_port(7000)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_port(self.port, self.proc)

    def stop(self):
        end(self.proc, 20)


def end(proc: subprocess.Popen, timeout: float):
    """SIGTERM, then SIGKILL if proc has not exited within timeout seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def client(*args, prefix=(), timeout: float | None = None) -> dict:
    """examples/bin/msg_client (in another namespace with `prefix`): its JSON line."""
    out = subprocess.run([*prefix, BIN / "msg_client", *map(str, args)], capture_output=True, text=True,
                         check=True, timeout=timeout)
    return json.loads(out.stdout)


def msg_server(port, nondet: int = 0):
    return [str(BIN / "msg_server"), str(port), *([str(nondet)] if nondet else [])]


def interleaved(ctx, rounds: int, measures: dict):
    """Runs each backend's measurement in turn, one unrecorded warm-up turn
    and then `rounds` recorded ones (plain, llft, ..., plain, llft, ...);
    each measure(round) records what it measured, round None being the warm-up."""
    for measure in measures.values():
        measure(None)
    for r in range(rounds):
        for measure in measures.values():
            measure(r)
            ctx.step()


def attempt(ctx, scenario: str, kind: str, fields: dict, measure):
    """measure(), or None with a failed record (a client that timed out or
    failed is an outcome of the run, not the end of it)."""
    try:
        return measure()
    except subprocess.TimeoutExpired as e:
        ctx.rec.failed(scenario, kind, f"timed out after {e.timeout:.0f} s", outcome="timeout", **fields)
    except subprocess.CalledProcessError as e:
        ctx.rec.failed(scenario, kind, f"exit {e.returncode}: {(e.stderr or '')[-400:]}", **fields)
    return None


def latency_measure(ctx, scenario: str, port, size: int, count: int, prefix=(), **fields):
    """A measure for interleaved(): one client's `count` round trips, one record each."""
    def measure(rnd):
        fields.update(size=size, clients=1, round=rnd)
        got = attempt(ctx, scenario, "request", fields, lambda: client(
            "latency", port, size, count if rnd is not None else max(20, count // 10), "samples", prefix=prefix,
            timeout=60 + count * 0.05))
        if got and rnd is not None:
            ctx.rec.requests(scenario, got["start_s"], got["samples"], **fields)
    return measure


def window_measure(ctx, scenario: str, mode: str, target, size: int, clients: int, secs: float, prefix=(),
                   **fields):
    """A measure for interleaved(): closed-loop clients for `secs`, one window record."""
    def measure(rnd):
        started = time.time()
        fields.update(size=size, clients=clients, round=rnd)
        got = attempt(ctx, scenario, "window", fields, lambda: client(
            mode, target, size, clients, secs if rnd is not None else min(secs, 0.3), prefix=prefix,
            timeout=secs + 60))
        if got and rnd is not None:
            ctx.rec.window(scenario, got["requests"], got["requests"] / got["rps"] if got["rps"] else secs,
                           ts=started, **fields)
    return measure


def servers(ctx, stack: ExitStack):
    """start(argv_for_port, replicas, extra llft-run options): a Server
    stopped when `stack` closes."""
    def start(argv_for_port, replicas, extra=()):
        srv = Server(argv_for_port, replicas, ctx.tmp, extra)
        stack.callback(srv.stop)
        return srv
    return start


def latency(ctx, sizes, replicas: int, rounds: int, count: int):
    """LLFT Fig. 12."""
    ctx.plan(len(sizes) * rounds * 2)
    with ExitStack() as stack:
        start = servers(ctx, stack)
        plain, llft = start(msg_server, None), start(msg_server, replicas)
        for size in sizes:
            interleaved(ctx, rounds, {
                "plain": latency_measure(ctx, "serving/latency", plain.port, size, count, backend="plain",
                                         replicas=1, net=NET),
                "llft": latency_measure(ctx, "serving/latency", llft.port, size, count, backend="llft",
                                        replicas=replicas, net=NET)})


def groups_side_by_side(ctx, scenario: str, groups: dict, rounds: int, count: int, size: int):
    """The unreplicated server and each group of `groups` ({name: (backend
    field, replicas, llft-run options)}) run side by side, measured in turn."""
    ctx.plan(rounds * (len(groups) + 1))
    with ExitStack() as stack:
        start = servers(ctx, stack)
        measures = {"plain": latency_measure(ctx, scenario, start(msg_server, None).port, size, count,
                                             backend="plain", replicas=1, net=NET)}
        for name, (backend, n, extra) in groups.items():
            measures[name] = latency_measure(ctx, scenario, start(msg_server, n, extra).port, size, count,
                                             backend=backend, replicas=n, net=NET)
        interleaved(ctx, rounds, measures)


def orders(ctx, replicas: int, rounds: int, count: int, size: int = 1024):
    """Issue 19: the same request/reply workload over each ordering backend
    (llft-run --order), side by side with the unreplicated server."""
    groups_side_by_side(ctx, "serving/orders", {o: (o, replicas, ["--order", o]) for o in ORDERS},
                        rounds, count, size)


def fork_modes(ctx, replicas: int, rounds: int, count: int, size: int = 1024):
    """Issue 16: what replicating forked processes (llft-run's default)
    costs a server that forks none: its backups are handed each connection
    once the primary's accept of it is forwarded, and every forwarded chunk
    is scanned for accepts.  Side by side with --fork unrecorded and the
    unreplicated server."""
    groups_side_by_side(ctx, "serving/fork_modes", {f"fork-{m}": (f"fork-{m}", replicas, ["--fork", m])
                                                    for m in ("unrecorded", "replicate")}, rounds, count, size)


def throughput(ctx, clients, replicas: int, rounds: int, secs: float, size: int = 1024):
    """LLFT Fig. 13, with the ceiling (module doc)."""
    ctx.plan(len(clients) * rounds * 3)
    with ExitStack() as stack:
        start = servers(ctx, stack)
        plain, llft = start(msg_server, None), start(msg_server, replicas)
        fan = ",".join(str(start(msg_server, None).port) for _ in range(replicas))
        for c in clients:
            interleaved(ctx, rounds, {
                "plain": window_measure(ctx, "serving/throughput", "throughput", plain.port, size, c, secs,
                                        backend="plain", replicas=1, net=NET),
                "llft": window_measure(ctx, "serving/throughput", "throughput", llft.port, size, c, secs,
                                       backend="llft", replicas=replicas, net=NET),
                "ceiling": window_measure(ctx, "serving/throughput", "fanout", fan, size, c, secs,
                                          backend="ceiling", replicas=replicas, net=NET)})


def replicas(ctx, counts, rounds: int, count: int, size: int = 1024):
    """LLFT Fig. 14: every group runs side by side, measured in turn."""
    groups_side_by_side(ctx, "serving/replicas", {f"llft-{n}": ("llft", n, ()) for n in counts},
                        rounds, count, size)


def nondet(ctx, ops, replicas: int, rounds: int, count: int, size: int = 1024):
    """LLFT Fig. 15: k gettimeofday calls per request, each recorded at the
    primary and replayed at the backups."""
    ctx.plan(len(ops) * rounds * 2)
    for k in ops:
        with ExitStack() as stack:
            start = servers(ctx, stack)
            argv = lambda port, k=k: msg_server(port, k)  # noqa: E731
            interleaved(ctx, rounds, {
                "plain": latency_measure(ctx, "serving/nondet", start(argv, None).port, size, count,
                                         backend="plain", replicas=1, nondet=k, net=NET),
                "llft": latency_measure(ctx, "serving/nondet", start(argv, replicas).port, size, count,
                                        backend="llft", replicas=replicas, nondet=k, net=NET)})


def real_server(ctx, backends: dict, load, rounds: int, clients: int, net: str = NET):
    """A Debian server plain against llft, backends {backend: (target, replicas)};
    load(target) -> {scenario: (requests, per second)}."""
    ctx.plan(rounds * len(backends))

    def measure(backend):
        target, n = backends[backend]

        def run(rnd):
            started = time.time()
            for scenario, (requests, rps) in load(target).items():
                if rnd is not None:
                    ctx.rec.window(scenario, requests, requests / rps, ts=started, backend=backend, replicas=n,
                                   clients=clients, round=rnd, net=net)
        return run
    interleaved(ctx, rounds, {b: measure(b) for b in backends})


def plain_and_llft(ctx, program, replicas: int, load, rounds: int, clients: int):
    """Unreplicated, replicated, and replicated with --serialize."""
    with ExitStack() as stack:
        start = servers(ctx, stack)
        real_server(ctx, {"plain": (start(program, None).port, 1),
                          "llft": (start(program, replicas).port, replicas),
                          "llft-serialize": (start(program, replicas, ["--serialize"]).port, replicas)},
                    load, rounds, clients)


def redis_sets(ctx, replicas: int, rounds: int, requests: int, clients: int = 16):
    """redis-benchmark SET and GET, plain against llft."""
    if not have_redis():
        ctx.skip("redis-server or redis-benchmark is not installed")
        return
    plain_and_llft(ctx, redis, replicas, lambda port: {f"redis/{op.lower()}": (requests, rps)
                                                       for op, rps in redis_rps(port, clients, requests).items()},
                   rounds, clients)


def memcached_sets(ctx, replicas: int, rounds: int, requests: int, clients: int = 16):
    """memcslap set, `requests` per client, plain against llft."""
    if not have_memcached():
        ctx.skip("memcached or memcslap is not installed")
        return
    plain_and_llft(ctx, memcached, replicas, lambda port: {
        "memcached/set": (clients * requests, memcslap_rps(port, clients, requests))}, rounds, clients)
