"""A new primary resends every byte of a connection's output the gateway
has not had (LLFT phase 2), including what was still waiting, as a backup,
for messaging's flow-control window when the old primary failed.

Deterministic: the real GroupEndpoints, Outboxes and ReplyStreams of a
server group of three and a gateway, on the simulated network (virtual
clock), a small send window so that a backup's window fills under steady
output (a backup frees its log only as the gateway's watermark passes the
gateway's acknowledgments, a round trip after the primary)."""
from __future__ import annotations

from llft.auth import Keyring
from llft.cluster import payload
from llft.cluster.output import Outbox, ReplyStream, rebase_connection
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.lossy import message_matches
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.messaging.viewchange import (answer_new_primary_view, follow_new_view, new_primary_view,
                                                     order_base, parse_new_primary_view_ack, take_over)
from llft.ordering.llmp.wire import MsgType

KEY = Keyring(b"k" * 32)
GW, SRV = 10, 20
CHUNKS = 600
EVERY = 0.0002      # the program writes a chunk this often (virtual seconds)


def chunk(i: int) -> bytes:
    return b"%06d " % i + bytes([65 + i % 26]) * (40 + i % 50) + b"\n"


class Gateway:
    """The gateway's end: replies by stream offset, as llft/cluster/gateway.py takes them."""

    def __init__(self, ep):
        self.ep, self.out, self.missing, self.view_asked = ep, bytearray(), [], 0
        ep.on_deliver = self.reply
        ep.on_event = self.event

    def event(self, name, info):
        msg = info.get("msg")
        if name == "membership-message" and msg is not None and msg.src_group == SRV \
                and msg.TYPE == MsgType.NEW_PRIMARY_VIEW:
            self.view_asked += 1
            answer_new_primary_view(self.ep, msg)

    def reply(self, cid, body):
        kind, offset, *rest = payload.parse_reply(body)
        if kind != payload.DATA:
            return
        data = rest[0]
        skip = len(self.out) - offset
        if skip < 0:
            self.missing.append((offset, -skip))
        if skip < len(data):
            self.out += data[max(skip, 0):]


def run_program(clock, streams, cid, total: int, start: bool = True) -> dict:
    """The replicated program: every EVERY seconds each live replica (those
    in produced["by"]) writes the next of `total` chunks, the same output
    everywhere.  produced["n"] counts chunks written; produced["step"]
    writes the next (scheduled at once unless start is False)."""
    produced = {"n": 0, "by": [0, 1, 2]}

    def step():
        i = produced["n"]
        if i >= total:
            return
        produced["n"] += 1
        for k in produced["by"]:
            streams[k].data(cid, chunk(i), 0)
        clock.call_later(EVERY, step)
    produced["step"] = step
    if start:
        clock.call_later(0, step)
    return produced


def group_with_a_connection():
    """Three members (send and kept windows of 8, so backups' windows fill:
    what they log waits for the remote group's watermark) and a gateway
    with one open connection; each member's outbox and reply stream."""
    clock = SimClock()
    net = SimNetwork(clock)
    cfg = Config(send_window=8, kept_window=8)
    servers = make_group(net, SRV, 3, KEY, cfg)
    gateway = Gateway(make_group(net, GW, 1, KEY, cfg)[0])
    cid = gateway.ep.connect(SRV, 1)
    gateway.ep.send(cid, payload.open_request(7000, "10.0.0.1", 4000))
    assert clock.run_until(1.0, lambda: all(cid in ep.conns for ep in servers))
    outboxes = [Outbox(ep) for ep in servers]
    streams = [ReplyStream(ob, primary=ep.is_primary) for ep, ob in zip(servers, outboxes)]
    return clock, net, servers, gateway, ConnId(*cid), outboxes, streams


def backups_cut_where_the_primary_did(servers, outboxes, streams):
    """Each backup cuts its output at the primary's boundaries (member.py _order)."""
    for ep, ob, st in zip(servers, outboxes, streams):
        ep.on_writable = ob.writable
        if not ep.is_primary:
            def order(_oseq, blob, st=st):
                kind, *rest = payload.parse_blob(blob)
                if kind == payload.TAG_BOUNDARY:
                    st.boundary(ConnId(*rest[0]), rest[1], rest[2])
            ep.on_order = order


