"""Hosts on one machine: network namespaces joined by veth to one bridge
(in a namespace of its own, the switch), with a multicast route; and the
network faults between them that the kernel can make (this kernel has no
netem).  Always torn down.  For the tests and llft-nemesis --hosts."""
from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000


class HostsError(Exception):
    """Namespaces cannot be made here."""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def in_ns(ns: str, *argv) -> list[str]:
    return ["ip", "netns", "exec", ns, *map(str, argv)]


def drop_randomly(ns: str, udp_ports: list[int], percent: int) -> None:
    """percent% of the UDP traffic to these ports that this host receives is
    lost in its kernel (this kernel has no netem)."""
    ports = [str(p) for p in udp_ports]
    if shutil.which("nft"):
        nft = ["ip", "netns", "exec", ns, "nft"]
        sh(*nft, "add", "table", "inet", "llft")
        sh(*nft, "add chain inet llft in { type filter hook input priority 0; }")
        sh(*nft, f"add rule inet llft in udp dport {{ {', '.join(ports)} }} numgen random mod 100 < {percent} drop")
    else:
        sh("ip", "netns", "exec", ns, "iptables", "-A", "INPUT", "-p", "udp", "-m", "multiport",
           "--dports", ",".join(ports), "-m", "statistic", "--mode", "random",
           "--probability", str(percent / 100), "-j", "DROP")


@contextmanager
def deaf_to(ns: str, source_ip: str):
    """While inside, this host's kernel drops every IPv4 datagram from
    source_ip (a partition in one direction)."""
    if shutil.which("nft"):
        nft = ["ip", "netns", "exec", ns, "nft"]
        sh(*nft, "add", "table", "ip", "llft_deaf")
        sh(*nft, "add chain ip llft_deaf in { type filter hook input priority 0; }")
        sh(*nft, f"add rule ip llft_deaf in ip saddr {source_ip} drop")
        undo = [*nft, "delete", "table", "ip", "llft_deaf"]
    else:
        rule = ["-s", source_ip, "-j", "DROP"]
        sh("ip", "netns", "exec", ns, "iptables", "-I", "INPUT", *rule)
        undo = ["ip", "netns", "exec", ns, "iptables", "-D", "INPUT", *rule]
    try:
        yield
    finally:
        sh(*undo)


@contextmanager
def bridged_hosts(n: int):
    """Yields [(namespace, ip)] for n hosts on one bridge; HostsError where
    namespaces cannot be made."""
    if os.geteuid() != 0:
        raise HostsError("network namespaces need root")
    if not (shutil.which("nft") or shutil.which("iptables")):
        raise HostsError("neither nft nor iptables installed (apt-get install nftables)")
    sfx = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(150) + 100}.{secrets.randbelow(250)}"
    switch = f"llft-{sfx}-sw"
    created: list[str] = []
    try:
        try:
            sh("ip", "netns", "add", switch)
        except subprocess.CalledProcessError as e:
            raise HostsError(f"cannot create network namespaces: {e.stderr.strip()}") from None
        created.append(switch)
        br = f"br{sfx}"
        sh("ip", "-n", switch, "link", "add", br, "type", "bridge", "mcast_snooping", "0")
        sh("ip", "-n", switch, "link", "set", br, "up")
        out = []
        for i in range(n):
            ns, ip, dev = f"llft-{sfx}-{i}", f"{subnet}.{i + 1}", f"v{sfx}{i}"
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", f"p{sfx}{i}", "netns", switch)
            sh("ip", "-n", switch, "link", "set", f"p{sfx}{i}", "master", br, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)
            out.append((ns, ip))
        yield out
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def switch_of(made: list[tuple[str, str]]) -> str:
    """The namespace of the bridge joining hosts made by bridged_hosts."""
    return made[0][0].rsplit("-", 1)[0] + "-sw"


def enter(ns: str) -> None:
    """The calling thread's network namespace becomes ns: the sockets it
    makes from now on are that host's (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def stop_processes(procs: list[subprocess.Popen]):
    """Ends what was started in the hosts (members, gateways): SIGTERM to
    all, so that each stops its replicas; SIGKILL to any still there after
    15 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
