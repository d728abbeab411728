"""A member's side of outgoing UDP across hosts (docs/cluster.md, "Outgoing
UDP"): the program's datagrams from a socket it never bound (a resolver, a
client of a UDP service), sent by the gateway on the group's behalf.

    replica's UDP socket, bound by a send to a port P of its own (native/wrap_udp.c)
    primary --Reply [XUDP j P family] on the gateway's UDP control connection--> gateway
    gateway --Request [XPORT j local] then [DGRAM ...] on port j's connection--> every member --> its replica
    replica's sends --> Replies [DGRAM k host port bytes] ... [CLOSE n] on port j's connection --> gateway --> remote

The shim publishes such a port as LLFT_LISTENER_ANY_PORT, as on one host
(llft/serving/outgoing.py).  Members see their replicas' ports at their own
pace, so the primary numbers them (j) and says so in its ordering
information (b"U"): every member puts the very same XUDPs, in j's order, on
the control connection, and the gateway opens one UDP socket and one
virtual connection per j.  What comes back is numbered by the gateway on
that connection, so every member hands its replica the same datagrams in
the same order; only the primary's replies leave the gateway, each k once."""
from __future__ import annotations

import logging
from collections import deque

from llft.cluster import payload
from llft.ordering.ids import ConnId
from llft.native import conn_header
from llft.serving.datagrams import KEEP_LIMIT, DatagramLog, ReplicaPort

log = logging.getLogger("llft.cluster.outgoing_udp")

# connSeqNums: apart from the outgoing TCP connections (llft/cluster/outgoing.py).
UDP_CONTROL_SEQ = 3 << 32
UDP_FIRST_SEQ = UDP_CONTROL_SEQ + 1   # the program's j-th outgoing UDP port: UDP_FIRST_SEQ + j
SUMMARY_LIMIT = 256                   # ports listed in the state file (the lowest)
# Datagrams a port holds until the gateway has opened its connection;
# past this, dropped (memory stays bounded when no gateway offers outgoing
# connections: then every member drops the same ones).  A gateway that
# answers only after a port sent more than this could get the members'
# messages differently cut: not seen, the answer takes milliseconds.
HOLD_BYTES = 1 << 20


def is_outgoing_udp(cid: ConnId) -> bool:
    return cid.seq >= UDP_CONTROL_SEQ


class _Port:
    """One outgoing UDP port of the program, from the first sight of it (its
    replica's, or the primary's number for it) until the gateway closed it."""

    __slots__ = ("rp", "family", "j", "cid", "held", "held_bytes", "closed", "close_sent")

    def __init__(self, rp: ReplicaPort, family: int):
        self.rp, self.family = rp, family
        self.j: int | None = None        # the primary's number for it
        self.cid: ConnId | None = None   # its connection, once the gateway opened it (XPORT)
        self.held: deque[bytes] = deque()   # replies before then
        self.held_bytes = 0                 # their payloads' bytes, all held so far
        self.closed = False              # the program closed it
        self.close_sent = False


