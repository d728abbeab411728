"""One member of a group whose replicas are on several hosts
(`llft-run --join`): this host's replica of the program, and its end of the
messaging protocol.

    gateway --Requests--> every member --AF_UNIX--> its replica
    primary's replica --> primary --Replies + OrderInfo--> gateway --reflected--> backups

The primary ships its replica's OrderInfo records as messaging ordering
information (they ride on its Replies, the gateway reflects them, and
Heartbeats carry what is late); each backup feeds them to its replica's
replay ring.  Client bytes reach every member as Requests, in the same
order, and the local relay hands them to the replica."""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from llft import rundir
from llft.cluster import payload
from llft.checkpoint import criu
from llft.cluster.checkpoint_join import RESTORE_ERRORS, NewcomerRestore, newcomer_images
from llft.cluster.datagrams import MemberDatagrams
from llft.cluster.history import DEFAULT_LIMIT as DEFAULT_HISTORY_LIMIT, GroupHistory
from llft.cluster.naming import DerivedDirectory, group_id
from llft.cluster.newcomer_checkpoints import NewcomerCheckpoints
from llft.cluster.output import OUTPUT_OF_RETIRED, Outbox, ReplyStream, rebase_connection
from llft.cluster import priority
from llft.cluster.outgoing import MemberOutgoing
from llft.cluster.records import RecordFeeder, RecordShipper
from llft.cluster.state_transfer import SpoolFailed
from llft.determinizer.streams import PrimarySource, stream_path, sweep_dead_rings
from llft.follow import STALL_S, FollowWatch
from llft.ordering.group import Excluded, GroupMember, MemberHooks, Membership, member_backend
from llft.ordering.ids import ConnId, View
from llft.native import DEFAULT_SLOTS, EXIT_DIVERGED, ROLE_BACKUP, ROLE_PRIMARY, StreamFile
from llft.replica import Replica, RestoredReplica, release_replicas, stop_replicas, watch_exit
from llft.replication.faults import frozen_past
from llft.replication.verdict import backup_end
from llft.serving.relay import ReplicaRelay
from llft.transport import DEFAULT_PORT, UdpTransport

log = logging.getLogger("llft.member")

STATE_EVERY_S = 1.0
PROMOTE_WAIT_S = 0.005   # the new primary's loop waits this long at most for PROMOTE to reach its replica
# The default fault timeout of rank 2, with the controller at real-time
# priority (priority.py) and without (not root).  A client flooding the
# group once made 30 ms thrash through false failovers: the flood's
# datagrams overflowed the members' socket buffers and took Heartbeats with
# them; messaging's byte window (Config.send_window_bytes) now bounds what
# is in flight, and tests/test_multihost_flood.py holds at 30 ms.
FAULT_TIMEOUT_S = 0.03
FAULT_TIMEOUT_ORDINARY_S = 0.15
TICK_S = 0.02
RESTORING_DROP = "restoring"   # the group's datagrams while a newcomer restores its replica
RESTORE_ATTEMPTS = 3     # checkpoints given that fail to restore before a newcomer gives up
CHECKPOINT_END_S = 10.0  # the most a leaving member waits for a checkpoint under way (CRIU stops soon)
EXIT_EXCLUDED = 3        # left out of a new view: must reset and rejoin
REJOIN_PATIENCE_S = 24 * 3600.0


@dataclass
class MemberOptions:
    group: str
    key: bytes
    interface: str = "0.0.0.0"
    group_port: int = DEFAULT_PORT
    found_after: float = 0.5        # nobody of the group heard for this long: found it as primary
    join_timeout: float = 10.0
    end_timeout: float = 5.0        # primary: how long its backups may take to get its last records
    ring_slots: int = DEFAULT_SLOTS
    stall_timeout_ms: int = 60_000
    end_grace_ms: int = 3_000
    log_output: bool = False
    fault_timeout: float | None = None  # rank 2 suspects a silent primary after this long (None: by priority)
    fault_step: float | None = None     # and each later rank this much later (None: the fault timeout)
    rejoin: bool = True             # a member left out of the group resets and applies again
    history_limit: int = DEFAULT_HISTORY_LIMIT   # bytes of history kept for newcomers (history.py)
    realtime: bool = True           # controller at real-time priority where permitted (priority.py)
    stall_alarm: float = STALL_S    # its replica, a backup, replaying nothing this long while records wait
    private_files: bool = False     # its replica in its own view of the files (llft/private_files.py)
    serialize: bool = False         # --serialize: threads take turns (native/serialize.c)
    checkpoint_dir: str | None = None   # where checkpoints' images are written (checkpoint_join.py); /dev/shm
    order: str = "llft"             # the ordering backend (llft/ordering/group.py)
    config: object | None = None    # the backend's own settings (None: its defaults for a member)


