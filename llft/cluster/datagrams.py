"""The program's UDP ports across hosts.

    UDP client -> llft-gateway --Request [DGRAM ...]--> every member --AF_UNIX--> its replica
    primary's replica --> primary --Reply [DGRAM k ...]--> llft-gateway --> UDP client

The gateway serves each of the program's UDP ports (`--udp-port`) on a
public UDP port and opens one virtual connection per port to the group:
every client datagram, numbered by the gateway, goes over it as a Request,
so messaging delivers them to every member in one order.  A member hands
each to its replica's virtual UDP socket (the relay of one host,
`llft/serving/datagrams.py`: header with the number and the client's
address), and each datagram its replica sends becomes one Reply, numbered
k.  The primary's Replies are multicast; a backup's, the very same messages
at every member, are only logged by messaging (semi-active replication)
and digested.  After a primary change the new primary sends again what
messaging says the gateway has not had, and the gateway drops any k it
already sent, so a client gets each reply once."""
from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict, deque

from llft.cluster import payload
from llft.cluster.outgoing import is_outgoing
from llft.ordering.ids import ConnId
from llft.native import conn_header
from llft.serving.datagrams import QUEUE_LIMIT, ReplicaPort
from llft.serving.public_udp import PublicUdpPort

log = logging.getLogger("llft.datagrams")

SEQ_BASE = 1 << 32          # a UDP port's connection: SEQ_BASE + port (TCP connections count from 1)
WATCH_S = 0.02


def connection_seq(program_port: int) -> int:
    return SEQ_BASE + program_port


def parse_port_map(spec: str) -> tuple[int, int]:
    """--udp-port [PROG:]PUBLIC -> (program port, public port); ValueError if bad."""
    prog, _, public = spec.rpartition(":")
    try:
        ports = (int(prog or public), int(public))
    except ValueError:
        raise ValueError(f"{spec}: expected [PROG:]PUBLIC, port numbers") from None
    if not all(0 < p < 65536 for p in ports):
        raise ValueError(f"{spec}: ports are 1-65535")
    return ports


# -- the gateway's side ---------------------------------------------------------
class _PublicPort(PublicUdpPort):
    """One of the program's UDP ports, served on a public port of the
    gateway: client datagrams go to the group as Requests on its connection
    (IPv4 clients as such: the members give them to the program in its own
    family)."""

    def __init__(self, owner: "GatewayDatagrams", program_port: int, cid: ConnId):
        super().__init__(program_port, socket.AF_INET, owner.stats)
        self.owner, self.cid = owner, cid
        self.waiting: deque[bytes] = deque()  # Requests waiting for messaging's window
        self.waiting_bytes = 0

    def full(self) -> bool:
        return self.waiting_bytes > QUEUE_LIMIT

    def forward(self, number: int, host: str, port: int, data: bytes) -> None:
        request = payload.datagram_request(self.program_port, number, host, port, data)
        self.waiting.append(request)
        self.waiting_bytes += len(request)
        self.flush()

    def flush(self):
        ep = self.owner.ep
        while self.waiting and ep.writable(self.cid):
            request = self.waiting.popleft()
            self.waiting_bytes -= len(request)
            ep.send(self.cid, request)

    def reply(self, k: int, host: str, port: int, data: bytes):
        if k < self.sent:                 # a new primary repeats what the old one sent
            self.stats["repeated"] += 1
            return
        if k > self.sent:
            log.error("UDP port %d: replies %d..%d of the program are missing", self.program_port, self.sent, k - 1)
        self.send(k, data, host, port)


class GatewayDatagrams:
    """llft-gateway's UDP ports: (program port, public port) pairs."""

    def __init__(self, ep, server_group: int, ports: list[tuple[int, int]]):
        self.ep, self.server_group, self.ports = ep, server_group, ports
        self.by_cid: dict[ConnId, _PublicPort] = {}
        self.stats = {"datagrams_in": 0, "datagrams_out": 0, "dropped": 0, "repeated": 0, "bad_replies": 0}

    async def serve(self, host: str):
        loop = asyncio.get_running_loop()
        for program_port, public in self.ports:
            cid = self.ep.connect(self.server_group, connection_seq(program_port))
            proto = _PublicPort(self, program_port, cid)
            try:
                await loop.create_datagram_endpoint(lambda: proto, local_addr=(host, public))
            except OSError as e:
                raise OSError(e.errno, f"cannot bind {host} UDP port {public}: {e.strerror}") from None
            self.by_cid[cid] = proto
            log.warning("serving UDP clients on %s port %d (the program's UDP port %d)", host, public, program_port)

    def handles(self, cid: ConnId) -> bool:
        return cid in self.by_cid

    def reply(self, cid: ConnId, body: bytes):
        try:
            k, host, port, data = payload.parse_datagram_reply(body)
        except payload.BadPayload as e:
            self.stats["bad_replies"] += 1
            self.ep.count_drop("bad-payload")
            log.debug("UDP connection %s: %s", cid, e)
            return
        self.by_cid[cid].reply(k, host, port, data)

    def writable(self, cid: ConnId):
        self.by_cid[cid].flush()

    def close(self):
        for p in self.by_cid.values():
            if p.transport is not None:
                p.transport.close()


# -- a member's side --------------------------------------------------------------
ROUTES_LIMIT = 65536        # client addresses remembered per member, for routing replies


