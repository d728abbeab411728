"""Real processes on real sockets: two groups of three members, each member
in its own network namespace joined by veth to a bridge, UDP multicast,
20% random loss in each member's kernel (nftables), duplication and
reordering from the seeded lossy wrapper.  10,000 requests of mixed sizes
(some fragmented, one of 1 MiB) and a reply to each: nothing lost, nothing
duplicated, the same order at every member."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from messaging_fixtures import CLIENT, SERVER, check_histories, member_specs
from netns import bridged_hosts, drop_randomly

REPO = Path(__file__).resolve().parent.parent
PORT = 17400


@pytest.fixture
def hosts():
    """{(group, member): (namespace, ip)}: six hosts, 20% of the group traffic each receives lost."""
    keys = [(g, m) for g in (CLIENT, SERVER) for m in range(3)]
    with bridged_hosts(len(keys)) as made:
        for ns, _ in made:
            drop_randomly(ns, [PORT + CLIENT, PORT + SERVER], 20)
        yield dict(zip(keys, made))


def test_two_groups_of_three_over_lossy_multicast(hosts, tmp_path):
    addrs = {k: (ip, PORT + k[0]) for k, (_, ip) in hosts.items()}
    specs = member_specs(tmp_path, addrs, mode="multicast", n=10_000, conns=2, port=PORT,
                         lossy={"seed": 1, "duplicate": 0.05, "reorder": 0.003}, deadline=240)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = []
    try:
        for spec in specs:
            path = tmp_path / f"spec-g{spec['group']}m{spec['member']}.json"
            path.write_text(json.dumps(spec))
            ns = hosts[(spec["group"], spec["member"])][0]
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "llft.ordering.llmp.messaging.node", str(path)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        end = time.monotonic() + 270
        for p in procs:
            p.wait(timeout=max(1, end - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errors = [p.stderr.read().decode()[-2000:] for p in procs if p.returncode != 0]
    finals = check_histories(specs)
    summary = {n: (f["elapsed"], f["drained"], f["stats"]["counters"].get("retransmissions", 0),
                   f["stats"]["drops"]) for n, f in finals.items()}
    print(json.dumps(summary, indent=1))
    assert not errors, errors
    assert all(f["drained"] and not f["timeout"] for f in finals.values()), summary
