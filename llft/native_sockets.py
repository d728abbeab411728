"""Real network ports held by a replica's processes.  A replica's program
reaches the network only through the preload library, which turns its
sockets into socketpair ends the controller serves; a kernel socket that
listens on (TCP) or is bound to (UDP) an inet port in a replica's process
tree means the program made its system calls another way (inline system
calls, a runtime of its own): its primary would serve clients itself,
unreplicated, around the gateway, and its backups could not bind the same
port.  llft-run stops such a group and says what it found."""
from __future__ import annotations

import psutil


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out by itself (a UDP socket that
    sends without binding gets one: a client, not a server)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bypassing_ports(pid: int) -> list[str]:
    """'TCP 127.0.0.1:7000' for each inet port a process of pid's tree
    listens on (TCP) or has bound below the ephemeral range and not
    connected (UDP); [] when none, or when pid is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found, floor = [], _ephemeral_floor()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            tcp = c.type == 1    # SOCK_STREAM
            if (tcp and c.status == psutil.CONN_LISTEN) or \
                    (not tcp and c.laddr and 0 < c.laddr.port < floor and not c.raddr):
                found.append(f"{'TCP' if tcp else 'UDP'} {c.laddr.ip}:{c.laddr.port}")
    return sorted(set(found))


def bypass_message(index: int, pid: int, ports: list[str]) -> str:
    return (f"replica {index} (pid {pid}) holds {', '.join(ports)} itself: the program made its socket calls "
            "around the C library (inline system calls, or a runtime of its own such as Go's), so llft cannot "
            "replicate it, and clients could reach it around the gateway")
