"""A member's side of outgoing connections across hosts (docs/cluster.md,
"Outgoing connections"): the program's connect() to a server outside the
group, made by the gateway on the group's behalf.

    replica --its channel (llft/serving/channel.py)--> this member
    primary --Reply [XOPEN k host port] on the gateway's control connection--> gateway --TCP--> remote
    gateway --Requests [XRESULT ...] [DATA] [EOF] on connection k--> every member --> its replica
    replica's writes --> Replies [DATA offset] [CLOSE] on connection k (ReplyStream, as for clients)

The shim's side and the request format are those of one host
(native/wrap_connect.c, llft/serving/outgoing.py).  The primary's replica
asks (LLFT_CONNECT_ASK): the primary's controller sends XOPEN once per k and
answers with the XRESULT every member gets; a backup's replica attaches its
socket to connection k when it replays the recorded connect.  A member
keeps the bytes the remote sent on k until its replica attaches, so that
a replica attaching late (a backup, a joiner replaying the transferred
requests) gets them all; after that they go straight to the replica's
socket (the group's history keeps them for newcomers, bounded)."""
from __future__ import annotations

import asyncio
import errno
import logging

from llft.cluster import payload
from llft.cluster.outgoing_udp import MemberOutgoingUdp
from llft.ordering.ids import ConnId
from llft.native import CONNECT_ASK, CONNECT_REQUEST_SIZE, connect_reply, parse_connect_request
from llft.serving.outgoing import MAX_ERRORS, READ_CHUNK

log = logging.getLogger("llft.cluster.outgoing")

WATCH_S = 0.02   # how often the replica's outgoing UDP ports are looked at

# connSeqNums of the gateway's virtual connections for outgoing connections,
# apart from client connections (from 1) and UDP ports (2^32 + port).
CONTROL_SEQ = 1 << 33
FIRST_SEQ = CONTROL_SEQ + 1   # the program's k-th outgoing connection: FIRST_SEQ + k


def is_outgoing(cid: ConnId) -> bool:
    return cid.seq >= CONTROL_SEQ


class _Remote:
    """Outgoing connection k as this member sees it."""

    def __init__(self):
        self.result = asyncio.get_running_loop().create_future()   # (cid, errno, host, port, local)
        self.received = bytearray()   # what the remote sent, from the first byte, until the replica attaches
        self.eof = False
        self.attached = False         # the replica has its socket: bytes go there, not into received
        self.sink: asyncio.StreamWriter | None = None


