"""GroupEndpoint: one replica's end of the Low Latency Messaging Protocol.

The upper interface the rest of llft uses:

    ep = GroupEndpoint(view, member_id, clock, transport, keyring)
    conn = ep.connect(server_group, conn_seq)      # client side; servers accept implicitly
    if ep.writable(conn): ep.send(conn, payload, order_info=b"...")
    ep.recv() -> (conn, payload) | None            # or ep.on_deliver = fn(conn, payload)
    ep.recv_order() -> [blob, ...]                 # backups: the primary's ordering info, in order
    ep.events / ep.on_event(name, info)            # connection, reset-and-rejoin, remote-primary-changed, ...
    ep.finish(conn)                                # the application ended it both ways: retired once quiet
    ep.stats() -> dict                             # counts, drops by reason, buffer sizes

The protocol itself is split by concern: inbound.py (messages from the remote
group, Fig. 6 lines 18-33, 60-75), intragroup.py (Heartbeats, backup Nacks,
precedence, watermarks), periodic.py (lines 44-59).
"""
from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable

from llft.ordering.llmp import wire
from llft.ordering.llmp.messaging.clock import Clock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.connection import Connection
from llft.ordering.llmp.messaging.fragments import Codec
from llft.ordering.llmp.messaging.handover import HandoverMixin
from llft.ordering.group import Connections
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.inbound import InboundMixin
from llft.ordering.llmp.messaging.intragroup import GAP_BUCKETS_MS, IntraGroupMixin
from llft.ordering.llmp.messaging.lineage import Lineage
from llft.ordering.llmp.messaging.ordering import OrderLog, OrderSequencer, Reflector, RemoteOrder
from llft.ordering.llmp.messaging.periodic import PeriodicMixin
from llft.ordering.llmp.messaging.retire import RETIRED_DROP, RetireMixin, Tombstones
from llft.ordering.llmp.messaging.sendside import SentEntry
from llft.ordering.llmp.wire import MsgType, Piggyback, Role


class WindowFull(BlockingIOError):
    """send() on a connection whose flow-control window is closed; wait for
    `on_writable` (or poll `writable`)."""