def host_addresses() -> list[str]:
    """This host's IPv4 addresses (llft-kill --partition drops by them)."""
    import psutil
    return sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                   if a.family == socket.AF_INET and not a.address.startswith("127.")})


class HostMember:
    def __init__(self, argv: list[str], run_dir: Path, opts: MemberOptions):
        self.argv, self.run_dir, self.opts = argv, run_dir, opts
        self.gid = group_id(opts.group)
        self.realtime = False                   # its controller runs at real-time priority (run())
        self.interrupted: int | None = None
        self.failed: str | None = None          # why this member stopped its group's program, if it did
        self.replica: Replica | None = None
        self.ep: GroupMember | None = None
        self.rounds = 0
        self.restore_failures = 0   # checkpoints given that could not be restored here, in a row
        self._reset()

    def _reset(self):
        """What one membership of this process holds (a member that resets
        and rejoins starts over with a new identity)."""
        self.me = secrets.randbelow(1 << 30) + 1
        # Every ordering blob since the group began, by oseq, in order, and
        # every request handed on, per connection: what a member joining later
        # replays; and what a new primary gives a backup that lacks some.
        self.history = GroupHistory(self.opts.history_limit)
        self.cids: dict[int, ConnId] = {}
        self.next_open: dict[int, int] = {}            # client group -> connSeqNum of its next connection
        self.unopened: dict[ConnId, list] = {}         # requests of connections that must wait their turn
        self.primary_status: int | None = None   # backups: the primary program's exit status
        self.source: PrimarySource | None = None
        self.shipped = asyncio.Event()
        self.group: Membership | None = None   # the backend's membership protocol, this membership's
        self.stepped_down: str | None = None
        self.pending_inputs: list = []          # a late joiner's transferred inputs, for its relay
        self.restorer: NewcomerRestore | None = None   # a newcomer's, restored from a checkpoint
        self.checkpoints = NewcomerCheckpoints(self)
        self.intake = asyncio.Event()           # clear: client input waits (a checkpoint drains it)
        self.order_held: list | None = None     # a backup's checkpoint: (oseq, blob) released, not yet applied
        self.intake.set()
        self.must_reset = False                 # left the group (excluded, or its replica failed)
        self._drops_logged: dict[str, int] = {}
        self.follow = FollowWatch(self.opts.stall_alarm)
        self.naps = priority.BackupNaps(lambda: self.realtime and self.ep is not None and not self.ep.is_primary)

    # -- joining -----------------------------------------------------------
    def _datagram(self, data: bytes, addr) -> None:
        if self.ep is None:   # (not before the first membership begins)
            return
        if self.restorer is not None and self.replica is None:
            # Restoring its replica: nothing of the group is taken in before
            # it can be followed (ordering information released to nobody is
            # lost).  The primary keeps it for this member, which asks again.
            self.ep.count_drop(RESTORING_DROP)
        elif self.ep.datagram(data, addr):   # clients' traffic (no nap for Heartbeats alone)
            self.naps.took_request()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        o = self.opts
        self.realtime = o.realtime and priority.realtime(priority.EVENT_LOOP)
        if o.fault_timeout is None:
            o.fault_timeout = FAULT_TIMEOUT_S if self.realtime else FAULT_TIMEOUT_ORDINARY_S
        if o.fault_step is None:
            o.fault_step = o.fault_timeout
        log.info("controller at %s priority; fault timeout %.0f ms, %.0f ms more per rank",
                 "real-time" if self.realtime else "ordinary" if not o.realtime else "ordinary (real-time not permitted)",
                 o.fault_timeout * 1000, o.fault_step * 1000)
        # (CRIU is checked aside: it takes a third of a second)
        self.criu_check = loop.run_in_executor(None, criu.problem)
        self.udp = await UdpTransport.open(DerivedDirectory([self.gid], o.group_port), self.gid, 0,
                                           self._datagram, o.interface, loop)
        try:
            while True:
                status = await self._membership(loop)
                if not (self.must_reset and o.rejoin) or self.interrupted is not None:
                    return status
                # LLFT: a member left out of the group resets its state and applies again.
                self.rounds += 1
                log.warning("resetting and rejoining group %s (attempt %d)", o.group, self.rounds)
                self.cleanup()
                self._reset()
                await asyncio.sleep(0.2)
        finally:
            self.udp.close()

    async def _membership(self, loop) -> int:
        o = self.opts
        # Before the endpoint exists: a datagram it took in while nobody
        # joined would count as received, and be dropped as a duplicate
        # when it comes again for the member this one becomes.
        criu_problem = await self.criu_check
        restores = criu_problem is None
        if restores:
            loop.run_in_executor(None, criu.warm_up)   # (a restore or a dump loads pycriu, 0.25 s: aside, now)
        if not restores and self.rounds == 0:
            log.warning("checkpoints are off here (%s): this member joins only while the group's history is "
                        "complete (--history-limit), and as primary admits newcomers only so", criu_problem)
        self.ep = member_backend(o.order, self.gid, self.me, loop, self.udp, o.key, o.config)
        # As primary, every entry it orders (records, where it cut its output,
        # view changes, the end) goes to the log a newcomer replays; a
        # newcomer without the cuts would number its messages differently.
        self.ep.on_order_added = self.history.add_entry
        # A member that rejoins never founds a group of its own (it may still be
        # cut off from the others), and waits for them as long as it takes.
        try:
            joined = await self.ep.join(float("inf") if self.rounds else o.found_after,
                                        REJOIN_PATIENCE_S if self.rounds else o.join_timeout, restores=restores,
                                        spool=newcomer_images(o.checkpoint_dir))
        except SpoolFailed as e:
            self.ep.close()
            return self._restore_failed(f"its image could not be written: {e}")
        if joined is None:
            self.ep.found()
            index = 0
            log.warning("group %s (id %d): nobody there, this member (%d) founds it as primary",
                        o.group, self.gid, self.me)
        else:
            self.ep.adopt(joined)
            self.history.start_from(joined.history)
            index = joined.index
            ck = joined.checkpoint
            log.warning("group %s (id %d): joined as backup %d, replica %d (primary %d, view %d)%s",
                        o.group, self.gid, self.me, index, joined.view.primary, joined.view.pvn,
                        f", from a checkpoint of the {ck['source']}" if ck is not None else
                        f", with {len(joined.conns)} client connections' input" if joined.conns else "")
        restored = None
        if joined is not None and joined.checkpoint is not None:
            self.replica = None
            self.restorer = NewcomerRestore(self, index, joined.checkpoint)
            try:
                restored = await self.restorer.run()
            except RESTORE_ERRORS as e:
                self.ep.close()
                return self._restore_failed(e)
            self.restore_failures = 0
            self.checkpoints.last = dict(restored.checkpoint, at=time.time(), restored=True,
                                         source=joined.checkpoint["source"])
            log.warning("replica %d restored from the %s's checkpoint (%d KiB) in %.0f ms: pid %d", index,
                        joined.checkpoint["source"], restored.checkpoint["image_bytes"] // 1024,
                        restored.checkpoint["restore_ms"], restored.pid)
        self.ep.start()
        self._start_replica(index, joined, restored)
        if joined is not None:
            self.group.accepted(joined.seen)
        try:
            return await self._serve(loop)
        finally:
            self.ep.close()

    def _restore_failed(self, why) -> int:
        """The checkpoint given could not be restored here: join again
        (a new checkpoint), up to RESTORE_ATTEMPTS in a row."""
        self.restore_failures += 1
        if self.restore_failures >= RESTORE_ATTEMPTS:
            self.failed = f"the checkpoint given could not be restored here: {why}"
            log.error("%s; %d attempts failed, this member gives up", self.failed, self.restore_failures)
            return 1
        log.error("the checkpoint given could not be restored here: %s; this member joins again", why)
        self.must_reset = True
        return EXIT_EXCLUDED

    def _start_replica(self, index: int, joined, restored: RestoredReplica | None = None):
        if restored is not None:
            self.replica = restored
        else:
            role = ROLE_BACKUP if joined else ROLE_PRIMARY
            sweep_dead_rings()
            path = stream_path(f"{os.getpid()}", index)
            if os.path.exists(path):
                os.unlink(path)
            stream = StreamFile(path, create=True, slots=self.opts.ring_slots, role=role, replica=index)
            stream.set_timeouts(stall_ms=self.opts.stall_timeout_ms, end_grace_ms=self.opts.end_grace_ms)
            out_dir = self.run_dir / f"replica-{index}"
            out_dir.mkdir(exist_ok=True)
            self.replica = Replica(index, stream, out_dir, private_files=self.opts.private_files,
                                   serialize=self.opts.serialize)
        self.outbox = Outbox(self.ep)
        self.output = ReplyStream(self.outbox, primary=joined is None)
        self.datagrams = MemberDatagrams(self.replica, self.outbox, primary=joined is None)
        self.outgoing = MemberOutgoing(self.replica, self.ep, self.outbox, self.output, primary=joined is None)
        self.group = self.ep.start_membership(self.udp.unread, self.opts, MemberHooks(
            view_changed=self._view_changed, leave=self._leave, held_after=self._held_after, elected=self._elected,
            heard=self.naps.hold_off, joiner_state=self._state, why_no_joining=self._why_no_joining,
            checkpoint_for=self.checkpoints.admits, checkpoint_here=self.checkpoints.here))
        if joined is None:
            self.group.become_primary()
        elif restored is not None:
            self.feeder = RecordFeeder(index, restored.stream, restored.alive)
            self.feeder.sink.delivered = joined.checkpoint["delivered"]
            self.restorer.adopt_connections()
            self.history.begin_after_checkpoint()
            for _oseq, blob in joined.history:   # (a backup's checkpoint: ordered, not yet applied there)
                self._order(blob)
            self.group.settle_for(joined.settling_s)
        else:
            self.feeder = RecordFeeder(index, self.replica.stream, self.replica.alive)
            for client, server, seq, consumed, acked, logged_from, reqs in joined.conns:
                cid = ConnId(client, server, seq)
                if consumed < 0:
                    self.ep.retire(cid, acked)
                else:
                    self.ep.adopt_connection(cid, consumed, acked, logged_from)
                self.pending_inputs.append((cid, reqs))
            for _oseq, blob in joined.history:
                self._order(blob)
            self.group.settle_for(joined.settling_s)
        if restored is None:
            self.replica.start(self.argv, dict(os.environ))
            log.info("replica %d (%s) started: pid %d", index, self.replica.role, self.replica.pid)
        if joined is not None:
            self.feeder.start()

    # -- the primary's side ------------------------------------------------
    def _state(self) -> dict:
        """What a newcomer needs to become a replica like the others (state
        transfer by log): every ordering blob since the group began, and
        every request each connection has handed on so far, with the
        msgSeqNum it reached; its program replays them from the start."""
        conns = [[*cid, *self._transferred(cid), [list(r) for r in reqs]]
                 for cid, reqs in self.history.inputs.items()]
        # A newcomer's fault detector settles as long as the older backups'
        # do: with its rank's shorter timeout, a newcomer of rank 3 would
        # propose itself before the rank-2 backup and leave it out.
        return {"oseq": self.ep.ordered_upto(), "history": [[k, b] for k, b in self.history.entries.items()],
                "conns": conns, "settling_ms": max(0, int(self.group.settling_left() * 1000))}

    def _transferred(self, cid: ConnId) -> tuple[int, int, int]:
        """A connection's messaging state for a newcomer: (msgs consumed, ours
        the remote acknowledged, the first of ours still logged), or (-1,
        msgs we sent, 0) for one retired (retire.py), whose input the
        newcomer's program replays all the same."""
        if not self.ep.has_connection(cid):
            return -1, self.ep.retired().get(cid, 0), 0
        return self.ep.connection_state(cid)

    def _why_no_joining(self) -> str | None:
        if self.primary_status is not None:
            return "the primary's program has exited"
        if self.group.taking_over:
            return "a primary change is under way"
        why = self.history.why_incomplete()
        problem = why and self.checkpoints.problem()
        if problem is None:
            return None
        return f"{why}, and no checkpoint can stand for it: {problem}"

    # -- a backup's checkpoint: what is ordered waits for its cut ----------------
    def hold_order(self):
        """The ordering entries released from now on wait (in order_held)."""
        self.order_held = []

    def release_order(self):
        """The entries held are applied, and those released after them at once."""
        held, self.order_held = self.order_held, None
        for _oseq, blob in held or ():
            self._order(blob)

    def _ship(self, blobs: list[bytes], position: int):
        for b in blobs:
            self.ep.order(b)
        self.outbox.shipped(position)

    def _ready_shipping(self, loop):
        self.shipper = RecordShipper(PrimarySource(self.replica.stream), loop, self._ship, self.shipped.set)
        self.shipper.start()

    def _start_shipping(self):
        self.source = self.shipper.source
        stream = self.replica.stream
        self.outbox.after_records(lambda: stream.head, self.shipper.pull)
        self.shipper.go()

    async def _stop_shipping(self):
        """Ships the records left in the ring; the ring may be unmapped after."""
        if self.source is not None:
            self.source.finish()
            await asyncio.wait_for(self.shipped.wait(), 10)

    # -- a backup's side ---------------------------------------------------
    def _released_order(self, oseq: int, blob: bytes):
        """Ordering information released by messaging, in oseq order.  (Kept
        under its own oseq: a count of releases went wrong at a view notice,
        where the new view's numbering jumps to pvn << 40, so later
        acknowledgments and view notices looked for entries under the wrong
        numbers.)"""
        self.history.add_entry(oseq, blob)
        if self.order_held is not None:
            self.order_held.append((oseq, blob))
        else:
            self._order(blob)

    def _held_after(self, oseq: int, upto: int | None = None) -> tuple[int, list[bytes]]:
        """The released entries after oseq (up to upto), as one consecutive run."""
        blobs, k, entries = [], oseq + 1, self.history.entries
        while k in entries and (upto is None or k <= upto):
            blobs.append(entries[k])
            k += 1
        return (oseq + 1 if blobs else 0), blobs

    def _order(self, blob: bytes):
        try:
            kind, *rest = payload.parse_blob(blob)
        except payload.BadPayload:
            self.ep.count_drop("bad-order-info")
            return
        if kind == payload.TAG_RECORDS:
            self.feeder.feed(rest[0])
        elif kind == payload.TAG_BOUNDARY:
            cid, end, closed = rest
            self.output.boundary(ConnId(*cid), end, closed)
        elif kind == payload.TAG_CONTROL:
            self.outgoing.chosen_by_primary(ConnId(*rest[0]))
        elif kind == payload.TAG_DATAGRAM:
            cid, number = rest
            self.datagrams.ordered(ConnId(*cid), number)
        elif kind == payload.TAG_UDP_PORT:
            self.outgoing.udp.ordered(*rest)
        elif kind == payload.TAG_VIEW:
            for cid, base in rest[1]:
                cid = ConnId(*cid)
                if self.ep.has_connection(cid):
                    self._rebase(cid, base)
        elif kind == payload.TAG_END:
            self.primary_status = rest[0]
            self.group.program_ended()
            self.feeder.end(rest[0])

    # -- both ----------------------------------------------------------------
    def _view_changed(self):
        self.write_state("running")

    def _leave(self, why: str):
        """This member must leave the group (the serve loop acts on it)."""
        self.stepped_down = why

    def _conn_num(self, cid: ConnId) -> int:
        """The connection's id in the program's connection header: the same at every member."""
        num = (cid.client << 32) | cid.seq
        self.cids[num] = cid
        return num

    def _request(self, cid: ConnId, body: bytes | None, req: tuple | None = None, log_it: bool = True):
        if req is None:
            try:
                req = payload.parse_request(body)
            except payload.BadPayload as e:
                self.ep.count_drop("bad-payload")
                log.debug("connection %s: %s", cid, e)
                return
        if log_it:
            self.history.add_input(cid, req)
        held = self.unopened.get(cid)
        if held is not None:
            held.append(req)
            return
        if req[0] == payload.OPEN and cid.seq != self.next_open.get(cid.client, 1):
            # Connections reach the program in the gateway's order at every
            # member (the primary's accept order is then the backups'), even
            # when loss delivers a later connection's first message first.
            self.unopened[cid] = [req]
            return
        self._to_relay(cid, req)
        if req[0] == payload.OPEN:
            self.next_open[cid.client] = cid.seq + 1
            nxt = ConnId(cid.client, cid.server, cid.seq + 1)
            if nxt in self.unopened:
                for r in self.unopened.pop(nxt):
                    self._request(nxt, None, r, log_it=False)

    def _rebase(self, cid: ConnId, base: int):
        """A new view: this connection's messages go on after msn base."""
        rebase_connection(self.ep, self.outbox, self.datagrams if self.datagrams.handles(cid) else self.output,
                          cid, base)

    def _to_relay(self, cid: ConnId, req: tuple):
        if self.outgoing.handles(cid):
            return self.outgoing.request(cid, req)
        if req[0] == payload.DGRAM:
            return self.datagrams.request(cid, req)
        num = self._conn_num(cid)
        if req[0] == payload.OPEN:
            self.relay.open(num, req[1], req[2], req[3])
        elif req[0] == payload.DATA:
            self.relay.data(num, req[1])
        else:
            self.relay.eof(num)
            self.output.input_ended(cid)

    async def _inbound(self, ready: asyncio.Event):
        """Client bytes to the replica, as fast as it takes them (bounded: a
        slow replica leaves messages in messaging's windows)."""
        while True:
            await self.relay.room.wait()
            if not self.intake.is_set():
                await self.intake.wait()
            got = self.ep.recv()
            if got is None:
                ready.clear()
                await ready.wait()
                continue
            self._request(*got)

    async def _serve(self, loop) -> int:
        # A full collection walks every tracked object: ~23 ms for the ~22,000
        # of a started member on this loaded machine, long enough for its
        # Heartbeats to stop past the fault timeout.  What exists now (modules,
        # the joined state) lives as long as the member: out of collections.
        gc.freeze()
        ready = asyncio.Event()
        self.ep.on_ready = ready.set
        self.ep.on_writable = self.outbox.writable
        if not self.ep.is_primary:
            self.ep.on_order = self._released_order
        relay_log = (self.replica.out_dir / "output") if self.opts.log_output else None
        self.relay = ReplicaRelay(self.replica, log_dir=relay_log,
                                  on_output=lambda n, chunk, off: self.output.data(self.cids[n], chunk, off),
                                  on_close=lambda n, sent: self.output.close(self.cids[n], sent))
        for cid, reqs in sorted(self.pending_inputs, key=lambda p: p[0]):   # a late joiner's transferred input
            for r in reqs:
                try:
                    self._request(cid, payload.encode_request(r))
                except payload.BadPayload:
                    self.ep.count_drop("bad-payload")
        self.pending_inputs = []
        if self.restorer is not None:
            await self.restorer.relay_connections()
            self.restorer = None
        tasks = [asyncio.create_task(self.relay.run()), asyncio.create_task(self._inbound(ready)),
                 asyncio.create_task(self.datagrams.run()), asyncio.create_task(self.outgoing.run())]
        self._ready_shipping(loop)
        if self.ep.is_primary:
            self._start_shipping()
        exited = asyncio.Event()
        watch_exit(self.replica, exited.set)
        next_state = 0.0
        try:
            while self.replica.alive() and self.interrupted is None:
                try:
                    self.group.tick()
                    self._check_replica_frozen()
                    if self.stepped_down:
                        raise Excluded(self.stepped_down)
                except Excluded as e:
                    return await self._leave_group(str(e))
                if time.monotonic() >= next_state:
                    self._check_following()
                    self.write_state("running")
                    next_state = time.monotonic() + STATE_EVERY_S
                    why = self.replica.unreplicable()
                    if why:   # nothing may be served unreplicated
                        self.failed = why
                        log.error("%s; this member stops", self.failed)
                        self.stop()
                        await self._stop_shipping()
                        return 1
                try:
                    await asyncio.wait_for(exited.wait(), TICK_S)
                except asyncio.TimeoutError:
                    pass
            if self.interrupted is not None:
                self.stop()
                await self._stop_shipping()
                return 128 + self.interrupted
            if self.stepped_down:
                # Told to leave before its replica ended: a backup that could
                # not reach the new view's synchrony point may diverge on its
                # way out; the member resets and rejoins all the same.
                return await self._leave_group(self.stepped_down)
            status = self.replica.poll()
            if status >= 128 and not self.replica.killed_by_llft:
                log.error("replica %d (%s) was killed (status %d): this member leaves the group%s%s",
                          self.replica.index, self.replica.role, status,
                          "; a backup takes over" if self.ep.is_primary else "",
                          "; it resets and rejoins with a new replica" if self.opts.rejoin else "")
                await self._stop_shipping()
                self.must_reset = True
                return status
            await self.relay.drained(timeout=2.0)
            self.datagrams.drain()
            self.outgoing.udp.drain()
            if self.source is not None:
                await self._stop_shipping()
                await self._finish_primary(status)
            else:
                self.ep.heartbeat_now()   # tell the primary we had its last record
            return self._verdict(status)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.checkpoints.finish(CHECKPOINT_END_S)
            self.datagrams.close()
            self.outgoing.close()
            self.write_state("finished")

    async def _leave_group(self, why: str) -> int:
        log.error("%s: this member leaves the group%s", why, " and resets" if self.opts.rejoin else "")
        self.stop()
        await self._stop_shipping()
        self.must_reset = True
        return EXIT_EXCLUDED

    def _check_following(self):
        """A backup's replica that replays nothing while records wait no
        longer follows: this member could not take over; say so now."""
        feeder = getattr(self, "feeder", None)
        if self.ep.is_primary or feeder is None:
            return
        self.follow.note(self.replica.index, feeder.sink.delivered, self.replica.stream.records)

    def _check_replica_frozen(self):
        """A replica stopped (SIGSTOP, a debugger) longer than the fault
        timeout is a timing fault of this member, though its controller
        still heartbeats: it steps down, so that as primary it is replaced,
        and resets (its replica is killed, even stopped) and rejoins."""
        for _r, frozen in frozen_past([self.replica], self.opts.fault_timeout):
            if not self.stepped_down:
                self.stepped_down = f"its replica has been stopped for {frozen * 1000:.0f} ms"

    # -- taking over ---------------------------------------------------------
    def _elected(self, view: View, acks: dict):
        asyncio.get_running_loop().create_task(self._take_over(view, acks))

    async def _take_over(self, view: View, acks: dict):
        """The membership reaches the new view's synchrony point; then this
        replica takes over where the old primary's output stopped."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        bases = await self.group.take_over(view, acks)
        if bases is None:
            return
        self.release_order()   # (a checkpoint under way refuses at its cut: it is primary now)
        self.ep.order(payload.view_blob(view.pvn, sorted(bases.items())))
        self.output.primary = True
        for cid, base in bases.items():
            self._rebase(cid, base)
        self.output.promote()
        self.datagrams.promote()
        self.outgoing.promote()
        promoted = self.feeder.promote()
        # The feeder thread carries PROMOTE to the replica: let go of the GIL
        # until it has (bounded; it may first write records just delivered).
        # Otherwise what follows (logging, the state file) held it back for
        # 0.2-2 ms after the takeover (bench/cluster.py, promote_ms).
        promoted.wait(PROMOTE_WAIT_S)
        self.replica.role = "primary"
        self._start_shipping()
        self.group.took_over()
        gc.freeze()                             # the state taken over lives on (see _serve)
        log.warning("took over as primary of view %d with backups %s in %.1f ms (ordering information up to "
                    "%d)", view.pvn, view.backups(), (loop.time() - start) * 1000, self.ep.ordered_upto())
        self.write_state("running")

    async def _finish_primary(self, status: int):
        """Tells the backups the program ended, and stays until they have every
        record and every client message (a lagging backup's replica needs
        them to reach the end, and only its primary answers its Nacks) and
        the gateways every reply (bounded)."""
        self.primary_status = status
        oseq = self.ep.order(payload.end_blob(status))
        deadline = time.monotonic() + self.opts.end_timeout
        while time.monotonic() < deadline:
            self.group.ending_tick()
            backups_done = not self.ep.view.backups() or (self.ep.order_stable(oseq)
                                                           and self.ep.backups_hold_all_received())
            if backups_done and not self.ep.buffers()["sent"] and not self.outbox.queued():
                return
            await asyncio.sleep(TICK_S)
        log.warning("the program ended, but not every backup or gateway confirmed the end within %g s "
                    "(ordering information up to %d %s, backups %s every client message, %s "
                    "messages unacknowledged, %d queued)", self.opts.end_timeout, oseq,
                    "confirmed" if self.ep.order_stable(oseq) else "not confirmed",
                    "hold" if self.ep.backups_hold_all_received() else "do not hold",
                    self.ep.buffers()["sent"], self.outbox.queued())

    def _verdict(self, status: int) -> int:
        r = self.replica
        log.info("replica %d (%s) exited with status %s", r.index, r.role, status)
        refusal = r.refusal()
        if refusal:
            self.failed = refusal
            log.error("%s", self.failed)
        if r.role == "primary":
            return status
        problem = backup_end(r, self.primary_status)   # (the primary's stdout is on its own host)
        if problem is None:
            return status
        if r.stream.diverged or status == EXIT_DIVERGED:
            what, report = r.report_divergence()
            log.error("replica %d diverged from the primary: %s.  The report is in %s.  %s", r.index, what, report,
                      r.divergence_advice())
        else:
            log.error("replica %d %s", r.index, problem)
        return EXIT_DIVERGED

    def stop(self):
        if self.replica is not None:
            stop_replicas([self.replica])

    def cleanup(self):
        if self.group is not None:
            self.group.close()
        shipper = getattr(self, "shipper", None)
        if shipper is not None and self.source is None:
            shipper.cancel()
        feeder = getattr(self, "feeder", None)
        if feeder is not None and feeder.is_alive():
            feeder.end()
            feeder.join(timeout=3)   # it writes into the ring we are about to unmap
        if self.replica is not None:
            release_replicas([self.replica])

    # -- what llft-status shows ------------------------------------------------
    def _log_drops(self):
        now = self.ep.drop_counts() if self.ep else {}
        new = {k: v - self._drops_logged.get(k, 0) for k, v in now.items() if v > self._drops_logged.get(k, 0)}
        if new:
            # Routine drops (stray messages of a connection retired here, the
            # group's traffic while restoring) are logged quietly.
            quiet = self.ep.expected_drops() | {RESTORING_DROP, OUTPUT_OF_RETIRED}
            level = logging.INFO if new.keys() <= quiet else logging.WARNING
            log.log(level, "dropped datagrams/messages: %s (total %d)",
                    ", ".join(f"{k} +{v}" for k, v in sorted(new.items())), sum(now.values()))
            self._drops_logged = now

    def write_state(self, phase: str):
        self._log_drops()   # the drops llft-status shows are in the log already
        view, r = self.ep.view, self.replica
        rank = view.ranks()
        members = [{"member": m, "role": "primary" if m == view.primary else "backup",
                    "precedence": p, "rank": rank[m], "here": m == self.me}
                   for m, p in sorted(view.precedences.items(), key=lambda kv: rank[kv[0]])]
        rundir.write_state(self.run_dir, {
            "group": self.opts.group, "group_id": self.gid, "phase": phase, "controller_pid": os.getpid(),
            "argv": self.argv, "member": self.me, "view": {"pvn": view.pvn, "primary": view.primary},
            "members": members,
            "replicas": [dict(r.state(),
                              follow=None if self.ep.is_primary else self.follow.view(r.index),
                              outputs=self.relay.output_summary() if hasattr(self, "relay") else {},
                              outputs_kept=len(self.relay.outputs) if hasattr(self, "relay") else 0,
                              datagrams=self.datagrams.summary(), datagrams_held=self.datagrams.held(),
                              outgoing=self.outgoing.summary() if hasattr(self, "outgoing") else {})] if r else [],
            "messaging": self.ep.stats(), "generated": self.outbox.generated() if hasattr(self, "outbox") else {},
            "group_port": self.opts.group_port, "addresses": host_addresses(), "history": self.history.summary(),
            "last_checkpoint": self.checkpoints.last,
            # The fault timeout (rank 2's) applied now: longer than configured after long silences (detector.py)
            "fault_timeout_ms": {"configured": round(self.opts.fault_timeout * 1000, 1),
                                 "applied": round(self.group.fault_timeout_applied(self.opts.fault_timeout) * 1000, 1)
                                 if self.group is not None else None},
            # CLOCK_MONOTONIC times of this member's last primary change, for bench/cluster.py
            "failover_at": dict(self.group.failover_times() if self.group is not None else {},
                                promoted=getattr(getattr(self, "feeder", None), "promoted_at", None)),
        })
