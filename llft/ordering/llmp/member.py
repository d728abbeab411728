"""The `llft` backend for one member across hosts: the Low Latency
Messaging Protocol's endpoint (messaging/), the newcomer's side of the
admission (membership/membership.py: Joiner), and LLFT's leader-determined
membership (membership/membership_protocol.py), behind the seam's
GroupMember (llft/ordering/group.py)."""
from __future__ import annotations

from typing import Callable

from llft.auth import Keyring
from llft.ordering.group import GroupMember, Joined, MemberHooks
from llft.ordering.ids import View
from llft.ordering.llmp.membership.membership import Joiner
from llft.ordering.llmp.membership.membership_protocol import MembershipProtocol
from llft.ordering.llmp.messaging.clock import LoopClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint

# Heartbeats carry watermarks every 20 ms; a bodiless one in between keeps
# the fault detectors' silence short.
MEMBER_CONFIG = dict(liveness=0.005)


class LlmpMember(GroupEndpoint, GroupMember):
    def __init__(self, gid: int, me: int, loop, transport, key: bytes, config: Config | None = None):
        super().__init__(View(gid, primary=0, precedences={}, pvn=0), me, LoopClock(loop), transport, Keyring(key),
                         config or Config(**MEMBER_CONFIG))
        self.joiner: Joiner | None = None
        self.membership: MembershipProtocol | None = None
        self.on_order_added = None

    # -- the group ---------------------------------------------------------
    def datagram(self, data: bytes, addr) -> bool:
        if self.joiner is not None:
            self.joiner.datagram(data, addr)
            return False
        requests = self.counters["rx_request"]
        self.datagram_received(data, addr)
        return self.counters["rx_request"] != requests

    async def join(self, found_after: float, give_up_after: float, restores: bool, spool) -> Joined | None:
        self.joiner = Joiner(self, found_after, give_up_after, restores=restores, spool=spool)
        try:
            joined = await self.joiner.join()
            if joined is not None:
                joined.seen = self.joiner.seen_admissions
            return joined
        finally:
            self.joiner = None

    def found(self) -> None:
        self.view = View(self.group, self.me, {self.me: 1}, pvn=1)

    def adopt(self, joined: Joined) -> None:
        self.lineage.adopt(joined.lineage)
        self.view = joined.view
        self.sequencer.skip_to(joined.oseq)

    def start_membership(self, unread: Callable[[], bool], opts, hooks: MemberHooks) -> MembershipProtocol:
        self.membership = MembershipProtocol(self, unread, opts, hooks)
        self.on_event = self.membership.on_event
        return self.membership