class GroupEndpoint(InboundMixin, IntraGroupMixin, PeriodicMixin, RetireMixin, HandoverMixin, Connections):
    MAX_CONNECTIONS = 4096

    def __init__(self, view: View, member: int, clock: Clock, transport, keyring,
                 config: Config | None = None, *, extra_groups=()):
        self.lineage = Lineage()         # the views this member has been in (lineage.py)
        self.view = view
        self.group = view.group
        self.me = member
        self.clock = clock
        self.transport = transport       # .send_group(group_id, [datagram, ...])
        self.config = config or Config()
        self.codec = Codec(keyring, {self.group, *extra_groups}, self.config)
        self.drops = self.codec.drops
        self.conns: dict[ConnId, Connection] = {}
        self.finishing: dict[ConnId, list[float]] = {}   # ended by the application: retired once quiet (retire.py)
        self.tombstones = Tombstones()
        self.retired_sent: dict[ConnId, int] = {}    # the lowest retired connections' final msgSeqCounts
        self.orphans: dict[int, Reflector] = {}     # remote group -> retired connections' unacknowledged reflections
        self._last_retire_check = -1.0
        self.lamport = 0                 # myTimestamp
        self.order_log = OrderLog()
        self.sequencer = OrderSequencer()   # backups: ordering info received
        self.reflected = OrderSequencer()   # primary: own entries seen reflected back
        self.remote_views: dict[int, tuple[int, int]] = {}   # group -> (pvn, precedence)
        self.remote_anchor: dict[int, tuple[int, int]] = {}  # group -> the view whose replies came last (lineage.py)
        self.view_answers: dict[int, tuple] = {}   # group -> (its new view, our encoded answer, next repeat) (viewchange.py)
        self.remote_order: dict[int, RemoteOrder] = {}      # group -> its primary's ordering information held
        self._held_back: dict[int, set[Connection]] = {}    # group -> connections waiting for some of it
        self.backup_reports: dict[int, dict] = {}            # backup -> last heartbeat report
        self.lingering: dict[int, tuple[dict, float]] = {}   # removed backup -> (last report, until): forget_backups
        self.last_heard: dict[int, float] = {}               # member -> when its last intra-group message came
        self.sender_addr = None                              # the address of the datagram being received
        self.remote_heard: dict[int, float] = {}             # remote group -> when its last message came
        self.heard_gaps: dict[int, list[int]] = {}           # member -> silences of >= 10, 20, 30, 50, 100, 200 ms
        self.primary_gwm: dict[ConnId, int] = {}             # backups: group watermarks from the primary
        self.competitors: set[tuple[int, int, int]] = set()
        self.counters: Counter = Counter()
        self._ready: deque[Connection] = deque()             # one entry per deliverable message
        self._order_out: deque[bytes] = deque()
        self.events: deque[tuple[str, dict]] = deque(maxlen=1000)
        self.on_deliver: Callable[[ConnId, bytes], None] | None = None
        self.on_order: Callable[[int, bytes], None] | None = None   # (oseq, blob)
        self.on_order_added: Callable[[int, bytes], None] | None = None   # primary: (oseq, blob) of each entry
        self.on_event: Callable[[str, dict], None] | None = None
        self.on_writable: Callable[[ConnId], None] | None = None
        self.on_ready: Callable[[], None] | None = None       # recv() has something
        self.on_long_silence: Callable[[int, float], None] | None = None   # (member, seconds): it spoke after >= 10 ms
        self._last_hb = -1.0
        self._hb_seq = -1                # Heartbeats sent in this view; the first lists every connection (intragroup.py)
        self._hb_view: tuple | None = None
        self._hb_last: dict[ConnId, tuple] = {}   # connection -> (its last row's values, the Heartbeat they changed in)
        self._fallback_at = float("-inf")   # primary: when its Heartbeats last sent ordering entries from the start
        self._fallback_upto = 0             # ...and the last entry they sent since (intragroup.py)
        self._last_intra_tx = -1.0
        self._timer = None
        self.closed = False

    # --- role ---------------------------------------------------------------

    @property
    def view(self) -> View:
        return self._view

    @view.setter
    def view(self, view: View) -> None:
        self._view = view
        self.lineage.note(view.pvn, view.primary_precedence)

    @property
    def is_primary(self) -> bool:
        return self.view.primary == self.me

    @property
    def only_primary(self) -> bool:
        return self.is_primary and not self.view.backups()

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> "GroupEndpoint":
        self._timer = self.clock.call_later(0, self._tick)
        return self

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()

    # --- upper interface ----------------------------------------------------

    def connect(self, server_group: int, conn_seq: int) -> ConnId:
        if server_group == self.group:
            raise ValueError("a group does not open a connection to itself")
        cid = ConnId(self.group, server_group, conn_seq)
        self._conn(cid)
        return cid

    def count_drop(self, reason: str) -> None:
        self.drops.count(reason)

    def connections(self) -> list[ConnId]:
        return list(self.conns)

    def writable(self, cid: ConnId) -> bool:
        """May send() be called now?  If not, `on_writable(conn)` follows
        once flow control lets it."""
        c = self.conns[cid]
        cfg, tx = self.config, c.tx
        flying, flying_bytes = tx.in_flight()
        ok = flying < cfg.send_window and not c.throttle_msn \
            and (not flying or flying_bytes < cfg.send_window_bytes) \
            and tx.acked_count < cfg.kept_window and tx.acked_bytes < cfg.kept_window_bytes
        if not ok:
            c.blocked = True
        return ok

    def send(self, cid: ConnId, payload: bytes, order_info: bytes = b"") -> int:
        """Send an application message (Fig. 6 lines 1-17); returns its msn.

        The primary multicasts it to the remote group; a backup only logs it
        (semi-active replication).  `order_info` is appended to this group's
        ordering information before the message is built, so it rides on it.
        """
        c = self.conns[cid]
        if not self.writable(cid):
            raise WindowFull(cid)
        if order_info and self.is_primary:
            self.add_order_info(order_info)
        msn = c.tx.next_msn()
        now = self.clock.now()
        self.counters["app_sent"] += 1
        if not self.is_primary:
            if msn >= c.tx.log_from:
                c.tx.append(SentEntry(msn, 0, payload, now))
            return msn
        mtype = self._app_type(c)
        msg = self._header(mtype, c, msn=msn, payload=payload, reliable=True)
        data = wire.encode_message(msg)
        c.first_ack = 0  # the ack now rides on a reliable message
        c.tx.append(SentEntry(msn, msg.timestamp, data, now))
        self._transmit_data(c.remote, data, mtype)
        return msn

    def add_order_info(self, blob: bytes) -> int:
        """Primary: queue ordering information not tied to a message (it
        rides on the next message, KeepAlive or Heartbeat).  Every entry,
        this one or one that `send` adds, goes to on_order_added too."""
        oseq = self.order_log.add(bytes(blob), self.clock.now(), keep=bool(self.view.backups() or self.lingering))
        if self.on_order_added is not None:
            self.on_order_added(oseq, blob)
        return oseq

    def send_membership(self, mtype: MsgType, body: Any) -> bytes:
        """A Fig. 7 message on the intra-group connection (unreliable: the
        membership protocol retransmits until acknowledged).  Returns the
        encoded message, for `resend`: a large message repeated byte for
        byte is reassembled from the fragments of all its transmissions."""
        data = wire.encode_message(self._intra(mtype, body=body))
        self._transmit_data(self.group, data, mtype)
        return data

    def resend(self, data: bytes, mtype: MsgType) -> None:
        self._transmit_data(self.group, data, mtype)

    def heartbeat_now(self) -> None:
        """A full Heartbeat at once (e.g. a backup's last report before it leaves)."""
        self._send_heartbeat(self.clock.now(), full=True)

    def recv(self) -> tuple[ConnId, bytes] | None:
        """Next message in msgSeqNum order on its connection, or None."""
        if not self._ready:
            return None
        c = self._ready.popleft()
        e = c.rx.take()
        self.counters["delivered"] += 1
        return c.id, e.msg.payload

    def pending(self) -> int:
        return len(self._ready)

    def recv_order(self) -> list[bytes]:
        out = list(self._order_out)
        self._order_out.clear()
        return out

    # --- internals shared by the mixins --------------------------------------

    def _conn(self, cid: ConnId) -> Connection | None:
        c = self.conns.get(cid)
        if c is None:
            if cid in self.tombstones:
                self.drops.count(RETIRED_DROP)
                return None
            if len(self.conns) >= self.MAX_CONNECTIONS:
                self.drops.count("too-many-connections")
                return None
            c = self.conns[cid] = Connection(cid, self.group, self.config, self.clock.now())
            if cid.client != self.group:
                self._event("connection", conn=cid)
        return c

    def _stamp(self) -> int:
        self.lamport += 1
        return self.lamport

    def _app_type(self, c: Connection) -> MsgType:
        return MsgType.REQUEST if c.role == Role.CLIENT else MsgType.REPLY

    def _header(self, mtype: MsgType, c: Connection, ack: int | None = None,
                reliable: bool = False, **kw: Any) -> wire.Message:
        """A message on connection c with the header of Fig. 6 lines 9-14
        (`reliable`: an application message, retransmitted until acked)."""
        cfg = self.config
        pb = None
        if self.is_primary:
            budget, log = cfg.order_budget, self.order_log
            seen = self.reflected.upto
            if reliable:
                of, own = log.for_message(budget)
                rf, refl = c.reflector.for_message(budget)
            else:
                of, own = log.for_control(seen, budget)
                rf, refl = c.reflector.for_control(budget)
            # The remote group reflects our entries until every backup holds
            # them, not just until we saw them back: a reflection we saw on a
            # FirstAck that a backup missed was then gone from the remote (its
            # next application message no longer carried it), and a new
            # primary taking over could lack entries a client's output
            # already depended on (docs/messaging.md, "Ordering information").
            pb = Piggyback(of, own, rf, refl, log.confirmed, log.next_oseq - 1 if reliable else 0)
        rv = self.remote_views.get(c.remote, (0, 0))
        if ack is None:
            ack = c.rx.received_upto
            if self.is_primary and ack > c.ack_sent:
                c.ack_sent, c.ack_due_since = ack, None
        c.last_tx = self.clock.now()
        if reliable:
            c.keepalive_every = cfg.keepalive   # busy again: KeepAlives at the base period when it idles
        return wire.make(
            mtype, src_group=self.group, dst_group=c.remote, conn_seq=c.id.seq, role=int(c.role),
            sender=self.me, pvn=self.view.pvn, precedence=self.view.primary_precedence,
            ack_pvn=rv[0], ack=ack, back=self._group_wm(c), timestamp=self._stamp(),
            last_msn=c.tx.msg_seq_count, piggyback=pb, **kw)

    def _intra(self, mtype: MsgType, **kw: Any) -> wire.Message:
        return wire.make(
            mtype, src_group=self.group, dst_group=self.group, role=int(Role.INTRA),
            sender=self.me, pvn=self.view.pvn, precedence=self.view.primary_precedence,
            timestamp=self._stamp(), **kw)

    def _transmit(self, msg: wire.Message) -> None:
        self._transmit_data(msg.dst_group, wire.encode_message(msg), msg.TYPE)

    def _transmit_data(self, group: int, data: bytes, mtype: MsgType) -> None:
        self.counters[f"tx_{mtype.name.lower()}"] += 1
        if group == self.group:
            self._last_intra_tx = self.clock.now()
        self.transport.send_group(group, self.codec.split(group, data))

    def _event(self, name: str, **info: Any) -> None:
        self.events.append((name, info))
        self.counters[f"event_{name}"] += 1
        if self.on_event is not None:
            self.on_event(name, info)

    def _deliverable(self, c: Connection) -> None:
        """Queue messages that became in-order deliverable (line 53), once
        the ordering information they need is here (output commit)."""
        order = self.remote_order.get(c.remote)
        n = c.rx.release(order.upto if order is not None else 0)
        if c.rx.held_back():
            self._held_back.setdefault(c.remote, set()).add(c)
        for _ in range(n):
            if self.on_deliver is not None:
                e = c.rx.take()
                self.counters["delivered"] += 1
                self.on_deliver(c.id, e.msg.payload)
            else:
                self._ready.append(c)
        if self._ready and self.on_ready is not None:
            self.on_ready()

    def _order_delivered(self, blobs: list[bytes]) -> None:
        """blobs: what the sequencer just released, in order, up to its upto."""
        first = self.sequencer.upto - len(blobs) + 1
        for i, b in enumerate(blobs):
            self.counters["order_delivered"] += 1
            if self.on_order is not None:
                self.on_order(first + i, b)
            else:
                self._order_out.append(b)

    def _maybe_writable(self, c: Connection) -> None:
        if c.blocked and self.writable(c.id):
            c.blocked = False
            if self.on_writable is not None:
                self.on_writable(c.id)

    # --- observation --------------------------------------------------------

    def buffers(self) -> dict[str, int]:
        """Sizes of every buffer; all zero once traffic has stopped and drained."""
        cs = self.conns.values()
        return {
            "sent": sum(len(c.tx.sent) for c in cs),
            "sent_bytes": sum(c.tx.sent_bytes for c in cs),
            "in_flight": sum(c.tx.in_flight()[0] for c in cs),
            "in_flight_bytes": sum(c.tx.in_flight()[1] for c in cs),
            "received": sum(len(c.rx.received) for c in cs),
            "delivered": sum(len(c.rx.delivered) for c in cs),
            "nack": sum(len(c.rx.nacks) for c in cs),
            "ready": len(self._ready),
            "order_log": len(self.order_log.entries),
            "reflect": sum(len(c.reflector.entries) for c in cs),
            "order_pending": len(self.sequencer.pending) + len(self._order_out),
            "reassembly": len(self.codec.reassembler),
        }

    def stats(self) -> dict:
        wms = [c.rx.rw for c in self.conns.values()]
        return {
            "group": self.group, "member": self.me, "primary": self.is_primary,
            "pvn": self.view.pvn, "connections": len(self.conns), "finishing": self.finishing_busy(),
            "retired": len(self.tombstones),
            "myTimestamp": self.lamport,
            "myTimestampWatermark": min(wms) if wms else self.lamport,
            "counters": dict(self.counters), "drops": self.drops.snapshot(),
            "heard_gaps_ms": {"buckets": list(GAP_BUCKETS_MS), **{str(m): g for m, g in self.heard_gaps.items()}},
            "buffers": self.buffers(),
        }
