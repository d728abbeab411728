"""llft-nemesis: its checks catch what they must (a lost, a repeated or a
reordered answer, a clock going back, a lost connection), and a short
seeded soak over every server shape survives every fault with nothing
lost (the long one is in bench/: README, "The nemesis")."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, tool
from llft.nemesis.history import ClientHistory, check


def h(client, values, clock=(), errors=()):
    return ClientHistory(client, list(values), list(clock), list(errors))


def test_per_client_counters_exactly_once_and_in_order():
    assert check([h(0, [1, 2, 3]), h(1, [1, 2])], global_count=False).ok
    lost = check([h(0, [1, 2, 4])], global_count=False)
    assert not lost.ok and lost.lost == 1
    dup = check([h(0, [1, 2, 2, 3])], global_count=False)
    assert not dup.ok and dup.duplicated == 1


def test_one_global_counter_each_answer_once():
    assert check([h(0, [1, 3, 4]), h(1, [2, 5])], global_count=True).ok
    assert check([h(0, [1, 3]), h(1, [2, 5])], global_count=True).lost == 1
    assert check([h(0, [1, 2]), h(1, [2, 3])], global_count=True).duplicated == 1
    assert not check([h(0, [1, 3, 2])], global_count=True).ok, "out of order"


def test_the_clock_never_goes_back_and_no_connection_is_lost():
    assert check([h(0, [1], clock=[1.0, 1.0, 2.5])], global_count=False).ok
    assert check([h(0, [1], clock=[1.0, 0.9])], global_count=False).clock_back == 1
    assert check([h(0, [1], errors=["ConnectionError: closed"])], global_count=False).disconnected == 1


def test_a_short_seeded_soak_over_every_shape(tmp_path):
    work = tmp_path / "nemesis"
    p = subprocess.run([tool("llft-nemesis"), "--faults", "32", "--seed", "20261125", "--work-dir", str(work),
                        "--examples", str(REPO / "examples" / "bin")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    summaries = [json.loads(line) for line in (work / "nemesis.jsonl").read_text().splitlines()
                 if '"summary"' in line]
    assert {s["shape"] for s in summaries} == {"echo", "poll", "epoll", "pool", "kv", "redis", "memcached", "http"}
    assert sum(s["injected"] for s in summaries) == 32 and sum(s["survived"] for s in summaries) == 32
    assert all(s["lost"] == 0 and s["duplicated"] == 0 and not s["group_lost"] for s in summaries)
    assert sum(s["acknowledged"] for s in summaries) > 32 * 150
    faults = [json.loads(line) for line in (work / "nemesis.jsonl").read_text().splitlines()
              if '"kind"' in line]
    assert len({f["kind"] for f in faults}) >= 5, "the seed picks several kinds of fault"


@pytest.mark.skipif(os.geteuid() != 0, reason="hosts in network namespaces need root")
def test_a_short_seeded_soak_across_hosts(tmp_path):
    """Three members and a gateway in network namespaces: partitions, loss,
    crashed and frozen hosts, killed replicas."""
    work = tmp_path / "nemesis"
    p = subprocess.run([tool("llft-nemesis"), "--hosts", "--shapes", "kv,pool", "--faults", "8", "--seed", "11",
                        "--pace", "3", "--work-dir", str(work), "--examples", str(REPO / "examples" / "bin")],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    lines = [json.loads(line) for line in (work / "nemesis.jsonl").read_text().splitlines()]
    summaries = [s for s in lines if s.get("summary")]
    assert sum(s["survived"] for s in summaries) == 8 and all(s["lost"] == s["duplicated"] == 0 for s in summaries)
