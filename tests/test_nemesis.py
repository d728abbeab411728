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
    assert {s["shape"] for s in summaries} == {"echo", "poll", "epoll", "pool", "kv", "daemon", "redis", "memcached",
                                               "http"}
    assert sum(s["injected"] for s in summaries) == 32 and sum(s["survived"] for s in summaries) == 32
    assert all(s["lost"] == 0 and s["duplicated"] == 0 and not s["group_lost"] for s in summaries)
    assert sum(s["acknowledged"] for s in summaries) > 32 * 150
    faults = [json.loads(line) for line in (work / "nemesis.jsonl").read_text().splitlines()
              if '"kind"' in line]
    assert len({f["kind"] for f in faults}) >= 5, "the seed picks several kinds of fault"


@pytest.mark.skipif(os.geteuid() != 0, reason="hosts in network namespaces need root")
@pytest.mark.parametrize("joins", ["history", "checkpoint"])
def test_a_short_seeded_soak_across_hosts(tmp_path, joins):
    """Three members and a gateway in network namespaces: partitions, loss,
    crashed and frozen hosts, killed replicas; the members that join again
    replay the group's history, or (--clone) are restored from checkpoints
    of the primary."""
    work = tmp_path / "nemesis"
    p = subprocess.run([tool("llft-nemesis"), "--hosts", "--shapes", "kv,pool", "--faults", "8", "--seed", "11",
                        "--pace", "3", "--work-dir", str(work), "--examples", str(REPO / "examples" / "bin"),
                        *(["--clone"] if joins == "checkpoint" else [])],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    lines = [json.loads(line) for line in (work / "nemesis.jsonl").read_text().splitlines()]
    summaries = [s for s in lines if s.get("summary")]
    assert sum(s["survived"] for s in summaries) == 8 and all(s["lost"] == s["duplicated"] == 0 for s in summaries)


def test_the_fuzzers_bad_datagrams_are_all_refused_by_the_groups_codec():
    """Every datagram the fuzzer calls bad fails the group's own decoding
    (and is counted); its replays pass it: the fuzz run's accounting rests
    on this."""
    import random
    from llft.ordering.llmp import wire
    from llft.auth import Keyring
    from llft.ordering.llmp.messaging.fragments import split
    from llft.nemesis.fuzz import bad_datagrams
    key = Keyring(b"k" * 32)
    gid, other = 4242, 777
    own = [d for n in (20, 3000) for d in split(key, gid, wire.encode_message(wire.make(
        wire.MsgType.REQUEST, src_group=other, dst_group=gid, conn_seq=1, msn=n, payload=b"p" * n)), 1472)]
    refused = accepted = 0
    gen = bad_datagrams(random.Random(3), {gid: own, other: own})
    for _ in range(5000):
        category, d, g = next(gen)
        if g != gid:
            continue
        try:
            wire.decode_frame(d, key, [gid])
            ok = True
        except wire.DropError:
            ok = False
        if category == "replayed":
            assert ok, "a replay is the group's own datagram"
        else:
            assert not ok, f"a {category} datagram passed the group's decoding"
            refused += 1
        accepted += ok
    assert refused > 1500 and accepted > 300


@pytest.mark.skipif(os.geteuid() != 0, reason="hosts in network namespaces need root")
def test_bad_datagrams_against_a_live_group(tmp_path):
    """20,000 garbage, truncated, mutated, forged and replayed datagrams at
    a group across hosts, clients checked meanwhile: none crashes, the view
    stays, every bad datagram counted as dropped, nothing applied."""
    work = tmp_path / "nemesis"
    p = subprocess.run([tool("llft-nemesis"), "--fuzz", "20000", "--seed", "3", "--work-dir", str(work),
                        "--examples", str(REPO / "examples" / "bin")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    record = json.loads((work / "nemesis.jsonl").read_text().splitlines()[-1])
    assert sum(record["sent"].values()) == 20000 and record["uncounted"] == 0 and not record["crashed"]
    assert not record["stolen"] and not record["view_changed"] and record["acknowledged"] > 0
