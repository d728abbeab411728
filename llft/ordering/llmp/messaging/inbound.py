"""Receiving: datagrams in, and messages from the remote group of a
connection (Fig. 6 lines 18-33 and 60-75)."""
from __future__ import annotations

from llft.ordering.llmp import wire
from llft.ordering.llmp.messaging.connection import Connection
from llft.ordering.llmp.messaging.ids import conn_of
from llft.ordering.llmp.messaging.lineage import parse_lineage
from llft.ordering.llmp.messaging.ordering import RemoteOrder
from llft.ordering.llmp.messaging.recvside import RecvEntry
from llft.ordering.llmp.messaging.viewchange import refuse_new_primary_view
from llft.ordering.llmp.wire import APPLICATION_TYPES, DropError, DropReason, MsgType

# Sent only by a primary; their timestamps and last_msn describe the
# primary's stream.  (A SecondAck may come from a backup.)
_FROM_PRIMARY = APPLICATION_TYPES | {MsgType.FIRST_ACK, MsgType.KEEP_ALIVE, MsgType.NACK}


class InboundMixin:
    def datagram_received(self, datagram: bytes, addr=None) -> None:
        """The receive loop's only entry point: never raises on bad input."""
        if self.closed:
            return
        self.counters["rx_bytes"] += len(datagram)
        self.sender_addr = addr   # (a membership message's handler may answer the sender's host)
        r = self.codec.decode(datagram, self.clock.now())
        if r is None:
            return
        msg, data = r
        try:
            if msg.src_group == self.group:
                self._on_intra(msg, data)
            else:
                self._on_remote(msg, data)
        except DropError as e:
            self.drops.count(e.reason)

    def _on_remote(self, msg: wire.Message, data: bytes) -> None:
        t = msg.TYPE
        self.counters[f"rx_{t.name.lower()}"] += 1
        self.remote_heard[msg.src_group] = self.clock.now()   # alive, whatever view it names
        if not self._check_remote_view(msg):
            return
        if msg.timestamp > self.lamport:
            self.lamport = msg.timestamp
        if t not in _FROM_PRIMARY and t != MsgType.SECOND_ACK:
            self._event("membership-message", msg=msg)   # Fig. 7: later issue
            return
        c = self._conn(conn_of(msg))
        if c is None:
            return
        if t == MsgType.SECOND_ACK:
            self._on_second_ack(c, msg)
            return
        if t in APPLICATION_TYPES:
            if msg.msn == 0:
                raise DropError(DropReason.MALFORMED, "application message without msn")
            self.remote_anchor[msg.src_group] = (msg.pvn, msg.precedence)   # its replies came (lineage.py)
            self._on_application(c, msg, data)
        self._on_primary_header(c, msg)
        if t == MsgType.FIRST_ACK:
            self._on_first_ack(c, msg)
        elif t == MsgType.NACK and self.is_primary:
            _, msns = wire.parse_nack_body(msg.body)
            self._retransmit_sent(c, msns)
        self._deliverable(c)

    def _check_remote_view(self, msg: wire.Message) -> bool:
        """Track the remote group's primary view (pvn, then precedence); drop
        messages of an older one."""
        g = msg.src_group
        cur = self.remote_views.get(g)
        new = (msg.pvn, msg.precedence)
        if cur is None:
            self.remote_views[g] = self.remote_anchor[g] = new
        elif msg.TYPE == MsgType.NEW_PRIMARY_VIEW and new > cur \
                and (anchor := self.remote_anchor.get(g, cur)) not in parse_lineage(msg.body):
            # A primary whose view does not descend from the one whose
            # replies came last: its clients saw what it never knew of.
            refuse_new_primary_view(self, msg, anchor)
            self.drops.count("competing-view")
            return False
        elif new < cur:
            # An older view, or a primary of the same view that a primary of
            # higher precedence supersedes (two members that could not hear
            # each other each took over): one primary's messages only.
            self.drops.count("stale-view")
            return False
        elif new > cur:
            self.remote_views[g] = new
            self._event("remote-primary-changed", group=g, pvn=msg.pvn, precedence=msg.precedence)
        order = self.remote_order.get(g)
        if order is None:
            order = self.remote_order[g] = RemoteOrder()
        if order.view(msg.pvn) and cur is not None:
            self._drop_held_back(g)
        return True

    def _drop_held_back(self, g: int) -> None:
        """The remote group has a new primary: what the old one sent that
        still waited for ordering information no member may have is dropped,
        as what came after a gap is (the new primary sends it again, made
        from the ordering information it has)."""
        for c in self._held_back.pop(g, ()):
            self._flush_old_view(c)

    def _flush_old_view(self, c: Connection) -> None:
        """Drops what c's remote group's old primary sent after the last
        message released here (Fig. 9 line 38).  What was dropped may have
        been acknowledged already: the new primary sends it again, and that
        needs acknowledging anew."""
        self.counters["flushed_after_view_change"] += c.rx.flush_after_upto()
        c.ack_sent = min(c.ack_sent, c.rx.received_upto)

    def _on_application(self, c: Connection, msg: wire.Message, data: bytes) -> None:
        """Lines 21-33: received list, placeholders, nack list."""
        c.keepalive_every = self.config.keepalive   # (periodic.py: KeepAlives back off while idle)
        outcome = c.rx.receive(RecvEntry(msg.msn, msg.timestamp, data, msg), self.clock.now())
        if outcome == "duplicate":
            self.counters["duplicates_discarded"] += 1
        elif outcome == "window":
            self.counters["flow_window_drops"] += 1
            self.codec.forget(data)  # we will want its fragments again

    def _on_primary_header(self, c: Connection, msg: wire.Message) -> None:
        """ack, back, last_msn and piggybacked ordering information of a
        message from the remote primary."""
        acked = c.tx.on_ack(msg.ack, msg.timestamp, self.clock.now())
        if c.tx.on_back(msg.back) or acked:
            self._maybe_writable(c)
        c.rx.note_control(msg.last_msn, msg.timestamp, self.clock.now())
        pb = msg.piggyback
        if pb is None:
            return
        order = self.remote_order[msg.src_group]
        if order.add(pb.own_first, len(pb.own), pb.refl_ack):
            self._release_held_back(msg.src_group, c)
        if self.is_primary:
            c.reflector.add(pb.own_first, pb.own)
            c.reflector.ack(pb.refl_ack)
            if self.orphans:
                self._orphans_acked(c.remote, pb.refl_ack)
            if pb.refl:
                self.reflected.skip_to(self.order_log.confirmed)
                self.reflected.add(pb.refl_first, [b""] * len(pb.refl))
        elif pb.refl:
            self._order_delivered(self.sequencer.add(pb.refl_first, pb.refl))

    def _release_held_back(self, g: int, this: Connection) -> None:
        """More of group g's ordering information is here: the messages of
        its other connections that waited for it may go on (`this` one's
        follow in _on_remote)."""
        waiting = self._held_back.get(g)
        if not waiting:
            return
        for c in list(waiting):
            waiting.discard(c)
            if c is not this and self.conns.get(c.id) is c:
                self._deliverable(c)

    def _on_first_ack(self, c: Connection, msg: wire.Message) -> None:
        """Lines 60-68."""
        k = msg.ack
        if k == 0:
            return
        if self.is_primary and k == c.tx.msg_seq_count:
            # Counted per connection, not on the sent-list entry: the entry
            # may already be freed by the watermark while backups lag.
            c.acked_msn, c.acked_count = k, (c.acked_count + 1 if c.acked_msn == k else 1)
            if c.acked_count > self.config.max_ack and self.view.backups() and not c.throttle_msn:
                c.throttle_msn = k              # line 66: let the backups catch up
                self.counters["flow_throttled"] += 1
                self._event("throttle", conn=c.id, msn=k)
        if (not self.is_primary and c.tx.msg_seq_count >= k) or self.only_primary:
            # A SecondAck names the message its FirstAck acknowledged.
            self._transmit(self._header(MsgType.SECOND_ACK, c, ack=k))

    def _on_second_ack(self, c: Connection, msg: wire.Message) -> None:
        """Lines 69-72."""
        if self.is_primary:
            if c.first_ack and msg.ack >= c.first_ack:
                c.first_ack = 0                      # line 71
        elif msg.ack > c.rx.highest:
            c.rx.learn_highest(msg.ack, self.clock.now())  # line 72: a message we never saw

    def _retransmit_sent(self, c: Connection, msns) -> None:
        """Lines 73-75 for the sender: retransmit from the sent list."""
        now = self.clock.now()
        for m in msns[: self.config.nack_batch]:
            e = c.tx.sent.get(m)
            if e is None:
                self.counters["nacked_not_held"] += 1   # freed already: the group had it, by its watermark
            elif not c.tx.recently_sent(e, now):
                self.counters["retransmit_nacked"] += 1
                self._retransmit(c, e, now)

    def _retransmit(self, c: Connection, e, now: float) -> None:
        c.tx.retransmitted(e, now)
        self.counters["retransmissions"] += 1
        self._transmit_data(c.remote, e.data, self._app_type(c))
