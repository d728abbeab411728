"""A replica's replies, as messages on the virtual connections to gateways.

The primary sends what its program writes as it comes, and tells its
backups (ordering information) where it cut the output into messages; a
backup cuts its own, identical, output at the same places, so that it
generates the very same messages with the same msgSeqNums (semi-active
replication: messaging logs a backup's messages and sends nothing).  That
keeps messaging's per-message bookkeeping (SecondAcks, flow control) the
same at every member, and lets a backup carry on where its primary stopped."""
from __future__ import annotations

from collections import deque

from llft.cluster import payload
from llft.messaging.ids import ConnId


class Outbox:
    """Messages waiting for messaging's flow-control window, per connection,
    in order."""

    def __init__(self, ep):
        self.ep = ep
        self.waiting: dict[ConnId, deque] = {}

    def put(self, cid: ConnId, body: bytes, order_info: bytes = b""):
        q = self.waiting.get(cid)
        if q is None and self.ep.writable(cid):
            self.ep.send(cid, body, order_info)
            return
        if q is None:
            q = self.waiting[cid] = deque()
        q.append((body, order_info))

    def writable(self, cid: ConnId):
        q = self.waiting.get(cid)
        while q and self.ep.writable(cid):
            self.ep.send(cid, *q.popleft())
        if q is not None and not q:
            del self.waiting[cid]

    def queued(self) -> int:
        return sum(len(q) for q in self.waiting.values())


class PrimaryOutput:
    def __init__(self, outbox: Outbox):
        self.outbox = outbox

    def data(self, cid: ConnId, chunk: bytes, offset: int):
        end = offset + len(chunk)
        self.outbox.put(cid, payload.data_reply(offset, chunk), payload.boundary_blob(cid, end, False))

    def close(self, cid: ConnId, total: int):
        self.outbox.put(cid, payload.close_reply(total), payload.boundary_blob(cid, total, True))


class _Produced:
    __slots__ = ("buf", "start", "closed", "cuts")

    def __init__(self):
        self.buf = bytearray()   # output not yet cut into messages, from offset start
        self.start = 0
        self.closed = False
        self.cuts: deque = deque()   # (end, closed) from the primary, in order


class BackupOutput:
    def __init__(self, outbox: Outbox):
        self.outbox = outbox
        self.conns: dict[ConnId, _Produced] = {}

    def _of(self, cid: ConnId) -> _Produced:
        p = self.conns.get(cid)
        if p is None:
            p = self.conns[cid] = _Produced()
        return p

    def data(self, cid: ConnId, chunk: bytes, offset: int):
        p = self._of(cid)
        p.buf += chunk
        self._emit(cid, p)

    def close(self, cid: ConnId, total: int):
        p = self._of(cid)
        p.closed = True
        self._emit(cid, p)

    def boundary(self, cid: ConnId, end: int, closed: bool):
        p = self._of(cid)
        p.cuts.append((end, closed))
        self._emit(cid, p)

    def _emit(self, cid: ConnId, p: _Produced):
        while p.cuts:
            end, closed = p.cuts[0]
            have = p.start + len(p.buf)
            if end > have or (closed and not p.closed):
                return  # this replica has not produced it yet
            p.cuts.popleft()
            if closed:
                self.outbox.put(cid, payload.close_reply(end))
                continue
            n = end - p.start
            self.outbox.put(cid, payload.data_reply(p.start, bytes(p.buf[:n])))
            del p.buf[:n]
            p.start = end

    def unsent(self) -> int:
        return sum(len(p.buf) for p in self.conns.values())
