"""What messaging does when a group's primary changes (LLFT Fig. 9, phase 2),
on both sides of the group's connections.

At the new primary: `take_over` makes it the sender of record (its ordering
information continues the old primary's numbering) and `rebase` restarts a
connection's outgoing numbering after what the remote group has.  At the
remote group's primary: `answer_new_primary_view` discards what came from
the old primary after the last in-order message (line 38) and answers with
receivedUpToMsn and lastSentMsn per connection (line 41), plus the
ordering information of the old primary it still holds for reflection, so
the new primary can reach the virtual synchrony point.

Deviation: msgSeqNums restart after receivedUpToMsn rather than at 0; the
remote side then needs no expectedMsn reset, and the application payloads
carry stream offsets, so anything repeated is recognised there."""
from __future__ import annotations

from llft import wire
from llft.messaging.ids import ConnId, View
from llft.wire import MsgType, Role


def take_over(ep, view: View, lacking: dict[int, bytes]) -> None:
    """ep (a backup) is the primary of `view` now.  Its ordering information
    continues after the last entry it released from the old primary;
    `lacking` (oseq -> blob) are old entries some backup does not hold yet:
    they go to the backups on the next Heartbeat, as late entries do."""
    upto = ep.sequencer.upto
    ep.view = view
    log = ep.order_log
    log.entries.clear()
    stale = ep.clock.now() - ep.config.order_fallback
    for oseq in sorted(lacking):
        log.entries[oseq] = (lacking[oseq], stale)
    log.next_oseq = upto + 1
    log.confirmed = log.carried = min(lacking, default=upto + 1) - 1
    ep.reflected.skip_to(upto)
    ep.backup_reports.clear()
    ep.counters["view_changes"] += 1


def deliver_held_order(ep, first: int, blobs: list[bytes]) -> None:
    """Ordering information of the old primary obtained another way (from a
    remote group or another backup): released in order, once, as if it had
    come piggybacked."""
    if blobs:
        ep._order_delivered(ep.sequencer.add(first, blobs))


def rebase(ep, cid: ConnId, base: int) -> list[bytes]:
    """The remote group has our messages up to msn `base`: numbering goes on
    from there.  Returns the payloads logged after base (in order), which the
    caller sends again as new messages."""
    c = ep.conns[cid]
    later = [e.data for m, e in c.tx.sent.items() if m > base and e.ts == 0]
    c.tx.sent.clear()
    c.tx.msg_seq_count = c.tx.remote_ack = c.tx._bounded_upto = base
    c.throttle_msn = c.acked_msn = c.acked_count = 0
    return later


def new_primary_view(ep, remote_group: int) -> None:
    """New primary: ask a remote group for its state of our connections."""
    ep._transmit(wire.make(MsgType.NEW_PRIMARY_VIEW, src_group=ep.group, dst_group=remote_group,
                           role=int(Role.SERVER), sender=ep.me, pvn=ep.view.pvn,
                           precedence=ep.view.primary_precedence, timestamp=ep._stamp(),
                           body={"oupto": ep.sequencer.upto}))


def answer_new_primary_view(ep, msg) -> None:
    """Remote primary (Fig. 9 lines 36-41)."""
    rows, held = [], {}
    for cid, c in ep.conns.items():
        if c.remote != msg.src_group:
            continue
        flushed = c.rx.flush_after_upto()
        ep.counters["flushed_after_view_change"] += flushed
        rows.append([*cid, c.rx.received_upto, c.tx.msg_seq_count])
        held.update(c.reflector.entries)
    first = min(held, default=0)
    blobs = []
    while first + len(blobs) in held:
        blobs.append(held[first + len(blobs)])
    ep._transmit(wire.make(MsgType.NEW_PRIMARY_VIEW_ACK, src_group=ep.group, dst_group=msg.src_group,
                           role=int(Role.CLIENT), sender=ep.me, pvn=ep.view.pvn,
                           precedence=ep.view.primary_precedence, timestamp=ep._stamp(),
                           body={"conns": rows, "of": first, "ord": blobs}))


def parse_new_primary_view_ack(body) -> tuple[list[tuple[ConnId, int, int]], int, list[bytes]]:
    rows = wire.parse_int_rows(body.get("conns") if isinstance(body, dict) else None, 5, "view ack")
    of = wire.uint_field(body, "of", "view ack")
    blobs = body.get("ord", [])
    if not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
        raise wire.DropError(wire.DropReason.MALFORMED, "view ack order")
    return [(ConnId(*r[:3]), r[3], r[4]) for r in rows], of, blobs