class _Merge:
    """One UDP port's datagrams from every gateway, merged into the order
    the program reads them: at the primary as messaging delivers them, at
    a backup as the primary's ordering information says it did."""

    __slots__ = ("expected", "arrived")

    def __init__(self):
        self.expected: deque[tuple] = deque()    # (cid, number), from the primary
        self.arrived: OrderedDict[tuple, tuple] = OrderedDict()   # (cid, number) -> request, in arrival order


class MemberDatagrams:
    """A member's replica's UDP ports: client datagrams in, in the primary's
    order; every datagram the replica sends out as one Reply to the gateway
    its destination's datagrams came through (sent by the primary, logged
    by a backup: messaging decides).

    Each gateway has its own virtual connection for a port, each delivered
    in its own order, and a member gets the connections' messages
    interleaved as they came: so the primary says, in its ordering
    information, which datagram it handed its program next, and a backup
    hands its program the same one."""

    def __init__(self, replica, outbox, primary: bool):
        self.replica, self.outbox, self.primary = replica, outbox, primary
        self.ports: dict[int, ReplicaPort] = {}
        self.merges: dict[int, _Merge] = {}
        # port -> the first connection that delivered on it: replies to an
        # address never heard from go there (the same at every member,
        # unlike "the last one", which depends on when a reply is read)
        self.cids: dict[int, ConnId] = {}
        self.routes: OrderedDict[tuple, ConnId] = OrderedDict()   # (port, host, client port) -> connection
        self.numbered: dict[ConnId, int] = {}       # replies numbered per connection
        self.stats = {"replica_lost": 0, "malformed_replies": 0, "kept_dropped": 0}

    def handles(self, cid: ConnId) -> bool:
        return cid.seq > SEQ_BASE

    def request(self, cid: ConnId, req: tuple):
        program_port, number = req[1], req[2]
        merge = self.merges.setdefault(program_port, _Merge())
        merge.arrived[(cid, number)] = req
        self._release(program_port, merge)

    def ordered(self, cid: ConnId, number: int):
        """Backup: the primary handed this datagram to its program next."""
        program_port = cid.seq - SEQ_BASE
        merge = self.merges.setdefault(program_port, _Merge())
        merge.expected.append((cid, number))
        self._release(program_port, merge)

    def promote(self):
        """This member's replica is primary from now on: after the datagrams
        the old primary ordered, it orders the rest as they come."""
        self.primary = True
        for program_port, merge in self.merges.items():
            self._release(program_port, merge)

    def _release(self, program_port: int, merge: _Merge):
        arrived, expected = merge.arrived, merge.expected
        while expected and expected[0] in arrived:
            key = expected.popleft()
            self._deliver(key[0], arrived.pop(key))
        if self.primary and not expected:
            while arrived:
                (cid, number), req = arrived.popitem(last=False)
                self.outbox.ep.order(payload.datagram_blob(tuple(cid), number))
                self._deliver(cid, req)

    def _deliver(self, cid: ConnId, req: tuple):
        _, program_port, number, host, client_port, data = req
        self.cids.setdefault(program_port, cid)
        route = (program_port, host, client_port)
        self.routes[route] = cid
        self.routes.move_to_end(route)
        if len(self.routes) > ROUTES_LIMIT:
            self.routes.popitem(last=False)
        self._port(program_port).deliver(conn_header(number, host, client_port) + data)

    def _port(self, program_port: int) -> ReplicaPort:
        p = self.ports.get(program_port)
        if p is None:
            p = self.ports[program_port] = ReplicaPort(self.replica, program_port, self._reply, self.stats)
        return p

    def _reply(self, port: ReplicaPort, _k: int, data: bytes, dest):
        # To the gateway the destination's datagrams came through; numbered
        # per connection, so each gateway sees its replies' numbers in a row.
        cid = self.routes.get((port.port, dest[0], dest[1])) or self.cids.get(port.port)
        if cid is not None:
            k = self.numbered.get(cid, 0)
            self.numbered[cid] = k + 1
            self.outbox.put(cid, payload.datagram_reply(k, dest[0], dest[1], data))

    async def run(self):
        """Connects each port to the replica's socket once its program has
        bound it (datagrams wait until then)."""
        while True:
            for port, p in self.ports.items():
                if p.sock is None and self.replica.alive():
                    p.attach()
            await asyncio.sleep(WATCH_S)

    def rebase(self, cid: ConnId, later: list[bytes]):
        """After a primary change: replies logged beyond what the gateway has
        go out again as new messages (the gateway drops any it had).  Reply
        k is message k + 1 on its connection at every member, whenever this
        member's replica produced it (see number_from)."""
        if not is_outgoing(cid):   # (outgoing connections' rebases come here too: not numbered here)
            self.outbox.ep.number_from(cid, self.numbered.get(cid, 0) - len(later))
        for body in later:
            self.outbox.put(cid, body)

    def drain(self):
        """Takes what the replica sent last (it has exited)."""
        for p in self.ports.values():
            p._readable()

    def held(self) -> dict[str, dict]:
        """Per UDP port, the client datagrams not yet handed to the replica:
        those arrived (waiting for their turn) and the turns named by the
        primary (waiting for their datagram), with the next turn."""
        return {str(port): {"arrived": len(m.arrived), "turns": len(m.expected),
                            "next": [list(m.expected[0][0]), m.expected[0][1]] if m.expected else None}
                for port, m in sorted(self.merges.items()) if m.arrived or m.expected}

    def summary(self) -> dict[str, dict]:
        """What this replica sent, per UDP port (count, bytes, SHA-256)."""
        return {str(port): p.out.summary() for port, p in sorted(self.ports.items())}

    def close(self):
        for p in self.ports.values():
            p.close()

