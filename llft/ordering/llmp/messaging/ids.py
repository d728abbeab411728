"""The connection a message of the Low Latency Messaging Protocol is on."""
from __future__ import annotations

from llft.ordering.ids import ConnId
from llft.ordering.llmp.wire import DropError, DropReason, Role


def conn_of(msg) -> ConnId:
    """The connection an inter-group message belongs to."""
    if msg.role == Role.CLIENT:
        return ConnId(msg.src_group, msg.dst_group, msg.conn_seq)
    if msg.role == Role.SERVER:
        return ConnId(msg.dst_group, msg.src_group, msg.conn_seq)
    raise DropError(DropReason.MALFORMED, "intra-group role on inter-group message")
