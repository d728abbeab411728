"""Connection identities and the static view of a group's membership."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from llft.wire import DropError, DropReason, Role


class ConnId(NamedTuple):
    """(client group, server group, connSeqNum): with the sender's role on
    the wire this is the paper's (sourceGroupId, destGroupId, connSeqNum, role)."""
    client: int
    server: int
    seq: int

    def remote(self, group: int) -> int:
        return self.server if group == self.client else self.client

    def role_of(self, group: int) -> Role:
        return Role.CLIENT if group == self.client else Role.SERVER


def conn_of(msg) -> ConnId:
    """The connection an inter-group message belongs to."""
    if msg.role == Role.CLIENT:
        return ConnId(msg.src_group, msg.dst_group, msg.conn_seq)
    if msg.role == Role.SERVER:
        return ConnId(msg.dst_group, msg.src_group, msg.conn_seq)
    raise DropError(DropReason.MALFORMED, "intra-group role on inter-group message")


@dataclass
class View:
    """Who is in the group, who is primary, and precedences (LLFT §IV).

    Changing it is the membership protocol's job; messaging only reads it.
    """
    group: int
    primary: int
    precedences: dict[int, int] = field(default_factory=dict)  # member id -> precedence
    pvn: int = 1

    @property
    def primary_precedence(self) -> int:
        return self.precedences.get(self.primary, 0)

    def backups(self) -> list[int]:
        return [m for m in self.precedences if m != self.primary]

    def __contains__(self, member: int) -> bool:
        return member in self.precedences