def gateway_has(clock, new, view) -> int:
    """Phase 2 (llft/ordering/llmp/membership/membership_protocol.py take_over), asked before the new
    primary takes over: the gateway's receivedUpTo of the connection."""
    acks = []

    def event(name, info):
        msg = info.get("msg")
        if name == "membership-message" and msg is not None and msg.TYPE == MsgType.NEW_PRIMARY_VIEW_ACK \
                and msg.src_group == GW:
            acks.append(parse_new_primary_view_ack(msg.body))
    new.on_event = event
    new_primary_view(new, GW, view)
    assert clock.run_until(clock.now() + 1.0, lambda: acks)
    [(_cid, recv_upto, _sent)] = acks[0][0]
    return recv_upto


def goes_on_as_primary(new, view, outbox, stream, cid, recv_upto):
    """The new primary goes on from the gateway's receivedUpTo."""
    take_over(new, view, order_base(view.pvn, new.sequencer.upto))
    new.on_order = None
    stream.primary = True
    rebase_connection(new, outbox, stream, cid, recv_upto)
    stream.promote()


def gateway_got_exactly(clock, gateway, chunks: int):
    expected = b"".join(chunk(i) for i in range(chunks))
    clock.run_until(clock.now() + 30.0, lambda: len(gateway.out) >= len(expected) or gateway.missing)
    assert not gateway.missing, f"(offset, bytes missing) at the gateway: {gateway.missing[:5]}"
    assert len(gateway.out) == len(expected), \
        f"the gateway got {len(gateway.out)} of {len(expected)} bytes (the rest stuck at the new primary)"
    assert bytes(gateway.out) == expected


def test_new_primary_resends_output_that_waited_for_the_window():
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    backups_cut_where_the_primary_did(servers, outboxes, streams)
    produced = run_program(clock, streams, cid, CHUNKS)
    new = servers[1]
    # Until the backup has messages waiting for its window while the gateway
    # lacks some of what it logged.
    assert clock.run_until(5.0, lambda: outboxes[1].queued() >= 4), \
        "the backup's window never filled: the test no longer exercises the failover it is about"

    # The primary fails: it hears and says nothing more, its program is gone.
    net.members[SRV].remove(servers[0].datagram_received)
    servers[0].close()
    produced["by"] = [1]
    net.members[SRV].remove(servers[2].datagram_received)   # (a view of the new primary alone)
    servers[2].close()

    view = View(SRV, primary=new.me, precedences={new.me: 2}, pvn=2)
    goes_on_as_primary(new, view, outboxes[1], streams[1], cid, gateway_has(clock, new, view))
    gateway_got_exactly(clock, gateway, CHUNKS)


def test_a_backup_following_the_new_view_keeps_its_waiting_output_in_order():
    """Two failovers in a row: the backup left after the first follows the
    new view (it rebases its connection as the new primary did) while its
    own window is full, then takes over in turn.  Its waiting output must
    follow the new view's numbering, or at the second failover it resends
    the wrong messages and the gateway lacks bytes."""
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    logs = [{} for _ in servers]    # what each member released, by oseq (member.py keeps it too)

    def follower(k):
        def order(oseq, blob):
            logs[k][oseq] = blob
            kind, *rest = payload.parse_blob(blob)
            if kind == payload.TAG_BOUNDARY:
                streams[k].boundary(ConnId(*rest[0]), rest[1], rest[2])
            elif kind == payload.TAG_VIEW:
                for c, base in rest[1]:
                    rebase_connection(servers[k], outboxes[k], streams[k], ConnId(*c), base)
        return order

    for k, (ep, ob) in enumerate(zip(servers, outboxes)):
        ep.on_writable = ob.writable
        if not ep.is_primary:
            ep.on_order = follower(k)

    total = 2 * CHUNKS
    produced = run_program(clock, streams, cid, total, start=False)

    def fail(k):
        net.members[SRV].remove(servers[k].datagram_received)
        servers[k].close()
        produced["by"].remove(k)

    def take_over_as(k, view, followers):
        """membership_protocol.py take_over, reduced to one gateway and one connection."""
        new = servers[k]
        for j in followers:
            servers[j].sequencer.hold(True)   # they acknowledged the new primary
        recv_upto = gateway_has(clock, new, view)
        sync = new.sequencer.upto
        base = order_base(view.pvn, sync)
        take_over(new, view, base)
        for j in followers:   # the view notice
            f = servers[j]
            f.view = view
            first = f.sequencer.upto + 1
            blobs = [logs[k][n] for n in range(first, sync + 1)]
            assert follow_new_view(f, sync, base, first, blobs)
        new.on_order = None
        streams[k].primary = True
        new.add_order_info(payload.view_blob(view.pvn, [(tuple(cid), recv_upto)]))
        rebase_connection(new, outboxes[k], streams[k], cid, recv_upto)
        streams[k].promote()

    clock.call_later(0, produced["step"])
    assert clock.run_until(5.0, lambda: outboxes[1].queued() >= 4 and outboxes[2].queued() >= 4), \
        "the backups' windows never filled: the test no longer exercises the failover it is about"
    fail(0)
    take_over_as(1, View(SRV, primary=servers[1].me, precedences={servers[1].me: 2, servers[2].me: 3}, pvn=2), [2])
    assert clock.run_until(clock.now() + 5.0, lambda: produced["n"] >= CHUNKS and outboxes[2].queued() >= 4), \
        "the new view's backup never had output waiting for its window"
    fail(1)
    take_over_as(2, View(SRV, primary=servers[2].me, precedences={servers[2].me: 3}, pvn=3), [])

    gateway_got_exactly(clock, gateway, total)


