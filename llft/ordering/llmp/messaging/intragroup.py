"""The intra-group connection: Heartbeats carrying watermarks and order
progress (lines 56-59), backup Nacks answered by the primary (lines 51-52,
73-75), the precedence check (lines 18-20), and the group watermarks used to
free buffers (lines 76-84).

Watermarks are kept per connection: a member's report for connection X is
the timestamp below which it holds every message of X, and the group
watermark of X is the minimum over the members.  The paper's single
myTimestampWatermark/myGroupWatermark is the minimum of these over all
connections (still reported in stats); per-connection values free exactly the
same messages when every member knows every connection, and stay safe when a
member has not yet heard of a new connection (it reports nothing for it, so
the group watermark of that connection stays 0)."""
from __future__ import annotations

from llft.ordering.llmp import wire
from llft.ordering.ids import ConnId
from llft.ordering.llmp.wire import MsgType

GAP_BUCKETS_MS = (10, 20, 30, 50, 100, 200)
# A Heartbeat lists the connections whose row changed in the last
# HEARTBEAT_REPEAT Heartbeats (a lost one is made good by the next), and
# every connection once in HEARTBEAT_FULL_EVERY: listing hundreds of idle
# connections 50 times a second, and reading the backups' lists, was most of
# an idle primary's work (300 idle connections across hosts: its controller
# at 31 % of a CPU, 25 % now).  A receiver merges a partial list into
# what it has and replaces it with a full one; a value it missed is one
# that is too low for a while, which only holds buffers and flow control
# back (watermarks and counts only grow within a view).
HEARTBEAT_REPEAT = 3
HEARTBEAT_FULL_EVERY = 25
# Ordering entries no message carried go to the backups on the primary's
# Heartbeats (the fallback): up to ORDER_BURST runs of order_budget bytes a
# Heartbeat, each run sent once until order_fallback has passed, then again
# from what the backups report holding.  One run a Heartbeat (8 KiB per 20
# ms) shipped a 100 MiB redis POPULATE's 5 MiB of records to its backup
# across hosts in 19.7 s, and its reply waited for them.
ORDER_BURST = 32


