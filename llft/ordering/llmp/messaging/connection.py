"""Per-connection state of one member: both halves plus the acknowledgment,
keep-alive, flow-control and reflection state around them."""
from __future__ import annotations

from llft.ordering.ids import ConnId
from llft.ordering.llmp.messaging.ordering import Reflector
from llft.ordering.llmp.messaging.recvside import RecvSide
from llft.ordering.llmp.messaging.sendside import SendSide
from llft.ordering.llmp.wire import Role


class Connection:
    def __init__(self, cid: ConnId, group: int, config, now: float):
        self.id = cid
        self.role: Role = Role.CLIENT if group == cid.client else Role.SERVER
        self.remote = cid.remote(group)
        self.tx = SendSide(config.rto, config.rto_min, config.rto_max)
        self.rx = RecvSide(config.recv_window, config.kept_window, config.kept_window_bytes)
        # acknowledgments we owe (as primary receiver)
        self.ack_sent = 0          # highest ack carried by anything we sent
        self.ack_due_since: float | None = None  # when receivedUpTo first passed ack_sent
        self.first_ack = 0         # FirstAck outstanding until a SecondAck covers it
        self.first_ack_tx = 0.0
        self.last_tx = now         # for KeepAlive
        self.keepalive_every = config.keepalive
        self.keepalive_said: tuple | None = None   # what the last KeepAlive said (periodic.py)
        self.last_nack = -1.0
        # intra-group flow control (lines 61-66): FirstAcks for our last msn,
        # and the msn our backups must generate before we send again
        self.acked_msn = 0
        self.acked_count = 0
        self.throttle_msn = 0
        self.blocked = False       # a send was refused; tell the app when writable again
        # ordering information (§III-C)
        self.reflector = Reflector()
