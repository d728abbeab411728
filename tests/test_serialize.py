"""llft-run --serialize: the threads of a replica take turns at the calls
llft sees, in the order the primary records, so that threads sharing memory
outside any lock (a counter under two different mutexes, a spin on an
atomic flag, memcached's LRU threads, Node's V8 threads) compute the same
at every replica, and fail over; a thread that spins without ever making a call does not
hang the replica, and llft-run says what was done about it."""
from __future__ import annotations

import shutil

import pytest

from conftest import PROGRAMS_DIR as PROGRAMS
from serving import Progress, ServingGroup, concurrently, kill_after
from test_failover import check_exactly_once, finish_and_check, run_clients

EXIT_DIVERGED = 86


def test_a_data_race_diverges_without_serialize_and_the_advice_says_so(examples, llft_run):
    for _ in range(5):
        run = llft_run([examples / "racy_counter", "20000"])
        if len({run.out(k) for k in range(3)}) > 1:
            assert run.status == EXIT_DIVERGED, run.stderr
            assert "--serialize" in run.stderr, "the message names the cure"
            return
    raise AssertionError("the race never showed in 5 runs")


def test_a_data_race_agrees_at_every_replica_under_serialize(examples, llft_run):
    """Lost updates and spins happen under --serialize too (a nap inside the
    critical section and the yields are where threads switch), but the
    same at every replica."""
    counts = set()
    for _ in range(3):
        run = llft_run([examples / "racy_counter", "20000"], extra=["--serialize"])
        assert run.status == 0, run.stderr
        outs = {run.out(k) for k in range(3)}
        assert len(outs) == 1, outs
        counts |= outs
    assert all(int(out.split()[3]) > 0 for out in counts), f"the second thread never spun: {counts}"


def test_a_thread_spinning_without_a_call_does_not_hang_the_replicas(examples, llft_run):
    """The second thread spins on the flag without any call, keeping its
    turn: the main thread takes it beside it, raises the flag, and the
    replicas end alike; llft-run says that threads ran side by side."""
    run = llft_run([examples / "racy_counter", "2000", "pure-spin"], extra=["--serialize"], timeout=60)
    assert run.status == 0, run.stderr
    assert len({run.out(k) for k in range(3)}) == 1
    assert "another was let run beside it" in run.stderr, run.stderr


def test_a_worker_pool_under_serialize_fails_over(examples, tmp_path):
    """pool_server's main thread and three workers taking turns, the
    primary killed twice under load: every answer once, survivors equal."""
    group = ServingGroup(tmp_path / "rd", [examples / "pool_server", 7000], extra=["--serialize", "--respawn"])
    results = run_clients(group, nclients=4, nlines=200, kills=2)
    check_exactly_once(results, 4, 200)
    finish_and_check(group)


@pytest.mark.skipif(not shutil.which("memcached"), reason="memcached not installed (scripts/setup.sh installs it)")
def test_memcached_with_its_default_threads_under_serialize_fails_over(tmp_path):
    """memcached as it starts by default (LRU maintainer and crawler
    threads deciding on reference counts workers change with atomics):
    CAS answers exactly once across a primary kill."""
    group = ServingGroup(tmp_path / "rd", [shutil.which("memcached"), "-A", "-p", "11211", "-U", "0",
                                           "-l", "127.0.0.1", "-u", "root"], extra=["--serialize"])
    progress = Progress()
    wins: dict[int, int] = {}

    def client(i):
        with group.connect() as s:
            f = s.makefile("rwb")
            wins[i] = 0
            while progress.replies < 600:
                f.write(b"gets counter\r\n")
                f.flush()
                line = f.readline()
                if line == b"END\r\n":           # not set yet: add it (one client wins)
                    f.write(b"add counter 0 0 1\r\n0\r\n")
                    f.flush()
                    f.readline()
                    continue
                _, _, _, nbytes, cas = line.split()
                value = int(f.read(int(nbytes) + 2))
                assert f.readline() == b"END\r\n"
                new = b"%d" % (value + 1)
                f.write(b"cas counter 0 0 %d %s\r\n%s\r\n" % (len(new), cas, new))
                f.flush()
                answer = f.readline()
                assert answer in (b"STORED\r\n", b"EXISTS\r\n"), answer
                if answer == b"STORED\r\n":
                    wins[i] += 1
                progress.tick()

    concurrently(client, 4, kill_after(group, progress, 250))
    with group.connect() as s:
        f = s.makefile("rwb")
        f.write(b"get counter\r\n")
        f.flush()
        _, _, _, nbytes = f.readline().split()
        final = int(f.read(int(nbytes) + 2))
        assert final == sum(wins.values()), "a CAS acknowledged as STORED was lost, or one applied twice"
        f.write(b"shutdown\r\n")
        f.flush()
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"], group.stderr
    assert state["replicas"][1]["outputs"] == state["replicas"][2]["outputs"]


@pytest.mark.skipif(not shutil.which("node"), reason="node not installed (scripts/setup.sh installs nodejs)")
def test_a_node_http_server_under_serialize_fails_over(tmp_path):
    """An ordinary Node HTTP server (a counter, Date.now(), Math.random(),
    an interval timer), started as `llft-run -- node server.js`: V8's
    threads hand work over outside any lock, so without --serialize the
    backups diverge, and llft-run chooses it; four keep-alive
    clients get every count exactly once across a primary kill, and the
    survivors sent the same bytes."""
    group = ServingGroup(tmp_path / "rd", [shutil.which("node"), PROGRAMS / "counter_server.js", 8080])
    assert counts_across_a_kill(group, 150, kill_at=250) == list(range(1, 601)), "a request lost or applied twice"
    quit_and_compare(group)


