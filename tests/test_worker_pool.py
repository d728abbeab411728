"""A common server shape the other examples lack: an epoll front thread
hands request lines to a pool of workers through a mutex and a condition
variable, the workers write replies under a per-fd mutex, and the front
thread closes each connection at EOF (examples/pool_server.c).

A connection's close races with its last reply's write on another thread:
at the primary the write comes first (the client read the reply before it
closed), and a backup must close in that order too, or its worker writes
on a closed (or reused) fd number and the backup leaves the group.  These
tests keep the backups in step through thousands of short connections and
kill the primary while the group is idle after its connections closed, and
under load, several times in a row."""
from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from conftest import tool
import serving
from serving import Progress, ServingGroup, kill_after, line_client, line_clients
from test_failover import finish_and_check


def start(examples, tmp_path, replicas=3) -> ServingGroup:
    return ServingGroup(tmp_path / "rd", [examples / "pool_server", 7000], replicas=replicas)


def members(group) -> list[dict]:
    p = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir), "--json"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["members"]


def assert_all_following(group, replicas):
    live = [m for m in members(group) if m["role"] in ("primary", "backup")]
    assert len(live) == replicas, f"a replica left the group: {members(group)}"
    for m in live:
        assert m["state"] == "running" and not m["divergence"], m


def one_request(group, i) -> int:
    with group.connect() as s:
        replies, _ = line_client(s, [f"short {i}"])
    return int(replies[0].split()[0])


def finish(group, replicas_left) -> dict:
    """DIGEST, SHUTDOWN; every survivor exits 0 having sent the same bytes,
    and replicas_left survive."""
    state = finish_and_check(group)
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    assert len(survivors) == replicas_left, state["replicas"]
    return state


def test_thousands_of_short_connections_keep_the_backups_in_step(examples, tmp_path):
    group = start(examples, tmp_path)
    n = 2000
    counts = [one_request(group, i) for i in range(n)]
    assert counts == list(range(1, n + 1))
    assert_all_following(group, 3)
    finish(group, 3)


def check_counts(results: dict, before: int, nclients: int, nlines: int):
    counts = sorted(int(r.split()[0]) for got in results.values() for r in got)
    assert counts == list(range(before + 1, before + nclients * nlines + 1)), "a request was lost or applied twice"
    for i, got in results.items():
        assert [r.split(" ", 1)[1] for r in got] == [f"c{i}-{j}" for j in range(nlines)]


def wait_primary_changed(group, old_pid):
    end = time.monotonic() + 30
    while time.monotonic() < end:
        prim = [m for m in members(group) if m["role"] == "primary"]
        if prim and prim[0]["pid"] != old_pid:
            return
        time.sleep(0.02)
    raise AssertionError("no backup took over")


def test_primary_killed_while_idle_after_connections_closed(examples, tmp_path):
    """Load, every connection closed, then the primary killed with nothing
    going on: three times in a row, down to one replica of four."""
    group = start(examples, tmp_path, replicas=4)
    served = 0
    for trial in range(3):
        results = line_clients(group, 4, lambda i: [f"c{i}-{j}" for j in range(300)])
        check_counts(results, served, 4, 300)
        served += 1200
        assert one_request(group, trial) == served + 1   # a short connection, closed, last
        served += 1
        old = next(m["pid"] for m in members(group) if m["role"] == "primary")
        serving.kill_primary(group.run_dir)
        wait_primary_changed(group, old)
    assert one_request(group, 99) == served + 1
    finish(group, 1)


@pytest.mark.parametrize("trial", range(3))
def test_primary_killed_under_load_after_the_kth_reply(examples, tmp_path, trial):
    """Four clients, and the primary killed at the 1500th reply (and once
    more at the 3500th): every request applied once, the survivors equal."""
    group = start(examples, tmp_path)
    progress = Progress()
    results = line_clients(group, 4, lambda i: [f"c{i}-{j}" for j in range(1000)],
                           kill_after(group, progress, 1500, 3500), progress=progress)
    check_counts(results, 0, 4, 1000)
    finish(group, 1)


def test_short_connections_across_a_failover(examples, tmp_path):
    """Connections that each carry one request, one after another, while the
    primary is killed after the 300th: none is refused, none counted twice."""
    group = start(examples, tmp_path)
    counts = []
    for i in range(600):
        if i == 300:
            serving.kill_primary(group.run_dir)
        counts.append(one_request(group, i))
    assert counts == list(range(1, 601))
    finish(group, 2)


def test_connections_done_everywhere_are_folded_and_freed(examples, tmp_path):
    """What the controller keeps per connection goes once the connection is
    done at every replica: the state lists only a "closed" summary, equal
    at every replica, however many connections there were."""
    group = start(examples, tmp_path)
    for i in range(300):
        one_request(group, i)
    state = finish(group, 3)
    for r in state["replicas"]:
        outputs = r["outputs"]
        assert list(outputs) == ["closed"], f"replica {r['index']} still lists {len(outputs) - 1} connections"
        assert outputs["closed"]["connections"] == 302   # with the final one and the port probe
    assert state["gateway"]["held"] == 0, "the controller still holds connections done everywhere"


def test_a_connection_closed_by_the_client_without_a_request(examples, tmp_path):
    """Connections opened and closed with nothing sent, among served ones."""
    group = start(examples, tmp_path)
    for i in range(200):
        socket.create_connection(("127.0.0.1", group.port), timeout=10).close()
        assert one_request(group, i) == i + 1
    assert_all_following(group, 3)
    finish(group, 3)
