"""Group names to what the network needs: a group id, its multicast address
and its virtual port.  Every host derives the same values from the name, so
members and gateways find each other with no directory service."""
from __future__ import annotations

import zlib

from llft.transport import DEFAULT_PORT, Directory, GroupAddress


def group_id(name: str) -> int:
    """A 16-bit id (multicast addresses tell groups apart modulo 2^16), never 0."""
    return (zlib.crc32(name.encode()) & 0xFFFF) or 1


def gateway_group_name(group: str, public_port: int, host_label: str) -> str:
    """A gateway is a group of its own (the client side of the virtual connections)."""
    return f"{group}/gateway/{host_label}:{public_port}"


class DerivedDirectory(Directory):
    """A multicast directory where any group's address follows from its id,
    so a server group can reply to gateways it was never told about."""

    def __init__(self, groups: list[int], port: int = DEFAULT_PORT):
        super().__init__([GroupAddress(g, port) for g in groups], "multicast")
        self.port = port

    def destinations(self, group: int) -> list[tuple[str, int]]:
        if group not in self.groups:
            self.groups[group] = GroupAddress(group, self.port)
        return super().destinations(group)