class IntraGroupMixin:
    def _on_intra(self, msg: wire.Message, data: bytes) -> None:
        if msg.sender == self.me:
            return  # our own multicast looped back
        now = self.clock.now()
        gap = now - self.last_heard.get(msg.sender, now)
        if gap >= GAP_BUCKETS_MS[0] / 1000:           # how close silences come to the fault timeouts
            counts = self.heard_gaps.setdefault(msg.sender, [0] * len(GAP_BUCKETS_MS))
            for i, ms in enumerate(GAP_BUCKETS_MS):
                if gap >= ms / 1000:
                    counts[i] += 1
            if self.on_long_silence is not None:
                self.on_long_silence(msg.sender, gap)
        self.last_heard[msg.sender] = now   # the membership's fault detector reads it
        self.counters[f"rx_{msg.TYPE.name.lower()}"] += 1
        if msg.timestamp > self.lamport:
            self.lamport = msg.timestamp
        if msg.pvn >= self.view.pvn and msg.precedence > self.view.primary_precedence:
            self._competing_primary(msg, data)
            return
        t = msg.TYPE
        if t not in (MsgType.HEARTBEAT, MsgType.NACK):
            # Fig. 7 traffic, e.g. a ProposeBackup from a process that is
            # not a member yet: the membership protocol's business.
            self._event("membership-message", msg=msg, addr=self.sender_addr)
            # Its sender repeats it until acknowledged; if our acknowledgment
            # was lost, the next copy must reach the handler again (one that
            # came in fragments would be ignored as already reassembled).
            self.codec.forget(data)
            return
        if msg.sender not in self.view:
            self.drops.count("not-a-member")
            self._event("not-a-member", sender=msg.sender, pvn=msg.pvn)
            return
        if t == MsgType.HEARTBEAT and msg.body is None:
            return   # a liveness Heartbeat: last_heard is all it is for
        if t == MsgType.HEARTBEAT:
            if self.is_primary:
                self._backup_heartbeat(msg)
            elif msg.sender == self.view.primary and isinstance(msg.body, dict) and "gwm" in msg.body:
                self._primary_heartbeat(msg)   # (not a primary-elect's last backup Heartbeats)
        elif self.is_primary:
            self._answer_backup_nack(msg)

    def _competing_primary(self, msg: wire.Message, data: bytes) -> None:
        """Lines 18-20: make sure every member saw it, then reset and rejoin
        (the rejoin is the membership protocol's; we surface it)."""
        key = (msg.pvn, msg.precedence, msg.sender)
        if key in self.competitors:
            return
        self.competitors.add(key)
        self.counters["remulticast_competing"] += 1
        self.transport.send_group(self.group, self.codec.split(self.group, data))
        self._event("reset-and-rejoin", pvn=msg.pvn, precedence=msg.precedence, sender=msg.sender)

    # --- watermarks ------------------------------------------------------------

    def _group_wm(self, c, reports: list[dict] | None = None) -> int:
        """Primary: myGroupWatermark of this connection; backup: its own.
        (`reports`: _backups_rw(), for a loop over every connection.)"""
        wm = c.rx.rw
        if self.is_primary:
            for rw in self._backups_rw() if reports is None else reports:
                wm = min(wm, rw.get(c.id, 0))
        return wm

    def _backups_rw(self) -> list[dict]:
        """Primary: each backup's last reported watermarks (empty: none yet),
        lingering ones' included (forget_backups)."""
        return [self.backup_reports.get(b, {}).get("rw", {}) for b in self.view.backups()] + \
            [report.get("rw", {}) for report, _until in self.lingering.values()]

    # --- heartbeats ------------------------------------------------------------

    def _send_heartbeat(self, now: float, full: bool = False) -> None:
        self._hb_seq += 1
        # A new view (a new primary, a member more or less): its members
        # start from full lists, each in the shape of its role.
        view = (self.view.pvn, tuple(self.view.precedences))
        if view != self._hb_view:
            self._hb_view, self._hb_seq, self._hb_last = view, 0, {}
        full = full or self._hb_seq % HEARTBEAT_FULL_EVERY == 0
        if self.is_primary:
            reports = self._backups_rw()
            rows, back = self._heartbeat_rows(((cid, (self._group_wm(c, reports), c.rx.received_upto))
                                               for cid, c in self.conns.items()), full)
            runs = self._fallback_runs(now)
            of, blobs = runs[0] if runs else (0, [])
            body = {"gwm": rows, "of": of, "ord": blobs}
            if blobs:
                # A Heartbeat with ordering information may take several
                # datagrams, and is lost if any is: the backups' fault
                # detectors also get a small one, lost only on its own.
                self._transmit(self._intra(MsgType.HEARTBEAT, back=back, body={"gwm": rows}))
            for of_more, more in runs[1:]:
                self._transmit(self._intra(MsgType.HEARTBEAT, back=back, body={"gwm": [], "of": of_more,
                                                                                "ord": more}))
        else:
            rows, back = self._heartbeat_rows(((cid, (c.rx.rw, c.tx.msg_seq_count))
                                               for cid, c in self.conns.items()), full)
            body = {"rw": rows, "oupto": self.sequencer.upto}
        if full:
            body["full"] = 1
        self._transmit(self._intra(MsgType.HEARTBEAT, back=back, body=body))

    def _heartbeat_rows(self, values, full: bool) -> tuple[list[list[int]], int]:
        """(rows to list, the lowest first value of all: the header's back)."""
        seq, last, rows, back = self._hb_seq, self._hb_last, [], None
        kept = {} if full else None   # a full list forgets retired connections
        for cid, vals in values:
            old = last.get(cid)
            if old is None or old[0] != vals:
                last[cid] = old = (vals, seq)
            if full or seq - old[1] < HEARTBEAT_REPEAT:
                rows.append([*cid, *vals])
            if kept is not None:
                kept[cid] = old
            if back is None or vals[0] < back:
                back = vals[0]
        if kept is not None:
            self._hb_last = kept
        return rows, self.lamport if back is None else back

    def _fallback_runs(self, now: float) -> list[tuple[int, list[bytes]]]:
        """Primary: the fallback's runs for this Heartbeat (ORDER_BURST)."""
        cfg = self.config
        # A member admitted but not heard from yet (a newcomer fetching or
        # restoring its state) takes nothing: it drops the group's traffic
        # until it runs, and its first Heartbeat says where it stands.
        # Counted, it would have the fallback send again every entry since
        # its admission, to every member, each order_fallback.
        start = self._min_oupto(reported_only=True)
        if now - self._fallback_at < cfg.order_fallback:
            start = max(start, self._fallback_upto)   # what the last Heartbeats sent is on its way
        else:
            self._fallback_at = now
        runs = []
        for _ in range(ORDER_BURST):
            of, blobs = self.order_log.older_than(start, now - cfg.order_fallback, cfg.order_budget)
            if not blobs:
                break
            runs.append((of, blobs))
            start = of + len(blobs) - 1
        if runs:
            self._fallback_upto = start
        return runs

    def _min_oupto(self, reported_only: bool = False) -> int:
        reports = self.backup_reports
        return min((reports.get(b, {}).get("oupto", 0) for b in self.view.backups()
                    if not reported_only or b in reports), default=self.order_log.next_oseq)

    def _backup_heartbeat(self, msg: wire.Message) -> None:
        rows = wire.parse_int_rows(msg.body.get("rw") if isinstance(msg.body, dict) else None, 5, "heartbeat")
        oupto = wire.uint_field(msg.body, "oupto", "heartbeat")
        report = self.backup_reports.get(msg.sender)
        if report is None or wire.uint_field(msg.body, "full", "heartbeat"):
            report = self.backup_reports[msg.sender] = {"rw": {}, "gen": {}}
        rw, gen = report["rw"], report["gen"]
        for r in rows:
            cid = ConnId(*r[:3])
            rw[cid], gen[cid] = r[3], r[4]
        report["oupto"] = oupto
        self._backups_progressed()

    def backups_hold_all_received(self) -> bool:
        """Primary: every backup's last Heartbeat shows, on every connection,
        all the remote group's messages this primary has received (by
        timestamp watermark).  A primary that leaves must wait for this too:
        a backup's Nacks are answered by its primary only."""
        for b in self.view.backups():
            rw = self.backup_reports.get(b, {}).get("rw", {})
            if any(rw.get(cid, 0) < c.rx.rw for cid, c in self.conns.items()):
                return False
        return True

    def forget_backups(self, members, linger: float = 0.0) -> None:
        """Primary: these backups left the view (RemoveBackup); their last
        reports no longer hold back flow control, nor, `linger` seconds
        from now, confirmations and watermarks.

        A backup removed for its silence may be cut off rather than dead,
        and take over on its side of a partition: a partition whose two
        directions fail some time apart lets this primary remove its
        backups before they miss it (llft-kill's rules, one namespace after
        the other, cut 90 ms apart).  What this primary orders and
        acknowledges meanwhile, alone, reaches its clients; the remote
        groups hold those entries and messages (reflections, kept
        messages) only as long as a backup may still need them, and the new
        primary on the other side takes them from there (viewchange.py).
        Lingering, the removed backups' last reports keep them held."""
        until = self.clock.now() + linger
        for m in members:
            report = self.backup_reports.pop(m, None)
            if linger > 0 and report is not None:
                self.lingering[m] = (report, until)
        self._backups_progressed()

    def _expire_lingering(self, now: float) -> None:
        gone = [m for m, (_report, until) in self.lingering.items() if until <= now]
        for m in gone:
            del self.lingering[m]
        if gone:
            self._backups_progressed()

    def _backups_progressed(self) -> None:
        lingering = (report.get("oupto", 0) for report, _until in self.lingering.values())
        self.order_log.confirm(min([self._min_oupto(), *lingering]))
        for c in self.conns.values():
            if c.throttle_msn and all(
                    self.backup_reports.get(b, {}).get("gen", {}).get(c.id, 0) >= c.throttle_msn
                    for b in self.view.backups()):
                c.throttle_msn = 0
                self._event("unthrottle", conn=c.id)
                self._maybe_writable(c)

    def _primary_heartbeat(self, msg: wire.Message) -> None:
        body = msg.body
        rows = wire.parse_int_rows(body.get("gwm") if isinstance(body, dict) else None, 5, "heartbeat")
        for r in rows:
            cid = ConnId(*r[:3])
            self.primary_gwm[cid] = r[3]
            c = self.conns.get(cid)
            if c is not None:
                c.rx.gc(r[3])
            elif cid.client != self.group and r[4] and cid not in self.tombstones:
                # A client connection the primary has and this member never
                # heard of: all its datagrams so far missed this member (a
                # newcomer restoring its replica drops them).  Its messages
                # are held for it (its watermark of it is 0): it asks the
                # primary for them, up to the highest the primary has.
                c = self._conn(cid)
                if c is not None:
                    c.rx.learn_highest(r[4], self.clock.now())
                    self.counters["connections_learned"] += 1
        blobs = body.get("ord", [])
        if blobs:
            of = wire.uint_field(body, "of", "heartbeat")
            if not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
                raise wire.DropError(wire.DropReason.MALFORMED, "heartbeat order")
            self._order_delivered(self.sequencer.add(of, blobs))

    # --- backup Nacks --------------------------------------------------------------

    def _send_nack(self, c, msns: list[int], now: float) -> None:
        body = wire.nack_body(c.id, msns)
        c.last_nack = now
        if self.is_primary:   # line 50: to the remote group
            self._transmit(self._header(MsgType.NACK, c, body=body))
        else:                 # line 52: to our own group
            self._transmit(self._intra(MsgType.NACK, body=body))

    def _answer_backup_nack(self, msg: wire.Message) -> None:
        """Line 73-75 for a receiver: the primary re-multicasts, byte for
        byte, what a backup missed from the remote group."""
        cid, msns = wire.parse_nack_body(msg.body)
        c = self.conns.get(ConnId(*cid))
        if c is None:
            return
        now = self.clock.now()
        quiet = max(self.config.nack_interval, c.tx.quiet())  # Nacks of several backups cross
        for m in msns[: self.config.nack_batch]:
            e = c.rx.lookup(m)
            if e is not None and now - e.last_tx >= quiet:
                e.last_tx = now
                self.counters["retransmissions_intra"] += 1
                self._transmit_data(self.group, e.data, e.msg.TYPE)
