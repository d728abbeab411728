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

from llft.ordering.llmp import wire
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.wire import MsgType, Role


VIEW_BASE_SHIFT = 40


def order_base(pvn: int, sync: int) -> int:
    """Where a new primary's ordering information starts: a range of its
    own, so that an entry of the old primary still on its way (a reflection
    in flight, an entry beyond a gap that no client ever saw the effect of)
    can never be taken for one of the new primary's."""
    return max(sync + 1, pvn << VIEW_BASE_SHIFT)


def take_over(ep, view: View, base: int) -> None:
    """ep (a backup) is the primary of `view` now; its ordering information
    is numbered from `base` (see order_base)."""
    ep.view = view
    log = ep.order_log
    log.entries.clear()
    log.next_oseq = base
    log.confirmed = log.carried = base - 1
    ep.reflected.skip_to(base - 1)
    ep.sequencer.pending.clear()
    ep.backup_reports.clear()
    ep.lingering.clear()
    ep.counters["view_changes"] += 1


def follow_new_view(ep, sync: int, base: int, first: int, blobs: list[bytes]) -> bool:
    """A backup learns the virtual synchrony point of the new view: it
    releases the old primary's entries up to `sync` (`blobs` from `first`
    fill what it lacks), drops the rest of the old view's, and then takes
    the new primary's from `base`.  False if it still lacks some entry up to
    sync (it then cannot follow the new primary)."""
    # The old primary's entries past the synchrony point (reflections that
    # reached this backup but not the new primary) are not followed: drop
    # them before filling the gap, or they would be released with it.
    for k in [k for k in ep.sequencer.pending if sync < k < base]:
        del ep.sequencer.pending[k]
    ep.sequencer.hold(False)
    deliver_held_order(ep, first, blobs)
    complete = ep.sequencer.upto >= sync
    # The new primary's first entries may be here already, pending: released now.
    ep._order_delivered(ep.sequencer.skip_to(base - 1))
    return complete


def nack_remote(ep, cid: ConnId, upto: int, view: View) -> int:
    """New primary of `view`, before it is one (Fig. 9 line 30): Nack to the
    remote group what it lacks of that group's messages up to msn `upto` (a
    backup's own Nacks go to its primary, who is gone).  The Nack names the
    new view: the remote group, told of it by NewPrimaryView, drops anything
    of the old one.  Returns how many it lacks."""
    c = ep.conns.get(cid)
    if c is None:
        return 0       # retired meanwhile (retire.py): the remote group had everything
    c.rx.learn_highest(upto, ep.clock.now())
    missing = [m for m in range(c.rx.received_upto + 1, upto + 1) if c.rx.received.get(m) is None]
    if missing:
        msg = ep._header(MsgType.NACK, c, body=wire.nack_body(cid, missing[: ep.config.nack_batch]))
        msg.pvn, msg.precedence = view.pvn, view.primary_precedence
        ep._transmit(msg)
    return len(missing)


def connection_state(ep, cid: ConnId) -> tuple[int, int, int]:
    """The primary's side of adopt_connection: (msgs consumed, ours the
    remote acknowledged, the first of ours still logged)."""
    c = ep.conns[cid]
    return c.rx.consumed, c.tx.remote_ack, next(iter(c.tx.sent), c.tx.msg_seq_count + 1)


def unconsumed(ep, cid: ConnId) -> list[bytes]:
    """The payloads of a connection's messages released to the application
    but not yet taken, in order (a checkpoint's cut carries them)."""
    rx = ep.conns[cid].rx
    return [rx.received[m].msg.payload for m in range(rx.consumed + 1, rx.released + 1)]


def adopt_connection(ep, cid: ConnId, consumed: int, acked: int, logged_from: int) -> None:
    """State transfer: a newcomer's connection whose messages up to msn
    `consumed` reached the application elsewhere (their content comes with
    the state); it takes the next ones from messaging.  The remote primary
    had acknowledged our messages up to `acked` (the newcomer generates them
    again, and they need no acknowledgment it would never get), and the
    primary still logged those from `logged_from` on (the remote group had
    the earlier ones: the newcomer does not log them)."""
    c = ep._conn(cid)
    if c is not None:
        c.rx.received_upto = c.rx.released = c.rx.consumed = c.rx.highest = consumed
        c.tx.remote_ack = acked
        c.tx.log_from = logged_from


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
    c = ep.conns.get(cid)
    if c is None:
        return []      # retired meanwhile (retire.py)
    later = [e.data for m, e in c.tx.sent.items() if m > base and e.ts == 0]
    c.tx.clear()
    c.tx.msg_seq_count = c.tx.remote_ack = c.tx._bounded_upto = base
    c.throttle_msn = c.acked_msn = c.acked_count = 0
    return later


