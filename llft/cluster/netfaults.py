"""Network faults for llft-kill: partitions and random loss between the
hosts of a group whose members run in network namespaces (or on hosts
whose namespaces this machine can enter).  Each fault is an nftables rule
in the member's own namespace (entered through its controller's
/proc/PID/ns/net), in a table of llft's own that --heal deletes."""
from __future__ import annotations

import shutil
import subprocess

TABLE = "llft_fault"


class NetFaultError(Exception):
    pass


def _nft(pid: int, *commands: str) -> None:
    for cmd in commands:
        r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "nft", cmd], capture_output=True, text=True)
        if r.returncode != 0:
            raise NetFaultError(f"nft {cmd!r} in the namespace of pid {pid}: {r.stderr.strip()}")


def _chain(pid: int) -> None:
    _nft(pid, f"add table inet {TABLE}",
         f"add chain inet {TABLE} input {{ type filter hook input priority -10; }}")


def check_tools() -> None:
    for tool in ("nsenter", "nft"):
        if not shutil.which(tool):
            raise NetFaultError(f"{tool} is not installed (apt-get install util-linux nftables)")


def partition(pid: int, port: int, unreachable: list[str]) -> None:
    """This member no longer hears the group's traffic from these addresses."""
    if unreachable:
        _chain(pid)
        _nft(pid, f"add rule inet {TABLE} input ip saddr {{ {', '.join(unreachable)} }} udp dport {port} drop")


def lose(pid: int, port: int, percent: int) -> None:
    """percent% of the group traffic this member receives is lost."""
    _chain(pid)
    _nft(pid, f"add rule inet {TABLE} input udp dport {port} numgen random mod 100 < {percent} drop")


def heal(pid: int) -> None:
    r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "nft", f"delete table inet {TABLE}"],
                       capture_output=True, text=True)
    if r.returncode != 0 and "No such file" not in r.stderr:
        raise NetFaultError(f"cannot remove the faults in the namespace of pid {pid}: {r.stderr.strip()}")
