"""The `llft` backend at a gateway: the Low Latency Messaging Protocol's
endpoint of a group of its own (one member, always primary), on the
server group's port."""
from __future__ import annotations

from llft.auth import Keyring
from llft.cluster.naming import DerivedDirectory
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.clock import LoopClock
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
from llft.ordering.llmp.messaging.viewchange import answer_new_primary_view
from llft.ordering.llmp.wire import MsgType
from llft.transport import UdpTransport


class GatewayEnd(GroupEndpoint):
    """A new primary of the server group asks each remote group where its
    connections stand (NewPrimaryView, LLFT Fig. 9): the gateway answers."""

    def __init__(self, view: View, server_group: int, clock, key: bytes):
        super().__init__(view, 1, clock, None, Keyring(key))
        self.server_group = server_group

    def _event(self, name: str, **info) -> None:
        msg = info.get("msg")
        if name == "membership-message" and msg is not None and msg.src_group == self.server_group \
                and msg.TYPE == MsgType.NEW_PRIMARY_VIEW:
            answer_new_primary_view(self, msg)
        super()._event(name, **info)

    def close(self) -> None:
        super().close()
        if self.transport is not None:
            self.transport.close()


async def open_gateway_end(gid: int, server_group: int, group_port: int, interface: str, loop,
                           key: bytes) -> GatewayEnd:
    ep = GatewayEnd(View(gid, primary=1, precedences={1: 1}), server_group, LoopClock(loop), key)
    ep.transport = await UdpTransport.open(DerivedDirectory([gid, server_group], group_port), gid, 1,
                                           ep.datagram_received, interface, loop)
    return ep.start()
