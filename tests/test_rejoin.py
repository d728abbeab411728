"""Re-adding replicas (llft-run --respawn): the group survives failures one
after another.  A failed replica (killed, or frozen and fenced) is replaced
by a new backup that replays the group's whole history, then follows the
live stream, and can itself take over later.

Under a continuous multi-client workload the primary is killed 20 times in
a row.  Checked throughout: no client connection drops; every request whose
reply a client received was applied exactly once (INCR of a shared counter
and of a counter per client: the replies are exactly 1..n, in order per
client); the group clock (TIME) never goes back for any client; after each
failover every live replica, the replacement included, computes the same
state digest as the primary; at the end, every surviving replica sent
byte for byte what the primary sent."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from conftest import tool
from serving import ORDERS, ServingGroup, order_args
from test_failover import kill_primary
from test_serving import read_resp, resp

KILLS = 20


class KvClient:
    """examples/kv_server's line protocol."""
    argv_name = "kv_server"

    def __init__(self, sock: socket.socket):
        self.f = sock.makefile("rwb")

    def _ask(self, line: str) -> str:
        self.f.write(line.encode() + b"\n")
        self.f.flush()
        reply = self.f.readline()
        if not reply:
            raise ConnectionError("connection closed")
        return reply.decode().rstrip("\n")

    def incr(self, key: str) -> int:
        reply = self._ask(f"INCR {key}")
        assert reply.startswith("VALUE "), reply
        return int(reply.split()[1])

    def get(self, key: str) -> int:
        return int(self._ask(f"GET {key}").split()[1])

    def clock(self) -> float:
        return float(self._ask("TIME").split()[1])

    def digest(self) -> str:
        return self._ask("DIGEST")

    def shutdown(self):
        assert self._ask("SHUTDOWN") == "BYE"


class RedisClient(KvClient):
    def _ask(self, *args: str):
        self.f.write(resp(*args))
        self.f.flush()
        return read_resp(self.f)

    def incr(self, key: str) -> int:
        return int(self._ask("INCR", key))

    def get(self, key: str) -> int:
        return int(self._ask("GET", key))

    def clock(self) -> float:
        sec, usec = self._ask("TIME")
        return int(sec) + int(usec) / 1e6

    def digest(self) -> str:
        return self._ask("DEBUG", "DIGEST")

    def shutdown(self):
        self.f.write(resp("SHUTDOWN", "NOSAVE"))
        self.f.flush()
        assert self.f.readline() == b"", "redis closes the connection on SHUTDOWN"