@pytest.mark.skipif(not shutil.which("npm"), reason="npm not installed (scripts/setup.sh installs it)")
def test_a_node_server_started_by_npm_start_under_serialize_fails_over(tmp_path):
    """`llft-run -- npm start`, as Node servers are deployed: npm (Node
    itself) runs the package's start script in a shell, which runs the
    server as its child, without exec.  Every process is replicated, its
    threads taking turns: llft-run chooses --serialize for npm, the
    server's port is served, and the counts are exact across a primary
    kill.  (npm is kept offline: nothing leaves this machine.)"""
    import json as json_
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json_.dumps({
        "name": "counter", "version": "1.0.0", "private": True,
        "scripts": {"start": f"node {PROGRAMS / 'counter_server.js'} 8080"}}))
    offline = {"npm_config_offline": "true", "npm_config_update_notifier": "false", "npm_config_fund": "false",
               "npm_config_audit": "false", "npm_config_cache": str(tmp_path / "npm-cache")}
    group = ServingGroup(tmp_path / "rd", [shutil.which("npm"), "--prefix", app, "start"], env=offline)
    assert counts_across_a_kill(group, 150, kill_at=250) == list(range(1, 601)), "a request lost or applied twice"
    quit_and_compare(group)


@pytest.mark.skipif(not shutil.which("javac"), reason="javac not installed (scripts/setup.sh installs a JDK)")
def test_a_jvm_http_server_under_serialize_fails_over(tmp_path):
    """A small JVM server (com.sun.net.httpserver, an AtomicLong counter):
    the JVM's own threads (JIT compilers, GC) share memory outside locks,
    so without --serialize the backups diverge, and llft-run chooses it;
    every count comes exactly once across a primary kill."""
    import subprocess
    subprocess.run([shutil.which("javac"), "-d", str(tmp_path), str(PROGRAMS / "CounterServer.java")], check=True)
    group = ServingGroup(tmp_path / "rd", [shutil.which("java"), "-cp", tmp_path, "CounterServer", 8080])
    assert counts_across_a_kill(group, 100, kill_at=150) == list(range(1, 401)), "a request lost or applied twice"
    quit_and_compare(group)


def counts_across_a_kill(group, per_client: int, kill_at: int) -> list[int]:
    """Four keep-alive clients GET /inc per_client times each, the primary
    killed at the kill_at-th answer; every count they got, sorted."""
    import http.client
    progress = Progress()
    counts: list[int] = []

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
        for _ in range(per_client):
            conn.request("GET", "/inc")
            counts.append(int(conn.getresponse().read().split()[0]))
            progress.tick()
        conn.close()

    concurrently(client, 4, kill_after(group, progress, kill_at))
    return sorted(counts)


def quit_and_compare(group):
    """GET /quit; the group ends with status 0, and the new primary and the
    backup left sent the same bytes."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
    conn.request("GET", "/quit")
    assert conn.getresponse().read() == b"bye\n"
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert "running it with --serialize" in group.stderr, "llft-run chose --serialize for it, and said so"
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"], group.stderr
    assert state["replicas"][1]["outputs"] == state["replicas"][2]["outputs"]


FORK_FROM_A_THREAD = """
import os, random, threading, time
def child():
    total = [0]
    def add():
        for i in range(3000):
            total[0] += 1   # (a read, then a write: threads that switch between them lose updates)
            if i % 97 == 0:
                time.sleep(0)
    threads = [threading.Thread(target=add) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("child", total[0], time.time(), random.random(), flush=True)
def fork_here():
    pid = os.fork()
    if pid == 0:
        child()
        os._exit(0)
    os.waitpid(pid, 0)
t = threading.Thread(target=fork_here)
t.start()
t.join()
print("parent", time.time(), flush=True)
"""


def test_a_process_forked_from_a_thread_takes_turns_of_its_own(real_python, llft_run):
    """--serialize with --fork replicate: a thread other than the main one
    forks, holding the turn; in the child that thread is the only one, and
    it holds the turn there (not its parent's thread of the same number),
    so that the child's threads go on taking turns, alike at every
    replica."""
    run = llft_run([real_python, "-c", FORK_FROM_A_THREAD], extra=["--serialize"], timeout=60)
    assert run.status == 0, run.stderr
    outs = {run.out(k) for k in range(3)}
    assert len(outs) == 1 and "child" in next(iter(outs)), outs


@pytest.mark.parametrize("mode", ["futex", "compute"])
def test_a_thread_that_waits_on_a_raw_futex_or_computes_is_not_run_beside(examples, llft_run, mode):
    """turn_holder: a worker parked in syscall(SYS_futex, FUTEX_WAIT) as the
    JVM parks its threads at a safepoint (a switch point: it gives the turn
    up), or computing 40 ms between two calls as a JVM thread loading
    classes does (it keeps the turn until its next call): no thread is let
    run beside another, and the replicas count alike."""
    run = llft_run([examples / "turn_holder", mode], extra=["--serialize"], timeout=60)
    assert run.status == 0, run.stderr
    assert "let run beside it" not in run.stderr, run.stderr
    assert len({run.out(k) for k in range(3)}) == 1
