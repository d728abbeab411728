"""Real processes on real sockets: two groups of three members, each member
in its own network namespace joined by veth to a bridge, UDP multicast,
20% random loss in each member's kernel (nftables), duplication and
reordering from the seeded lossy wrapper.  10,000 requests of mixed sizes
(some fragmented, one of 1 MiB) and a reply to each: nothing lost, nothing
duplicated, the same order at every member."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from messaging_fixtures import CLIENT, SERVER, check_histories, member_specs

REPO = Path(__file__).resolve().parent.parent
PORT = 17400


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def drop_20_percent(ns: str) -> None:
    """20% of the group traffic this host receives is lost in its kernel."""
    ports = [str(PORT + CLIENT), str(PORT + SERVER)]
    if shutil.which("nft"):
        nft = ["ip", "netns", "exec", ns, "nft"]
        sh(*nft, "add", "table", "inet", "llft")
        sh(*nft, "add chain inet llft in { type filter hook input priority 0; }")
        sh(*nft, f"add rule inet llft in udp dport {{ {', '.join(ports)} }} numgen random mod 100 < 20 drop")
    else:
        sh("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-p", "udp", "-m", "multiport",
           "--dports", ",".join(ports), "-m", "statistic", "--mode", "random", "--probability", "0.2", "-j", "DROP")


@pytest.fixture
def hosts():
    """Six namespaces on one bridge (in a seventh, the switch); yields
    {(group, member): (namespace, ip)}.  Always torn down."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not (shutil.which("nft") or shutil.which("iptables")):
        pytest.skip("neither nft nor iptables installed (apt-get install nftables)")
    sfx = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(150) + 100}.{secrets.randbelow(250)}"
    switch = f"llft-{sfx}-sw"
    created: list[str] = []
    try:
        try:
            sh("ip", "netns", "add", switch)
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create network namespaces: {e.stderr.strip()}")
        created.append(switch)
        br = f"br{sfx}"
        sh("ip", "-n", switch, "link", "add", br, "type", "bridge", "mcast_snooping", "0")
        sh("ip", "-n", switch, "link", "set", br, "up")
        out = {}
        for i, key in enumerate((g, m) for g in (CLIENT, SERVER) for m in range(3)):
            ns, ip, dev = f"llft-{sfx}-{i}", f"{subnet}.{i + 1}", f"v{sfx}{i}"
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", f"p{sfx}{i}", "netns", switch)
            sh("ip", "-n", switch, "link", "set", f"p{sfx}{i}", "master", br, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
            drop_20_percent(ns)
            out[key] = (ns, ip)
        yield out
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


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
                ["ip", "netns", "exec", ns, sys.executable, "-m", "llft.messaging.node", str(path)],
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
