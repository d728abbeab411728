"""The gateway's side of outgoing UDP across hosts (docs/cluster.md,
"Outgoing UDP"): the program's datagrams from ports it never bound leave
from a UDP socket of the gateway, which outlives any member's host.

One UDP control connection (connSeqNum UDP_CONTROL_SEQ) carries the
primary's [XUDP j P family] Replies.  The gateway opens one UDP socket per
j, on any free port (a new primary repeating j gets the same one), and the
virtual connection UDP_FIRST_SEQ + j, whose first Request is [XPORT j
local] and whose next are the datagrams that come back to that socket:
the machinery of the program's own UDP ports (llft/cluster/datagrams.py),
numbered and sent each once by k.  The program's close of the port ends
it: [CLOSE n], then the gateway closes the socket and the connection."""
from __future__ import annotations

import asyncio
import logging
import socket

from llft.cluster import payload
from llft.cluster.datagrams import GatewayDatagrams, _PublicPort
from llft.cluster.outgoing_udp import UDP_CONTROL_SEQ, UDP_FIRST_SEQ
from llft.ordering.ids import ConnId

log = logging.getLogger("llft.gateway.outgoing_udp")


class _OutgoingPort(_PublicPort):
    """An outgoing UDP port's socket; once the program closed the port, its
    connection ends after what is still waiting for messaging's window."""

    closing = False

    def flush(self):
        super().flush()
        if self.closing and not self.waiting:
            self.owner.finished(self)


class GatewayOutgoingUdp(GatewayDatagrams):
    def __init__(self, ep, server_group: int):
        super().__init__(ep, server_group, [])
        self.control: ConnId | None = None
        self.opened: set[int] = set()   # every j asked for (a new primary repeats some)
        self.tasks: set[asyncio.Task] = set()
        self.stats.update(ports=0, open_ports=0, ports_repeated=0, ports_failed=0)

    async def start(self):
        """Tells the group this gateway sends its outgoing datagrams."""
        self.control = self.ep.connect(self.server_group, UDP_CONTROL_SEQ)
        while not self.ep.writable(self.control):
            await asyncio.sleep(0.01)
        self.ep.send(self.control, payload.xctl_request())

    def handles(self, cid: ConnId) -> bool:
        return cid == self.control or cid in self.by_cid

    def reply(self, cid: ConnId, body: bytes):
        try:
            if cid == self.control:
                return self._open(*payload.parse_xudp_reply(body))
            kind, *rest = payload.parse_port_reply(body)
        except payload.BadPayload as e:
            self.stats["bad_replies"] += 1
            self.ep.count_drop("bad-payload")
            log.warning("outgoing UDP connection %s: %s", tuple(cid), e)
            return
        port = self.by_cid[cid]
        if kind == payload.CLOSE:
            self._close(port)
        elif port.closing or port.transport is None:
            self.stats["dropped"] += 1   # after the close (a repeat), or a socket that could not be bound
        else:
            port.reply(*rest)

    def writable(self, cid: ConnId):
        port = self.by_cid.get(cid)
        if port is not None:
            port.flush()

    def _open(self, j: int, program_port: int, family: int):
        if j in self.opened:
            self.stats["ports_repeated"] += 1   # a new primary repeating its predecessor's
            return
        self.opened.add(j)
        cid = self.ep.connect(self.server_group, UDP_FIRST_SEQ + j)
        port = self.by_cid[cid] = _OutgoingPort(self, program_port, cid)
        task = asyncio.create_task(self._bind(j, port, family))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _bind(self, j: int, port: _OutgoingPort, family: int):
        host = "::" if family == socket.AF_INET6 else "0.0.0.0"
        local = (host, 0)
        try:
            await asyncio.get_running_loop().create_datagram_endpoint(lambda: port, local_addr=local)
            local = port.transport.get_extra_info("sockname")[:2]
            self.stats["ports"] += 1
            self.stats["open_ports"] += 1
            log.info("outgoing UDP port %d (the program's port %d) on %s port %d", j, port.program_port, *local)
        except OSError as e:
            self.stats["ports_failed"] += 1
            log.warning("outgoing UDP port %d: cannot bind %s: %s; its datagrams are dropped", j, host, e)
        request = payload.xport_request(j, local)
        port.waiting.appendleft(request)   # first, whatever came in meanwhile
        port.waiting_bytes += len(request)
        port.flush()

    def _close(self, port: _OutgoingPort):
        if port.closing:
            return   # a new primary repeating the close
        port.closing = True
        if port.transport is not None:
            port.transport.close()
            self.stats["open_ports"] -= 1
        port.waiting.append(payload.eof_request())
        port.flush()

    def finished(self, port: _OutgoingPort):
        """Both sides ended: messaging retires the connection once it is quiet."""
        if self.by_cid.pop(port.cid, None) is not None:
            self.ep.finish(port.cid)

    def close(self):
        super().close()
        for t in self.tasks:
            t.cancel()
