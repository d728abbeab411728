"""Periodic processing (Fig. 6 lines 44-59): retransmission, FirstAck,
Nacks, KeepAlive, Heartbeat, buffer freeing, reassembly expiry."""
from __future__ import annotations

from llft.ordering.llmp.wire import MsgType


class PeriodicMixin:
    def _tick(self) -> None:
        if self.closed:
            return
        now = self.clock.now()
        cfg = self.config
        primary = self.is_primary
        # Every connection, every tick: an idle one costs only the tests below
        # (a gateway may hold hundreds of idle client connections).
        for c in self.conns.values():
            tx, rx = c.tx, c.rx
            if primary:
                if tx.remote_ack < tx.msg_seq_count:
                    for e in tx.due(now, cfg.retransmit_burst):       # lines 44-46
                        self.counters["retransmit_timeouts"] += 1
                        self._retransmit(c, e, now)
                if rx.received_upto > c.ack_sent or c.first_ack:
                    self._tick_first_ack(c, now)                       # lines 47-48
            if rx.nacks and now - c.last_nack >= cfg.nack_interval:    # lines 49-52
                msns = rx.due_nacks(now, cfg.nack_delay, cfg.nack_batch)
                if msns:
                    self._send_nack(c, msns, now)
            if primary:
                if now - c.last_tx >= c.keepalive_every:               # lines 54-55
                    self._keepalive(c)
                if rx.delivered:
                    rx.gc(self._group_wm(c))                           # lines 82-84
        if self.lingering:
            self._expire_lingering(now)
        if now - self._last_hb >= cfg.heartbeat:                       # lines 56-59
            self._last_hb = now
            self._send_heartbeat(now)
        elif cfg.liveness and now - self._last_intra_tx >= cfg.liveness:
            self._transmit(self._intra(MsgType.HEARTBEAT, body=None))  # only says "alive"
        self.codec.reassembler.expire(now)
        self._retire_finished(now)
        self._timer = self.clock.call_later(cfg.tick, self._tick)

    def _keepalive(self, c) -> None:
        """A KeepAlive that says nothing new (the same acknowledgments and
        watermark) doubles the wait before the next, up to keepalive_max: an
        idle connection costs next to nothing, where Fig. 6's fixed period
        made a few hundred idle connections swamp a primary.  Any change goes
        out at the base period again."""
        cfg = self.config
        msg = self._header(MsgType.KEEP_ALIVE, c)
        # The watermark moves on with every control message either side
        # sends; past the remote's last application message that is no news.
        # Nor is ordering information: it rides on every connection's control
        # messages, and with some connections busy it is new all the time;
        # one carrier is enough (an application message, or the Heartbeats
        # to our backups), and an idle connection's next KeepAlive takes it.
        said = (msg.ack, min(msg.back, c.rx.app_rw), msg.last_msn, msg.ack_pvn)
        if said == c.keepalive_said:
            c.keepalive_every = min(c.keepalive_every * 2, cfg.keepalive_max)
        else:
            c.keepalive_every = cfg.keepalive
        c.keepalive_said = said
        self._transmit(msg)

    def _tick_first_ack(self, c, now: float) -> None:
        cfg = self.config
        if c.rx.received_upto > c.ack_sent:
            if c.ack_due_since is None:
                c.ack_due_since = now
                return
            if now - c.ack_due_since < cfg.ack_delay:
                return
        elif not (c.first_ack and now - c.first_ack_tx >= cfg.first_ack_interval):
            return
        self._transmit(self._header(MsgType.FIRST_ACK, c))
        c.first_ack, c.first_ack_tx, c.ack_due_since = c.ack_sent, now, None