def number_from(ep, cid: ConnId, count: int) -> None:
    """After `rebase`: the connection's next message is numbered count + 1,
    for a stream whose messages are numbered by their place in the
    replica's output (the same at every member), rather than after `base`.
    A member whose replica had not reached `base` would otherwise number
    its later messages too high, and one whose logged messages past `base`
    were freed meanwhile (the remote group had them from the old primary,
    then dropped them, held back, for the new primary to send again) too
    low.  Messages numbered up to `base` are the remote group's already."""
    c = ep.conns.get(cid)
    if c is None:
        return
    c.tx.msg_seq_count = count
    c.tx._bounded_upto = min(c.tx._bounded_upto, count)   # (backups: bounds come from acks past count too)


def new_primary_view(ep, remote_group: int, view: View) -> None:
    """New primary of `view`, before it takes over: ask a remote group for
    its state of our connections.  The message names the new view, so that
    from then on the remote group drops whatever the old primary (alive
    after a false suspicion) still sends in the old one."""
    ep._transmit(wire.make(MsgType.NEW_PRIMARY_VIEW, src_group=ep.group, dst_group=remote_group,
                           role=int(Role.SERVER), sender=ep.me, pvn=view.pvn,
                           precedence=view.primary_precedence, timestamp=ep._stamp(),
                           body={"oupto": ep.sequencer.upto,
                                 "lineage": ep.lineage.of_new_view(view.pvn, view.primary_precedence)}))


def refuse_new_primary_view(ep, msg, following: tuple[int, int]) -> None:
    """Remote group: the primary of msg's view does not descend from the
    view whose replies it took last, `following` (lineage.py)."""
    ep._transmit(_view_ack(ep, msg, {"refused": list(following)}))


def _view_ack(ep, msg, body: dict) -> wire.Message:
    """The remote group's answer to msg, a NewPrimaryView."""
    return wire.make(MsgType.NEW_PRIMARY_VIEW_ACK, src_group=ep.group, dst_group=msg.src_group,
                     role=int(Role.CLIENT), sender=ep.me, pvn=ep.view.pvn,
                     precedence=ep.view.primary_precedence, timestamp=ep._stamp(), body=body)


def refusal_of(body) -> tuple[int, int] | None:
    """The view a NewPrimaryView answer says the remote group follows
    instead, if it refused ours."""
    r = body.get("refused") if isinstance(body, dict) else None
    if isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r):
        return r[0], r[1]
    return None


ANSWER_BYTES_PER_S = 4 << 20


def answer_new_primary_view(ep, msg) -> None:
    """Remote primary (Fig. 9 lines 36-41).  The new primary asks again
    every few tens of milliseconds until it has the answer, which carries
    the old primary's ordering information held here and may be megabytes:
    a new answer to each ask (each with its own timestamp, so its own
    bytes) flooded the new primary, whose reassembly of each one timed out
    (a group lost at seed 7 across hosts).  So the first answer to a view is
    kept and given again byte for byte (the fragments of all its
    transmissions make one message), no faster than it can be taken in.
    What it says stays true: from the first answer on, the old primary is
    not heard, and the new one sends nothing before it has the answer."""
    view = (msg.pvn, msg.precedence)
    now = ep.clock.now()
    kept = ep.view_answers.get(msg.src_group)
    if kept is not None and kept[0] == view:
        _view, data, due = kept
        if now < due:
            return
    else:
        data = _view_answer(ep, msg)
    ep._transmit_data(msg.src_group, data, MsgType.NEW_PRIMARY_VIEW_ACK)
    ep.view_answers[msg.src_group] = (view, data, now + _repeat_after(data))


def _repeat_after(data: bytes) -> float:
    return max(0.02, len(data) / ANSWER_BYTES_PER_S)


def _view_answer(ep, msg) -> bytes:
    rows, held = [], {}
    for cid, c in ep.conns.items():
        if c.remote != msg.src_group:
            continue
        ep._flush_old_view(c)
        rows.append([*cid, c.rx.received_upto, c.tx.msg_seq_count])
        held.update(c.reflector.entries)
    if msg.src_group in ep.orphans:
        held.update(ep.orphans[msg.src_group].entries)   # of retired connections (retire.py)
    # What the new primary lacks: the run after the entries it holds (held
    # entries below a gap used to end the run there, and a new primary
    # lacked the numbers of outgoing UDP ports the gateway had opened).
    try:
        lacks = wire.uint_field(msg.body, "oupto", "new primary view") + 1
    except wire.DropError:
        lacks = 0
    first = max(lacks, min(held, default=0))
    blobs = []
    while first + len(blobs) in held:
        blobs.append(held[first + len(blobs)])
    return wire.encode_message(_view_ack(ep, msg, {"conns": rows, "of": first, "ord": blobs}))


def parse_new_primary_view_ack(body) -> tuple[list[tuple[ConnId, int, int]], int, list[bytes]]:
    rows = wire.parse_int_rows(body.get("conns") if isinstance(body, dict) else None, 5, "view ack")
    of = wire.uint_field(body, "of", "view ack")
    blobs = body.get("ord", [])
    if not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
        raise wire.DropError(wire.DropReason.MALFORMED, "view ack order")
    return [(ConnId(*r[:3]), r[3], r[4]) for r in rows], of, blobs
