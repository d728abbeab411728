"""A replica's replies, as messages on the virtual connections to gateways.

The primary sends what its program writes as it comes, and tells its
backups (ordering information) where it cut the output into messages; a
backup cuts its own, identical, output at the same places, so that it
generates the very same messages with the same msgSeqNums (semi-active
replication: messaging logs a backup's messages and sends nothing).  That
keeps messaging's per-message bookkeeping (SecondAcks, flow control) the
same at every member, and lets a backup carry on where its primary stopped."""
from __future__ import annotations

import heapq
import logging
from collections import deque

from llft.cluster import payload
from llft.ordering.ids import ConnId

log = logging.getLogger("llft.output")

OUTPUT_OF_RETIRED = "output-of-retired"   # a drop: output for a connection retired before this member joined


class Outbox:
    """Messages waiting for messaging's flow-control window, per connection,
    in order; at the primary, first for the records made before them.

    Output commit: what the primary's program wrote may depend on any record
    it made before (a lock's order, the time, which thread's connect became
    outgoing connection k).  A message leaves only once those records are in
    messaging's ordering information, so it carries them (or an earlier
    message did) to the gateway, which holds and reflects them: a new
    primary then replays them, and re-creates the very output the
    gateway already passed on."""

    def __init__(self, ep):
        self.ep = ep
        self.waiting: dict[ConnId, deque] = {}
        self.ring_head = None              # primary: the replica ring's head (a callable)
        self.pull = None                   # primary: ships the records the ring holds now (a callable)
        self.records_shipped = -1          # the ring position handed to messaging so far
        self.unshipped: deque = deque()    # (ring position, cid, body, order_info), in order

    def after_records(self, ring_head, pull=None):
        """Primary from now on: hold each message until the records its
        replica had made when it arrived (up to ring_head()) are shipped;
        pull() ships those already written at once."""
        self.ring_head, self.pull = ring_head, pull

    def shipped(self, position: int):
        """The records up to ring position `position` are in the ordering information."""
        self.records_shipped = position
        q = self.unshipped
        while q and q[0][0] <= position:
            self._put(*q.popleft()[1:])

    def put(self, cid: ConnId, body: bytes, order_info: bytes = b""):
        if self.ring_head is not None:
            mark = self.ring_head()
            if mark > self.records_shipped and not self.unshipped and self.pull is not None:
                self.pull()   # (a record reserved but not yet written still makes it wait)
            if self.unshipped or mark > self.records_shipped:
                self.unshipped.append((mark, cid, body, order_info))
                return
        self._put(cid, body, order_info)

    def _put(self, cid: ConnId, body: bytes, order_info: bytes):
        if not self.ep.has_connection(cid):
            # Retired before this member joined: its replica replays the
            # connection from the transferred input, and the gateway is done with it.
            self.ep.count_drop(OUTPUT_OF_RETIRED)
            return
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
        return sum(len(q) for q in self.waiting.values()) + len(self.unshipped)

    def generated(self, limit: int = 256) -> dict[str, int]:
        """Messages generated per connection (the lowest `limit`), numbered
        by messaging or still waiting here: once quiet, the same at every
        member (semi-active replication: a backup cuts its output where the
        primary did), retired connections' too."""
        counts = dict(self.ep.retired())   # the lowest retired ones
        counts.update((cid, self.ep.sent_count(cid) + len(self.waiting.get(cid, ())))
                      for cid in heapq.nsmallest(limit, self.ep.connections()))
        return {"%d:%d:%d" % cid: n for cid, n in sorted(counts.items())[:limit]}

    def take(self, cid: ConnId) -> list[bytes]:
        """The bodies still waiting on a connection, which no longer go out
        as they are (a primary change renumbers the connection: they follow
        the messages logged beyond what the remote group has)."""
        q = self.waiting.pop(cid, None)
        return [body for body, _order_info in q] if q else []


class _Produced:
    __slots__ = ("buf", "start", "closed", "close_sent", "input_ended", "cuts")

    def __init__(self):
        self.buf = bytearray()   # output not yet cut into messages, from offset start
        self.start = 0
        self.closed = False      # the program closed the connection
        self.close_sent = False
        self.input_ended = False  # the remote's side ended (EOF)
        self.cuts: deque = deque()   # backups: (end, closed) from the primary, in order


