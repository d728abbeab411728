"""The seam's vocabulary: what the replication core and every ordering
backend name alike.  A connection between two groups, and a group's view
(who is in it, who is primary, and in which order the backups rank)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ConnId(NamedTuple):
    """(client group, server group, connSeqNum): with the sender's role on
    the wire this is LLFT's (sourceGroupId, destGroupId, connSeqNum, role)."""
    client: int
    server: int
    seq: int

    def remote(self, group: int) -> int:
        return self.server if group == self.client else self.client


@dataclass
class View:
    """Who is in the group, who is primary, and precedences (LLFT §IV).

    Changing it is the membership's job; everything else only reads it.
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

    def ranks(self) -> dict[int, int]:
        """Rank 1 is the primary; backups follow in order of precedence."""
        order = [self.primary] + sorted(self.backups(), key=lambda m: self.precedences[m])
        return {m: k + 1 for k, m in enumerate(order)}

    def __contains__(self, member: int) -> bool:
        return member in self.precedences