class Workload:
    """Clients that each INCR a shared counter and their own, and read the
    group clock, until stopped; every reply is kept for the checks."""

    def __init__(self, group: ServingGroup, client_cls, nclients: int):
        self.client_cls = client_cls
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.shared: list[list[int]] = [[] for _ in range(nclients)]
        self.own: list[list[int]] = [[] for _ in range(nclients)]
        self.stamps: list[list[float]] = [[] for _ in range(nclients)]
        self.socks = [group.connect() for _ in range(nclients)]   # connections 1..nclients
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(nclients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int):
        c = self.client_cls(self.socks[i])
        try:
            while not self.stop.is_set():
                self.shared[i].append(c.incr("shared"))
                self.own[i].append(c.incr(f"own{i}"))
                self.stamps[i].append(c.clock())
                time.sleep(0.002)
        except (OSError, ValueError, AssertionError) as e:
            self.errors.append(f"client {i}: {e!r} after {len(self.own[i])} requests")

    def requests(self) -> int:
        return sum(len(x) for x in self.own)

    def progresses(self, what: str, replies: int = 1):
        """Waits until the clients get `replies` more replies than they had."""
        before, end = self.requests(), time.monotonic() + 10
        while self.requests() < before + replies and time.monotonic() < end and not self.errors:
            time.sleep(0.005)
        assert not self.errors, self.errors
        assert self.requests() >= before + replies, f"{what}: the clients make no progress"

    def finish_and_shut_down(self, group) -> dict:
        """finish(), then the group's counters must be what the clients saw;
        then the program is shut down; returns llft-run's final state."""
        total = self.finish()
        with group.connect() as s:
            c = self.client_cls(s)
            assert c.get("shared") == total, "the group's counter is the number of INCRs the clients saw"
            for i, own in enumerate(self.own):
                assert c.get(f"own{i}") == len(own)
            c.shutdown()
        final = group.finish()
        assert group.proc.returncode == 0, group.stderr
        return final

    def finish(self) -> int:
        """Stops the clients; checks exactly-once and the clock; returns the
        number of INCRs of the shared counter."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors
        values = sorted(v for vs in self.shared for v in vs)
        assert values == list(range(1, len(values) + 1)), "an INCR was lost or applied twice"
        for i, own in enumerate(self.own):
            assert own == list(range(1, len(own) + 1)), f"client {i}: its own counter skipped or repeated"
            assert self.stamps[i] == sorted(self.stamps[i]), f"client {i}: the group clock went back"
        for s in self.socks:
            s.close()
        return len(values)


def state(group) -> dict:
    for _ in range(50):
        try:
            return json.loads((group.run_dir / "llft-run.json").read_text())
        except (OSError, ValueError):
            time.sleep(0.01)   # being replaced
    raise AssertionError("no state file")


def live(st: dict) -> list[dict]:
    return [r for r in st["replicas"] if r["role"] in ("primary", "backup")]


def wait_for(pred, what: str, group, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = state(group)
        if pred(st):
            return st
        time.sleep(0.01)
    raise AssertionError(f"{what} within {timeout}s; state: "
                         f"{[(r['index'], r['role'], r['catch_up']) for r in st['replicas']]}")


def full_and_caught_up(n: int):
    def pred(st):
        members = live(st)
        return len(members) == n and all(r["catch_up"] is None or r["catch_up"]["done"] for r in members)
    return pred


def check_digests(group, client_cls, st: dict):
    """Asks the primary for its state digest on a new connection; every
    live replica must have computed the same reply at the same point."""
    with group.connect() as s:
        digest = client_cls(s).digest()
    assert digest
    primary = next(r["index"] for r in live(st) if r["role"] == "primary")
    logged = (group.run_dir / f"replica-{primary}" / "output").glob("conn-*")
    conn_id = max(int(p.name.split("-")[1]) for p in logged)   # the newest connection: this one
    members = [r["index"] for r in live(st)]
    end = time.monotonic() + 20
    for k in members:
        out = group.run_dir / f"replica-{k}" / "output" / f"conn-{conn_id}"
        while True:
            got = out.read_bytes() if out.exists() else b""
            if str(digest).encode() in got:
                break
            if time.monotonic() > end:
                raise AssertionError(f"replica {k} did not compute digest {digest!r} on connection {conn_id} "
                                     f"(got ...{got[-200:]!r})")
            time.sleep(0.01)


def survive_kills(group, client_cls, replicas: int, nclients: int, kills: int = KILLS):
    wl = Workload(group, client_cls, nclients)
    try:
        wait_for(lambda st: len(live(st)) == replicas, "the group starts", group)
        for n in range(kills):
            wl.progresses(f"before failover {n + 1}", replies=40)   # requests flow between failures
            old = next(r["index"] for r in state(group)["replicas"] if r["role"] == "primary")
            kill_primary(group)
            st = wait_for(lambda st: next(r for r in st["replicas"] if r["index"] == old)["role"] == "failed",
                          f"failover {n + 1}: a backup takes over from replica {old}", group)
            st = wait_for(full_and_caught_up(replicas), f"failover {n + 1}: a replacement catches up", group)
            newest = max(r["index"] for r in st["replicas"])
            assert newest == replicas + n, "a new index for each replacement, never reused"
            assert [r["index"] for r in live(st)] == sorted(r["index"] for r in live(st))
            wl.progresses(f"failover {n + 1}")
            check_digests(group, client_cls, st)
        final = wl.finish_and_shut_down(group)
    finally:
        wl.stop.set()
    roles = [r["role"] for r in final["replicas"]]
    assert roles.count("failed") == kills and roles.count("primary") == 1 and len(roles) == replicas + kills
    survivors = live(final)
    assert all(r["status"] == 0 for r in survivors), [(r["index"], r["status"]) for r in survivors]
    for r in survivors[1:]:
        assert r["outputs"] == survivors[0]["outputs"], f"replica {r['index']} sent something else"
    assert final["gateway"]["failovers"] == kills
    return final


@pytest.mark.parametrize("order", ORDERS)
def test_kv_server_survives_20_primary_kills(order, examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], replicas=3,
                         extra=["--respawn", "--log-output", *order_args(order)])
    survive_kills(group, KvClient, replicas=3, nclients=4)
    log = (group.run_dir / "llft.log").read_text()
    assert "replica 22 started to replace replica 19; caught up after" in log


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server not installed (scripts/setup.sh installs it)")
def test_redis_survives_20_primary_kills(tmp_path):
    group = ServingGroup(tmp_path / "rd", [shutil.which("redis-server"), "--port", "6379", "--save", "",
                                           "--appendonly", "no", "--enable-debug-command", "yes"],
                         replicas=3, extra=["--respawn", "--log-output"])
    survive_kills(group, RedisClient, replicas=3, nclients=3)


def test_frozen_primary_never_serves_again_and_is_replaced(examples, tmp_path):
    """SIGSTOP the primary past the fault timeout: a backup takes over, the
    frozen one is fenced, and a new replica rejoins in its place.  SIGCONT
    then finds nothing to wake: the old primary never serves in the old view."""
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], replicas=3,
                         extra=["--respawn", "--log-output"])
    wl = Workload(group, KvClient, 3)
    try:
        wl.progresses("before the freeze", replies=60)
        p = subprocess.run([tool("llft-kill"), "--run-dir", str(group.run_dir), "--primary", "--signal", "STOP"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and "SIGSTOP" in p.stdout, p.stderr
        st = wait_for(lambda st: st["replicas"][0]["role"] == "failed", "the frozen primary is replaced", group)
        old = st["replicas"][0]
        st = wait_for(full_and_caught_up(3), "a replacement catches up", group)
        assert st["replicas"][3]["replaces"] == 0 and st["replicas"][1]["role"] == "primary"
        shown = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir)], capture_output=True,
                               text=True, timeout=30).stdout
        assert "replaces replica 0; caught up after" in shown and "(--respawn)" in shown, shown
        p = subprocess.run([tool("llft-kill"), "--run-dir", str(group.run_dir), "--replica", "0", "--signal", "CONT"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and "not running" in p.stderr, "the frozen primary was fenced (SIGKILL)"
        wl.progresses("after SIGCONT")
        check_digests(group, KvClient, st)
        final = wl.finish_and_shut_down(group)
    finally:
        wl.stop.set()
    # The old primary sent no more than the new one did on any connection: it
    # sent nothing after it was frozen (its relay saw its sockets only close).
    assert final["replicas"][0]["status"] == 137 and old["pid"] == final["replicas"][0]["pid"]
    new_primary = final["replicas"][1]["outputs"]
    for conn, out in final["replicas"][0]["outputs"].items():
        if conn != "closed" and conn in new_primary:   # (connections done are summed up as "closed")
            assert out["bytes"] <= new_primary[conn]["bytes"], f"the fenced primary sent more on connection {conn}"
    assert [r["role"] for r in final["replicas"]] == ["failed", "primary", "backup", "backup"]
    log = (group.run_dir / "llft.log").read_text()
    assert "replica 0 (primary) has been frozen for" in log and "replica 3 started to replace replica 0; caught up" in log


def test_dlsym_rtld_next_still_resolves_relative_to_the_caller(tmp_path):
    """The shim wraps dlsym (dlsym(RTLD_NEXT, "pthread_create") gets a function
    of the shim that refuses to start threads behind its back); any other
    RTLD_NEXT lookup must still start after the caller's object, not after
    the shim's."""
    src = tmp_path / "next.c"
    src.write_text(r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
int main(void) {
    void *next = dlsym(RTLD_NEXT, "clock_gettime"), *dflt = dlsym(RTLD_DEFAULT, "clock_gettime");
    void *create = dlsym(RTLD_NEXT, "pthread_create");
    Dl_info a, b;
    dladdr(next, &a);
    dladdr(create, &b);
    printf("%s %s %d\n", a.dli_fname, b.dli_fname, next == dflt);
    return 0;
}
""")
    exe = tmp_path / "next"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True)
    from llft import PRELOAD_LIBRARY
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                         env={**os.environ, "LD_PRELOAD": str(PRELOAD_LIBRARY)}).stdout.split()
    assert out[0].endswith("libllft.so"), "RTLD_NEXT from the program finds the shim's clock_gettime first"
    assert out[1].endswith("libllft.so"), "pthread_create found by dlsym is the shim's (which refuses)"
    assert out[2] == "1"


def test_replacements_joining_at_once_after_short_connections(examples, tmp_path):
    """Short connections (each done, freed, its input kept for joiners),
    then a cascade: two replacements catch up at once, the second getting
    the connections the first was given back as well; then the newest
    backup is killed.  The group serves on at strength.  (The second
    joiner was once given those connections twice, and the controller
    crashed on a freed one.)"""
    from llft.nemesis.faults import Group
    group = ServingGroup(tmp_path / "rd", [examples / "epoll_server", 7000], extra=["--respawn"])
    g = Group(group.run_dir)

    def one(i):
        with group.connect() as s:
            s.sendall(f"short {i}\n".encode())
            assert s.makefile("rb").readline() == f"{i + 1} short {i}\n".encode()

    for i in range(100):
        one(i)
    g.wait_recovered(3, set())
    first = g.primary()
    os.kill(first.pid, 9)
    second = g.wait_new_primary(first.pid)
    os.kill(second.pid, 9)
    g.wait_recovered(3, {first.index, second.index})
    newest = max(g.backups(), key=lambda r: r.index)
    os.kill(newest.pid, 9)
    g.wait_recovered(3, {newest.index})
    for i in range(100, 150):
        one(i)
    with group.connect() as s:
        s.sendall(b"SHUTDOWN\n")
        assert s.makefile("rb").readline() == b"BYE\n"
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    live = [r for r in state["replicas"] if r["role"] != "failed"]
    assert len(live) == 3 and all(r["outputs"] == live[0]["outputs"] for r in live)