def test_a_live_old_primary_is_not_heard_once_the_gateway_knows_the_new_view():
    """A false suspicion: the old primary lives on, writing, after a backup
    took over.  Once the gateway has told the new primary how far it got
    (NewPrimaryView, which names the new view), nothing of the old view may
    reach the client, or the old primary's later messages take the msns the
    new primary numbers from there on (bytes lost, or the connection stuck)."""
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    backups_cut_where_the_primary_did(servers, outboxes, streams)
    produced = run_program(clock, streams, cid, CHUNKS)
    assert clock.run_until(5.0, lambda: outboxes[1].queued() >= 4), \
        "the backup's window never filled: the test no longer exercises the failover it is about"
    new, old = servers[1], servers[0]
    # The group no longer hears the old primary (so the new primary's view
    # leaves it out); it still hears them, and reaches the gateway, and its
    # program goes on writing.
    from_old = message_matches(lambda m: m.src_group == SRV and m.sender == old.me)
    net.policy.targets.append(lambda d, group: group == SRV and from_old(d, group))
    produced["by"] = [0, 1]
    view = View(SRV, primary=new.me, precedences={new.me: 2}, pvn=2)
    recv_upto = gateway_has(clock, new, view)             # as member.py asks: before it takes over
    clock.run_until(clock.now() + 0.05, lambda: False)    # the old primary writes on meanwhile
    goes_on_as_primary(new, view, outboxes[1], streams[1], cid, recv_upto)
    gateway_got_exactly(clock, gateway, CHUNKS)
    assert gateway.ep.drops["stale-view"] > 0, \
        "the old primary sent nothing after the view change: the test no longer exercises it"


def view_answer(clock, new, view) -> dict:
    """The gateway's answer to `new`'s NewPrimaryView for `view` (after
    the answers to earlier ones, multicast to every member, have arrived)."""
    clock.run_until(clock.now() + 0.05, lambda: False)
    answers = []

    def event(name, info):
        msg = info.get("msg")
        if name == "membership-message" and msg is not None and msg.TYPE == MsgType.NEW_PRIMARY_VIEW_ACK \
                and msg.src_group == GW:
            answers.append(msg.body)
    new.on_event = event
    new_primary_view(new, GW, view)
    assert clock.run_until(clock.now() + 1.0, lambda: answers)
    return answers[0]


def split_without_the_primary(clock, net, servers, produced):
    """The primary fails, and its two backups cannot hear each other (the
    gateway hears both): each takes over in view 2, the second with the
    higher precedence."""
    net.members[SRV].remove(servers[0].datagram_received)
    servers[0].close()
    produced["by"] = [1, 2]
    net.policy.targets.append(message_matches(lambda m: m.src_group == SRV and m.dst_group == SRV))
    return (View(SRV, primary=servers[1].me, precedences={servers[1].me: 2}, pvn=2),
            View(SRV, primary=servers[2].me, precedences={servers[2].me: 3}, pvn=2))