class ReplyStream:
    """A replica's output on every connection, cut into Reply messages: as
    it comes at the primary, where the primary cut it at a backup."""

    def __init__(self, outbox: Outbox, primary: bool):
        self.outbox = outbox
        self.primary = primary
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

    def input_ended(self, cid: ConnId):
        """The remote side ended (the client's or remote server's EOF)."""
        p = self._of(cid)
        p.input_ended = True
        self._maybe_finished(cid, p)

    def _maybe_finished(self, cid: ConnId, p: _Produced):
        # Both sides ended: messaging retires the connection once it is quiet.
        if p.input_ended and p.close_sent:
            self.outbox.ep.finish(cid)

    def adopt(self, cid: ConnId, start: int, buf: bytes, closed: bool, close_sent: bool, input_ended: bool,
              cuts: list = ()):
        """A newcomer restored from a checkpoint (checkpoint_join.py): the
        connection's output from offset start on, as far as the
        checkpoint's program had produced it, and where the primary had
        cut it from there (a backup's checkpoint: cuts it had yet to
        reach); later cuts come as ordering information."""
        p = self._of(cid)
        p.start, p.buf = start, bytearray(buf)
        p.closed, p.close_sent, p.input_ended = closed, close_sent, input_ended
        p.cuts = deque((int(end), bool(closed_at)) for end, closed_at in cuts)

    def cut_state(self, cid: ConnId) -> tuple[int, bytes, bool, bool, bool, list]:
        """adopt()'s arguments as this stream holds them."""
        p = self.conns.get(cid) or _Produced()
        return p.start, bytes(p.buf), p.closed, p.close_sent, p.input_ended, [list(c) for c in p.cuts]

    def boundary(self, cid: ConnId, end: int, closed: bool):
        p = self._of(cid)
        p.cuts.append((end, closed))
        self._emit(cid, p)

    def _send(self, cid: ConnId, p: _Produced, n: int):
        """The next n buffered bytes as one message (an empty one keeps a
        backup's numbering when it is past the primary's cut)."""
        body = payload.data_reply(p.start, bytes(p.buf[:n]))
        end = p.start + n
        del p.buf[:n]
        p.start = end
        self.outbox.put(cid, body, payload.boundary_blob(cid, end, False) if self.primary else b"")

    def _send_close(self, cid: ConnId, p: _Produced):
        p.close_sent = True
        end = p.start + len(p.buf)
        self.outbox.put(cid, payload.close_reply(end), payload.boundary_blob(cid, end, True) if self.primary else b"")
        self._maybe_finished(cid, p)

    def _emit(self, cid: ConnId, p: _Produced):
        if self.primary:
            if p.buf:
                self._send(cid, p, len(p.buf))
            if p.closed and not p.close_sent:
                self._send_close(cid, p)
            return
        while p.cuts:
            end, closed = p.cuts[0]
            have = p.start + len(p.buf)
            if end > have or (closed and not p.closed):
                return  # this replica has not produced it yet
            p.cuts.popleft()
            if closed:
                self._send_close(cid, p)
            else:
                self._send(cid, p, max(0, end - p.start))

    def rebase(self, cid: ConnId, later: list[bytes]):
        """After a primary change: messages generated beyond what the remote
        group has (`later`: those messaging logged, from its rebase, then
        those still waiting in the outbox, in order) go back into the
        buffer, to be cut again in the new view.  Every byte from the first
        of them on must be there: the buffer goes on where the last of them
        ended.  A primary cuts them where they were cut before (one message
        each, not one huge one)."""
        p = self._of(cid)
        p.cuts.clear()
        chunks, start, closed = [], None, False
        for body in later:
            try:
                kind, offset, *rest = payload.parse_reply(body)
            except payload.BadPayload:
                continue
            if kind == payload.CLOSE:
                closed = True
                continue
            if start is not None and offset != start + sum(map(len, chunks)):
                log.error("connection %s: the output logged from offset %d is not contiguous (a message at "
                          "offset %d after %d bytes)", cid, start, offset, sum(map(len, chunks)))
            start = offset if start is None else start
            chunks.append(rest[0])
        if start is not None:
            if start + sum(map(len, chunks)) != p.start:
                log.error("connection %s: the output logged goes up to offset %d, but the rest from %d", cid,
                          start + sum(map(len, chunks)), p.start)
            p.buf[0:0] = b"".join(chunks)
            p.start = start
        if closed:
            p.close_sent = False
            p.closed = True
        if self.primary:
            for chunk in chunks:
                if chunk:
                    self._send(cid, p, len(chunk))
        self._emit(cid, p)

    def promote(self):
        self.primary = True
        for cid, p in self.conns.items():
            self._emit(cid, p)


def rebase_connection(ep, outbox: Outbox, stream, cid: ConnId, base: int) -> None:
    """A new view (new primary, or a backup following it): the remote group
    has this connection's messages up to msn `base`.  What messaging logged
    beyond base, and then what was still waiting in the outbox for
    messaging's window (a backup's window frees only as the remote group
    acknowledges the primary's messages, so under heavy output it may hold
    megabytes), go back to the stream (a ReplyStream or MemberDatagrams),
    in that order, to be sent again: the waiting part too, or the output
    from there on would be lost."""
    logged = ep.rebase(cid, base)
    waiting = outbox.take(cid)
    if logged or waiting:
        log.info("connection %s: after msn %d, %d logged and %d waiting messages go out again", cid, base,
                 len(logged), len(waiting))
    stream.rebase(cid, logged + waiting)