class MemberOutgoingUdp:
    def __init__(self, replica, ep, outbox, control, primary: bool):
        self.replica, self.ep, self.outbox = replica, ep, outbox
        self.control = control           # () -> the chosen gateway's TCP control connection, or None
        self.primary = primary
        self.open: dict[int, _Port] = {}      # program port -> the port its replica has now
        self.by_j: dict[int, _Port] = {}      # j -> port, until the gateway ends its connection
        self.unnumbered: dict[int, _Port] = {}   # backup: ports seen before the primary's number
        self.next_j = 0
        self.announced = 0                    # XUDPs put on the control connection: j < announced
        self.to_announce: dict[int, tuple[bytes, bytes]] = {}   # j -> (XUDP, the primary's b"U" entry or b"")
        self.early: dict[int, list] = {}      # requests of a j whose number has not come yet
        self.heard: set[ConnId] = set()       # UDP control connections offered (XCTL)
        self.logs: dict[int, DatagramLog] = {}   # what the replica sent, per program port
        self.stats = {"ports": 0, "datagrams_in": 0, "datagrams_out": 0, "dropped": 0, "replica_lost": 0,
                      "malformed_replies": 0}

    handles = staticmethod(is_outgoing_udp)

    def _drop(self, why: str):
        self.stats["dropped"] += 1
        log.warning("outgoing UDP: %s", why)

    def _udp_control(self) -> ConnId | None:
        tcp = self.control()
        if tcp is None:
            return None
        cid = ConnId(tcp.client, tcp.server, UDP_CONTROL_SEQ)
        return cid if cid in self.heard else None

    # -- the replica's ports ---------------------------------------------------
    def watch(self):
        """Attaches to the ports the replica has bound since, and ends those
        it has closed (called every few ms: the shim's first send waits for
        the attachment)."""
        listed = {port: family for port, family, _addr in self.replica.stream.any_port_datagram_listeners()}
        for port, family in listed.items():
            p = self.open.get(port)
            if p is None:
                p = self.open[port] = self.unnumbered.pop(port, None) or _Port(self._replica_port(port), family)
                if p.j is None:
                    if self.primary:
                        self._number(port, p)
                    else:
                        self.unnumbered[port] = p
            if p.rp.sock is None and self.replica.alive():
                p.rp.attach()
        for port, p in list(self.open.items()):
            if p.rp.sock is not None and port not in listed:
                p.rp._readable()   # what it sent last
                p.rp.close()
                p.closed = True
                del self.open[port]
                self._send_close(p)

    def _replica_port(self, port: int) -> ReplicaPort:
        rp = ReplicaPort(self.replica, port, self._reply, self.stats)
        self.logs[port] = rp.out
        self.stats["ports"] += 1
        return rp

    def _number(self, port: int, p: _Port):
        """Primary: the next j is this port's."""
        p.j, self.next_j = self.next_j, self.next_j + 1
        self.by_j[p.j] = p
        self._announce(p.j, port, p.family, payload.udp_port_blob(p.j, port, p.family))

    def ordered(self, j: int, port: int, family: int):
        """Backup: the primary's program's j-th outgoing UDP port is `port`."""
        p = self.unnumbered.pop(port, None) or self.open.get(port)
        if p is None or p.j is not None:
            p = _Port(self._replica_port(port), family)   # its replica has not bound it yet
            if port not in self.open:
                self.open[port] = p
        p.j, self.next_j = j, max(self.next_j, j + 1)
        self.by_j[j] = p
        self._announce(j, port, family)
        for req in self.early.pop(j, ()):
            self.request(ConnId(*req[0]), req[1])

    def promote(self):
        """Primary from now on: after the old primary's numbers, it numbers
        the ports its replica has that had none."""
        self.primary = True
        if self.early:   # (a gateway acts on an XUDP only with its entry at hand: the synchrony point has it)
            log.warning("outgoing UDP: requests for ports %s, whose numbers never came, are dropped",
                        sorted(self.early))
            self.stats["dropped"] += sum(len(v) for v in self.early.values())
            self.early.clear()
        for port in sorted(self.unnumbered):
            self._number(port, self.unnumbered.pop(port))

    def _announce(self, j: int, port: int, family: int, entry: bytes = b""):
        """XUDPs go on the control connection in j's order, each once, at
        every member: the primary's as it numbers ports, a backup's as the
        numbers come (messaging needs the very same messages everywhere).
        The primary's carries its ordering entry for j: the gateway acts on
        an XUDP only with the entry in hand, so a new primary always learns
        the old one's numbers from it (added on its own, the entry rode on
        another connection's message, which could be lost with the primary
        while the XUDP got through: the new primary numbered its ports
        anew, and answers reached the wrong sockets)."""
        if j >= self.announced:
            self.to_announce[j] = (payload.xudp_reply(j, port, family), entry)
        self.flush_announcements()

    def _reply(self, rp: ReplicaPort, k: int, data: bytes, dest):
        p = self.open.get(rp.port)
        if p is None or p.rp is not rp:
            return
        body = payload.datagram_reply(k, dest[0], dest[1], data)
        self.stats["datagrams_out"] += 1
        if p.cid is not None:
            self.outbox.put(p.cid, body)
        elif p.held_bytes + len(data) <= HOLD_BYTES:
            p.held.append(body)
            p.held_bytes += len(data)
        else:
            self._drop(f"UDP port {rp.port}: no gateway has served it yet ({HOLD_BYTES >> 20} MiB held); "
                       f"a datagram to {dest[0]} port {dest[1]} is lost")

    def _send_close(self, p: _Port):
        if p.closed and p.cid is not None and not p.close_sent:
            p.close_sent = True
            self.outbox.put(p.cid, payload.close_reply(p.rp.out.datagrams))

    # -- requests from the gateway (in messaging's order) ---------------------
    def request(self, cid: ConnId, req: tuple):
        kind = req[0]
        if cid.seq == UDP_CONTROL_SEQ:
            if kind != payload.XCTL:
                return self._drop(f"request {kind} on the UDP control connection {tuple(cid)}")
            self.heard.add(cid)
            self.flush_announcements()
            return
        j = cid.seq - UDP_FIRST_SEQ
        p = self.by_j.get(j)
        if p is None:
            if j >= self.next_j and len(self.early) < KEEP_LIMIT:   # its number is on its way
                self.early.setdefault(j, []).append((tuple(cid), req))
            else:
                self._drop(f"request {kind} for outgoing UDP port {j}, which this member does not know")
            return
        if kind == payload.XPORT:
            if p.cid is None:
                p.cid = cid
                while p.held:
                    self.outbox.put(cid, p.held.popleft())
                self._send_close(p)
        elif kind == payload.DGRAM and p.cid == cid:
            _, _program_port, number, host, port, data = req
            self.stats["datagrams_in"] += 1
            if not p.closed:
                p.rp.deliver(conn_header(number, host, port) + data)
        elif kind == payload.EOF and p.cid == cid:
            del self.by_j[j]   # the gateway closed the port: both sides ended
            self.ep.finish(cid)
        else:
            self._drop(f"request {kind} on outgoing UDP port {j} before its XPORT")

    def flush_announcements(self):
        ctl = self._udp_control()
        while ctl is not None and self.announced in self.to_announce:
            self.outbox.put(ctl, *self.to_announce.pop(self.announced))
            self.announced += 1

    def drain(self):
        """Takes what the replica sent last (it has exited)."""
        for p in self.open.values():
            p.rp._readable()

    def summary(self) -> dict:
        ports = {f"udp-{port}": out.summary() for port, out in sorted(self.logs.items())[:SUMMARY_LIMIT]}
        return {**ports, "udp": dict(self.stats)} if self.logs else {}

    def close(self):
        for p in self.open.values():
            p.rp.close()