def test_the_other_side_of_a_split_is_refused_once_one_side_served():
    """Two backups that could not hear each other both took over in view 2.
    Once the gateway took replies from the first, the second (of higher
    precedence, whose view does not descend from the first's) is refused:
    following it, the gateway gave its clients answers it never knew of
    (acknowledged operations lost and repeated).  The first side goes on."""
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    backups_cut_where_the_primary_did(servers, outboxes, streams)
    produced = run_program(clock, streams, cid, CHUNKS)
    assert clock.run_until(5.0, lambda: produced["n"] >= CHUNKS // 4)
    first, second = split_without_the_primary(clock, net, servers, produced)
    goes_on_as_primary(servers[1], first, outboxes[1], streams[1], cid, gateway_has(clock, servers[1], first))
    assert clock.run_until(clock.now() + 5.0, lambda: gateway.ep.remote_anchor[SRV] == (2, 2)), \
        "the first new primary's replies never came"
    assert view_answer(clock, servers[2], second) == {"refused": [2, 2]}
    assert gateway.ep.remote_views[SRV] == (2, 2) and gateway.ep.drops["competing-view"] == 1
    gateway_got_exactly(clock, gateway, CHUNKS)


def test_of_two_new_primaries_that_served_nobody_the_higher_is_followed():
    """The same split, the second asking before the first served anything:
    no client saw either, so the higher precedence wins, as it does among
    the members once they hear each other, and its output is complete."""
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    backups_cut_where_the_primary_did(servers, outboxes, streams)
    produced = run_program(clock, streams, cid, CHUNKS)
    assert clock.run_until(5.0, lambda: produced["n"] >= CHUNKS // 4)
    first, second = split_without_the_primary(clock, net, servers, produced)
    assert "refused" not in view_answer(clock, servers[1], first)
    assert gateway.ep.remote_views[SRV] == (2, 2)
    clock.run_until(clock.now() + 0.05, lambda: False)    # (the answer reaches every member)
    recv_upto = gateway_has(clock, servers[2], second)
    assert gateway.ep.remote_views[SRV] == (2, 3) and gateway.ep.drops["competing-view"] == 0
    goes_on_as_primary(servers[2], second, outboxes[2], streams[2], cid, recv_upto)
    gateway_got_exactly(clock, gateway, CHUNKS)


def test_a_reply_reaches_the_gateway_only_with_the_records_made_before_it():
    """Output commit (Outbox.after_records): the primary's program made a
    record (which thread's connect became connection k, a lock's order, the
    time), then wrote.  The reply must not leave before that record is in
    the ordering information, so that it rides on the reply and the gateway
    holds it for a new primary; else, if the primary failed in between, a
    new primary would re-create that output differently (the ring here is a
    position: member.py hands the outbox the replica ring's head, and the
    record shipper's position)."""
    clock, net, servers, gateway, cid, outboxes, streams = group_with_a_connection()
    primary, outbox, stream = servers[0], outboxes[0], streams[0]
    ring = {"head": 0}
    outbox.after_records(lambda: ring["head"])
    outbox.shipped(0)
    held_at_reply = []   # what the gateway holds for reflection as each reply arrives
    take = gateway.reply

    def reply(c, body):
        held_at_reply.append(set(gateway.ep.conns[c].reflector.entries.values()))
        take(c, body)
    gateway.ep.on_deliver = reply

    ring["head"] = 1                  # the program's record, still in its ring
    stream.data(cid, chunk(0), 0)     # then its write
    clock.run_until(clock.now() + 0.5, lambda: False)
    assert gateway.out == b"", "a reply left before the record made before it"
    record = b"the record of the connect"
    primary.add_order_info(record)    # the shipper hands the record to messaging
    outbox.shipped(1)
    assert clock.run_until(clock.now() + 1.0, lambda: gateway.out == chunk(0))
    assert record in held_at_reply[0], "the reply came without the record it depends on"
    # Output after records already shipped leaves at once.
    stream.data(cid, chunk(1), 0)
    assert clock.run_until(clock.now() + 1.0, lambda: gateway.out == chunk(0) + chunk(1))
