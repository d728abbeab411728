"""The gateway's side of outgoing connections across hosts (docs/cluster.md,
"Outgoing connections"): the gateway is the group's endpoint to the outside
world both ways, so it makes the program's connect()s and keeps the remote
TCP connections across failovers of the group.

One control connection (connSeqNum CONTROL_SEQ) carries the primary's
[XOPEN k host port] Replies.  The gateway connects once per k (a new
primary repeating a connect its predecessor had not recorded gets the same
connection) and opens the virtual connection FIRST_SEQ + k, whose first
Request is the result and whose next are the remote's bytes: the same path
as a client's (ClusterGateway.pump), so every member gets them in one
order and the program's writes reach the remote once, by offset."""
from __future__ import annotations

import asyncio
import errno
import logging

from llft.cluster import payload
from llft.cluster.gateway_outgoing_udp import GatewayOutgoingUdp
from llft.cluster.outgoing import CONTROL_SEQ, FIRST_SEQ
from llft.ordering.ids import ConnId

log = logging.getLogger("llft.gateway.outgoing")


class GatewayOutgoing:
    def __init__(self, gateway):
        self.gw = gateway
        self.control: ConnId | None = None
        self.opened: dict[int, tuple[str, int]] = {}   # k -> the address it was asked for
        self.tasks: set[asyncio.Task] = set()
        self.udp = GatewayOutgoingUdp(gateway.ep, gateway.server_group)   # and the program's outgoing datagrams
        self.stats = {"connections": 0, "failed": 0, "repeated": 0, "dropped": 0, "udp": self.udp.stats}

    async def start(self):
        """Tells the group this gateway makes its outgoing connections."""
        self.control = self.gw.ep.connect(self.gw.server_group, CONTROL_SEQ)
        while not self.gw.ep.writable(self.control):
            await asyncio.sleep(0.01)
        self.gw.ep.send(self.control, payload.xctl_request())
        await self.udp.start()

    def handles(self, cid: ConnId) -> bool:
        return cid == self.control or self.udp.handles(cid)

    def writable(self, cid: ConnId):
        if self.udp.handles(cid):
            self.udp.writable(cid)

    def reply(self, cid: ConnId, body: bytes):
        if self.udp.handles(cid):
            return self.udp.reply(cid, body)
        try:
            k, host, port = payload.parse_xopen_reply(body)
        except payload.BadPayload as e:
            self.stats["dropped"] += 1
            self.gw.ep.count_drop("bad-payload")
            log.warning("control connection: %s", e)
            return
        if k in self.opened:
            # A new primary repeating its predecessor's request: the result
            # went to every member already.
            self.stats["repeated"] += 1
            if self.opened[k] != (host, port):
                self.stats["dropped"] += 1
                log.warning("outgoing connection %d asked again, to %s port %d instead of %s port %d",
                            k, host, port, *self.opened[k])
            return
        self.opened[k] = (host, port)
        task = asyncio.create_task(self._open(k, host, port))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self, k: int, host: str, port: int):
        cid = self.gw.ep.connect(self.gw.server_group, FIRST_SEQ + k)
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            self.stats["failed"] += 1
            log.info("outgoing connection %d to %s port %d: %s", k, host, port, e)
            while not self.gw.ep.writable(cid):
                await asyncio.sleep(0.01)
            self.gw.ep.send(cid, payload.xresult_request(k, e.errno or errno.ECONNREFUSED, host, port, ("0.0.0.0", 0)))
            return
        self.stats["connections"] += 1
        local = writer.get_extra_info("sockname")[:2]
        log.info("outgoing connection %d to %s port %d", k, host, port)
        await self.gw.pump(cid, reader, writer, payload.xresult_request(k, 0, host, port, local))

    def close(self):
        self.udp.close()
        for t in self.tasks:
            t.cancel()