class MemberOutgoing:
    """Several gateways may offer to make outgoing connections (each sends
    XCTL on its control connection), and members hear them in different
    orders: the primary picks the first it hears and says so in its
    ordering information; a backup uses the one the primary picked, once
    it has heard it too (its messages on it must follow the primary's)."""

    def __init__(self, replica, ep, outbox, output, primary: bool):
        self.replica, self.ep, self.outbox, self.output = replica, ep, outbox, output
        self.primary = primary
        self.control: ConnId | None = None     # the control connection in use
        self.heard: list[ConnId] = []          # control connections offered, in the order heard
        self.chosen: ConnId | None = None      # the primary's pick (backups: from its ordering information)
        self.remotes: dict[int, _Remote] = {}
        self.next_open = 1                     # the next k whose XOPEN this member generates
        self.to_open: dict[int, tuple[str, int]] = {}   # XOPENs waiting for a lower k
        self.by_cid: dict[ConnId, int] = {}
        self.stats = {"connections": 0, "failed": 0, "bytes_in": 0, "bytes_out": 0, "dropped": 0}
        self.errors: list[str] = []
        self.tasks: set[asyncio.Task] = set()
        self.udp = MemberOutgoingUdp(replica, ep, outbox, lambda: self.control, primary)

    async def run(self):
        self.replica.channel.serve_connects(self._replica_connection)
        while True:
            self.udp.watch()
            await asyncio.sleep(WATCH_S)

    def close(self):
        self.udp.close()
        for t in self.tasks:
            t.cancel()

    def _remote(self, k: int) -> _Remote:
        r = self.remotes.get(k)
        if r is None:
            r = self.remotes[k] = _Remote()
        return r

    def _drop(self, why: str):
        self.stats["dropped"] += 1
        log.warning("outgoing connection dropped: %s", why)
        self.errors.append(why)
        del self.errors[:-MAX_ERRORS]

    # -- requests from the gateway (in messaging's order) --------------------
    handles = staticmethod(is_outgoing)

    def request(self, cid: ConnId, req: tuple):
        if self.udp.handles(cid):
            return self.udp.request(cid, req)
        kind = req[0]
        if kind == payload.XCTL:
            if cid.seq != CONTROL_SEQ:
                return self._drop(f"control request on connection {tuple(cid)}")
            if cid not in self.heard:
                self.heard.append(cid)
                self._choose()
                if self.control is not None and cid != self.control:
                    log.info("gateway group %d also offers outgoing connections; the group's go through %d",
                             cid.client, self.control.client)
            return
        if kind == payload.XRESULT:
            _, k, err, host, port, lhost, lport = req
            r = self._remote(k)
            if cid.seq != FIRST_SEQ + k or r.result.done():
                return self._drop(f"result for connection {k} on {tuple(cid)}")
            self.by_cid[cid] = k
            self.stats["connections" if err == 0 else "failed"] += 1
            r.result.set_result((cid, err, host, port, (lhost, lport)))
            self._announce(k, host, port)   # a backup generates the primary's XOPEN for it
            return
        k = self.by_cid.get(cid)
        if k is None or kind not in (payload.DATA, payload.EOF):
            return self._drop(f"request {kind} on {tuple(cid)} before its result")
        r = self.remotes[k]
        if kind == payload.DATA:
            self.stats["bytes_in"] += len(req[1])
            if r.attached:
                self._to_sink(r, lambda w: w.write(req[1]))
            else:
                r.received += req[1]
        else:
            r.eof = True
            self._to_sink(r, lambda w: w.can_write_eof() and w.write_eof())
            self.output.input_ended(cid)

    def chosen_by_primary(self, cid: ConnId):
        """Backup: the primary's ordering information names its control connection."""
        self.chosen = cid
        self._choose()

    def promote(self):
        """Primary from now on: it picks a control connection if its old primary had not."""
        self.primary = True
        self._choose()
        self.udp.promote()

    def _choose(self):
        if self.control is not None:
            return
        if self.chosen is None and self.primary and self.heard:
            self.chosen = self.heard[0]
            self.ep.order(payload.control_blob(tuple(self.chosen)))
        if self.chosen is not None and self.chosen in self.heard:
            self.control = self.chosen
            self._announce()
            self.udp.flush_announcements()

    def _announce(self, k: int | None = None, host: str = "", port: int = 0):
        """XOPENs go on the control connection in the order of k, each once:
        the primary's as its replica asks, a backup's as the results come,
        so that every member generates the very same messages (messaging's
        flow control waits for the backups to have generated what the
        primary sent, and a new primary's numbering follows theirs)."""
        if k is not None and k >= self.next_open:
            self.to_open.setdefault(k, (host, port))
        while self.control is not None and self.next_open in self.to_open:
            h, p = self.to_open.pop(self.next_open)
            self.outbox.put(self.control, payload.xopen_reply(self.next_open, h, p))
            self.next_open += 1

    @staticmethod
    def _to_sink(r: _Remote, op):
        w = r.sink
        if w is None:
            return
        try:
            if not w.is_closing():
                op(w)
                return
        except (ConnectionError, OSError, RuntimeError):
            pass
        r.sink = None   # the replica closed its socket, or is gone

    # -- the replica's connections ---------------------------------------------
    async def _replica_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            raw = await reader.readexactly(CONNECT_REQUEST_SIZE)
            k, flags, _family, host, port = parse_connect_request(raw)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as e:
            self._drop(f"bad request ({e})")
            writer.close()
            return
        log.info("replica's connect %d to %s port %d%s", k, host, port, " (asks)" if flags & CONNECT_ASK else "")
        r = self._remote(k)
        if flags & CONNECT_ASK and not r.result.done():
            if self.control is None:
                self._drop(f"connection {k} to {host} port {port}: no gateway serves outgoing connections")
                writer.write(connect_reply(k, errno.ECONNREFUSED))   # nobody to connect through
                writer.close()
                return
            # A failed primary's request the gateway already had is matched by k there.
            self._announce(k, host, port)
        # A backup waits too: the primary's record can come before the result.
        cid, err, rhost, rport, local = await r.result
        if (rhost, rport) != (host, port):
            self._drop(f"connection {k} to {host} port {port} was made to {rhost} port {rport}")
            writer.close()
            return
        if flags & CONNECT_ASK:
            writer.write(connect_reply(k, err, local if err == 0 else None))
        if err:
            writer.close()
            return
        if r.received:
            writer.write(bytes(r.received))
            r.received = bytearray()
        if r.eof and writer.can_write_eof():
            writer.write_eof()
        r.sink, r.attached = writer, True
        await self._from_replica(cid, reader)

    async def _from_replica(self, cid: ConnId, reader: asyncio.StreamReader):
        """What the program writes goes out as Replies, cut like client
        output (the primary's cuts, which its backups follow)."""
        offset = 0
        try:
            while chunk := await reader.read(READ_CHUNK):
                self.output.data(cid, chunk, offset)
                offset += len(chunk)
                self.stats["bytes_out"] += len(chunk)
        except (ConnectionError, OSError):
            pass
        # A dying replica's sockets closing is no close of the program's.
        if not self.replica.dying():
            self.output.close(cid, offset)

    def summary(self) -> dict:
        return {**self.stats, **self.udp.summary(), "kept_bytes": sum(len(r.received) for r in self.remotes.values()),
                "errors": self.errors[-5:]}
