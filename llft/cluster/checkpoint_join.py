"""A newcomer across hosts brought up from a checkpoint of the primary's
replica (LLFT §IV-C: a new backup is a checkpoint taken at an exact point
of the ordering stream plus the log after it; docs/checkpoints.md).

A member keeps the group's history for newcomers only up to
--history-limit (history.py).  Past it, a newcomer that asks to join is
given a checkpoint instead, taken on demand (NewcomerCheckpoint):

- once CRIU has started and is about to freeze the replica (not before:
  its start-up takes 30-50 ms, criu.dump), the client input the member
  receives is held back until every byte of it is in the program's
  sockets (at most DRAIN_S; a program that reads nothing of a connection
  for that long is not checkpointed: the newcomer is told why and may ask
  again), and flows again from the checkpoint's instant (new connections
  wait until the listeners' queues, taken out for the dump, are given
  back);
- then the primary is held still (llft/checkpoint/quiesce.py) and CRIU
  freezes it; at that instant, in the event loop, the records its ring
  holds are shipped, and what the newcomer needs besides the image is
  taken at once (`_cut`): the ring's control block, the last ordering
  entry, and per connection its messaging state, the output the program
  wrote that no message numbered yet, what the program has not read, and
  how its socket was set up.  The newcomer joins the view then: from that
  instant the ordering information and the clients' messages are kept for
  it, as for a newcomer given the history;
- CRIU writes the image while the primary runs on; the image, listed and
  checked (llft/checkpoint/images.py), goes with the cut to the newcomer
  alone, over state_transfer.py's channel (a one-time token; an HMAC with
  the group's key computed as it is sent), sent from the files CRIU
  wrote (FileState: a directory of its own per checkpoint, removed once
  the offer is withdrawn); neither end holds the image in memory.

The newcomer (NewcomerRestore) has the image written into its directory
as it arrives (newcomer_images), makes its ring from the
control block (role COPY: it becomes a backup at its first call), gives the
restored program a socket for each of its own (primed with what it had
not read, listeners with the connections waiting in them), and its relay
and reply stream go on from the cut: it replays exactly what the primary
recorded after the checkpoint, and cuts its output where the primary did.

Carried: TCP client connections, their listeners, stdout and stderr, and
with private files what the replica wrote (its upper layers, as a tar
archive).  Not carried (the newcomer is refused, with the reason): UDP
ports, outgoing connections.  The program, its libraries and llft must
be installed alike on both hosts (CRIU restores file mappings by path)."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import socket
import time
from pathlib import Path

import msgpack

from llft import private_files
from llft.checkpoint import criu, images, quiesce, restore, sockets
from llft.checkpoint.clone import waiting_conns
from llft.cluster import payload
from llft.cluster.state_transfer import FileState
from llft.determinizer.streams import image_dir, stream_path
from llft.members import start_time
from llft.ordering.group import CheckpointRefused
from llft.ordering.ids import ConnId
from llft.native import ROLE_BACKUP, ROLE_COPY, StreamError, StreamFile
from llft.replica import RestoredReplica

log = logging.getLogger("llft.checkpoint")

DRAIN_S = 2.0            # the most the input waits to be all in the program's sockets
FROZEN_STEP_S = 5.0      # the most the cut waits for the event loop
GIVE_BACK_S = 5.0        # the most it waits for room in a listener's queue
IMAGE_NUMBER = 99        # the newcomer's image directory's number (llft-<pid>-ck99)
TAKEN_NUMBERS = itertools.count(100)   # the primary's: one directory per checkpoint, kept while offered


# What a newcomer's restore may fail with (the state is authenticated, but
# may come from a primary of another version).
RESTORE_ERRORS = (restore.RestoreFailed, images.DamagedImage, OSError, KeyError, TypeError, ValueError,
                  StreamError)


def offered_state(state: dict, images_dir: Path) -> FileState:
    """A newcomer's state as the state-transfer channel carries it: the
    state itself, and the image's files from images_dir as they are sent."""
    return FileState(msgpack.packb(state, use_bin_type=True), images_dir, sorted(state["checkpoint"]["listed"]))


def newcomer_images(checkpoint_dir: str | None) -> Path:
    """Where a newcomer has the primary's image written as it arrives."""
    return Path(image_dir(f"{os.getpid()}", IMAGE_NUMBER, checkpoint_dir))


class NewcomerCheckpoint:
    """One checkpoint of this member's replica for a newcomer: of the
    primary, or of a backup the primary asked (backup_checkpoint.py)."""

    def __init__(self, member, newcomer: int, on_cut=None):
        self.m = member
        self.newcomer = newcomer
        self.on_cut = on_cut        # fn(): the newcomer joins the view, at the cut's instant (None: it has)
        self.of_primary = member.ep.is_primary
        self.loop = asyncio.get_running_loop()
        self.images = Path(image_dir(f"{os.getpid()}", next(TAKEN_NUMBERS), member.opts.checkpoint_dir))
        self.cut: dict | None = None
        self.taken: list[tuple[socket.socket, list[socket.socket]]] = []   # listeners' queues, given back
        self.held = False

    async def take(self) -> dict:
        """The cut for the newcomer, its image in self.images (the caller's
        to remove).  CheckpointRefused (nothing left behind) if none can be
        taken."""
        m, r = self.m, self.m.replica
        if m.opts.serialize:
            raise CheckpointRefused("a replica under --serialize is not checkpointed")
        shutil.rmtree(self.images, ignore_errors=True)
        self.images.mkdir(parents=True)
        started = time.monotonic()
        try:
            r.checkpointing = True
            try:
                stats = await asyncio.to_thread(criu.dump, r.pid, self.images, externals=self._externals(),
                                                on_frozen=self._frozen, before_freeze=self._before_freeze)
            finally:
                self._let_go()
                r.checkpointing = False
                m.intake.set()
                m.release_order()
                await asyncio.to_thread(self._give_back)
            await asyncio.to_thread(restore.no_parent_death_signal, self.images)
            listed = await asyncio.to_thread(images.manifest, self.images)
        except (criu.CheckpointFailed, quiesce.QuiesceFailed, images.DamagedImage, OSError) as e:
            logs = m.run_dir / "checkpoints" / "for-newcomer"
            restore.keep_logs(self.images, logs)
            shutil.rmtree(self.images, ignore_errors=True)
            raise CheckpointRefused(f"the {self.source()}'s checkpoint failed: "
                                    f"{str(e).replace(str(self.images), str(logs))}") from None
        except BaseException:
            shutil.rmtree(self.images, ignore_errors=True)
            raise
        cut = dict(self.cut, listed={k: list(v) for k, v in listed.items()})
        self.figures = {"at": time.time(), "frozen_ms": round(stats.get("frozen_time", 0) / 1000, 1),
                        "image_bytes": image_bytes(cut),
                        "took_ms": round((time.monotonic() - started) * 1000, 1)}
        log.warning("checkpoint of the %s for newcomer %d: frozen %.1f ms, image %d KiB, %.0f ms in all; the cut "
                    "carries %d records to replay, %d ordering entries to apply and %d client messages to take",
                    self.source(), self.newcomer, self.figures["frozen_ms"], self.figures["image_bytes"] // 1024,
                    self.figures["took_ms"], m.replica.stream.snapshot_records(cut["ring"]), len(cut["held"]),
                    sum(len(c[13]) for c in cut["conns"]))
        return cut

    def source(self) -> str:
        return "primary" if self.of_primary else "backup"

    async def _drained(self):
        """Every client byte received is in the program's sockets, and a
        backup's ring holds every record given to it."""
        m = self.m
        deadline = time.monotonic() + DRAIN_S
        while not (m.relay.input_drained() and not m.unopened):
            if time.monotonic() > deadline:
                raise CheckpointRefused(f"the program did not take the clients' input within {DRAIN_S:g} s")
            await asyncio.sleep(0.001)
        while not (self.of_primary or m.feeder.caught_up()):
            if time.monotonic() > deadline:
                raise CheckpointRefused(f"the replica's ring did not take the records given to it within "
                                        f"{DRAIN_S:g} s (it lags)")
            await asyncio.sleep(0.001)

    def _externals(self) -> list[str]:
        r = self.m.replica
        self.files_at_dump = restore.controller_files(r.pid, r.stream.path, r.out_dir)
        return ([f"unix[{ino}]" for _fd, ino, _peer in sockets.foreign_peers(r.pid)]
                + [key for _fd, key, _what in self.files_at_dump])

    def _before_freeze(self):
        """In CRIU's thread, CRIU started and about to freeze the replica
        (not before: its start-up takes 30-50 ms, criu.dump): the clients'
        input stops and drains into the program, and a primary is held
        still (quiesce.py) until it is frozen (_frozen)."""
        asyncio.run_coroutine_threadsafe(self._stop_input(), self.loop).result(DRAIN_S + FROZEN_STEP_S)
        if self.of_primary:
            quiesce.hold(self.m.replica.stream, self.m.replica.pid)
            self.held = True

    async def _stop_input(self):
        m = self.m
        m.intake.clear()
        if not self.of_primary:
            # What is ordered from here on is not applied before the cut,
            # which carries it (_cut_in_loop): the ring copied then holds
            # every record given to it.
            m.hold_order()
        await self._drained()

    def _let_go(self):
        if self.held:
            quiesce.release(self.m.replica.stream)
            self.held = False

    def _frozen(self) -> list[str]:
        """In CRIU's thread, the primary frozen: the cut, in the event loop."""
        try:
            externals = asyncio.run_coroutine_threadsafe(self._cut_in_loop(), self.loop).result(FROZEN_STEP_S)
        finally:
            self._let_go()
        r = self.m.replica
        self.files_at_dump = restore.controller_files(r.pid, r.stream.path, r.out_dir)
        self.cut["files"] = [list(f) for f in self.files_at_dump]
        self.cut["uppers"] = private_files.pack_uppers(r.files_dir) if r.private_files else None
        return externals + [key for _fd, key, _what in self.files_at_dump]

    async def _cut_in_loop(self) -> list[str]:
        m = self.m
        # (A backup may take its cut before it follows the newcomer's
        # AcceptBackup: what matters is that the primary's begin() came first.)
        if m.ep.is_primary != self.of_primary or m.group.taking_over or not m.replica.alive():
            raise CheckpointRefused("the primary changed meanwhile")
        m.replica.channel._readable()     # what the program said on its channel before it froze
        if self.of_primary:
            m.shipper.pull()              # every record it made, into the ordering information
            ring, oseq, held = m.replica.stream.snapshot(), m.ep.ordered_upto(), []
            delivered = m.replica.stream.records
        else:
            # Its ring, with the records it has yet to replay; what was
            # ordered since hold_order() follows in the cut's history.
            if not m.feeder.caught_up():
                raise CheckpointRefused("the replica's ring had not taken every record given to it")
            ring, oseq = m.replica.stream.snapshot(records=True), m.ep.ordered_upto()
            held, delivered = [[k, b] for k, b in m.order_held], m.feeder.sink.delivered
        externals, program = self._program_sockets()
        self.pending: dict[int, bytes] = {}   # per connection, what the program wrote that the relay had not read
        self.closing: list[int] = []          # connections the program closed, their end not yet read
        conns = [self._connection(cid, program.get(m._conn_num(cid))) for cid in m.ep.connections()]
        self.cut = {"ring": ring, "oseq": oseq, "held": held, "delivered": delivered, "source": self.source(),
                    "conns": conns,
                    "relay": m.relay.summary_state(self.pending), "closing": self.closing,
                    "channel": self.channel, "listeners": self.listeners,
                    "tombstones": m.ep.forgotten(),
                    "retired": [[*cid, n] for cid, n in m.ep.retired().items()],
                    "next_open": [[c, s] for c, s in m.next_open.items()],
                    "stdout": (m.replica.out_dir / "stdout").read_bytes(),
                    "stderr": (m.replica.out_dir / "stderr").read_bytes()}
        if self.on_cut is not None:
            self.on_cut()
        # What comes from here on is the newcomer's by messaging: the clients'
        # input flows again (into the frozen program's sockets, which the
        # image leaves out); only new connections wait for the listeners'
        # queues to be given back.
        m.intake.set()
        m.release_order()
        return externals

    def _program_sockets(self) -> tuple[list[str], dict[int, dict]]:
        """Each of the program's sockets that leads to this controller:
        CRIU's key, how it is set up, what it has not read.  Returns the
        externals and, per connection id, its socket's."""
        m, r = self.m, self.m.replica
        ends = m.relay.our_ends()
        listeners = {sockets.inode(s): key for key, s in r.channel.listeners.items()}
        channel = sockets.inode(r.channel.ours)
        externals, seen, program = [], set(), {}
        self.channel, self.listeners = None, []
        r.channel.handing_held = True   # until the listeners' queues are given back (_give_back)
        for fd, ino, peer in sockets.foreign_peers(r.pid):
            if ino in seen:
                continue   # a second fd of one socket
            seen.add(ino)
            externals.append(f"unix[{ino}]")
            with sockets.take_fd(r.pid, fd) as sock:
                setup = sockets.settings(sock)
                if peer == channel:
                    self.channel = [f"socket:[{ino}]", setup]
                elif peer in listeners:
                    waiting = sockets.take_handed(sock)
                    self.taken.append((r.channel.listeners[listeners[peer]], waiting))
                    queued = [[conn_id, sockets.unread(s), sockets.settings(s)]
                              for s, conn_id in waiting_conns(waiting, ends)]
                    self.listeners.append([listeners[peer], f"socket:[{ino}]", setup, queued])
                    program.update((conn_id, {"queued": True}) for conn_id, _in, _set in queued)
                elif peer in ends:
                    program[ends[peer]] = {"key": f"socket:[{ino}]", "settings": setup,
                                           "input": sockets.unread(sock)}
                else:
                    raise CheckpointRefused(f"its fd {fd} is a socket llft cannot carry to another host (an "
                                            "outgoing connection or a UDP port)")
        if self.channel is None:
            raise CheckpointRefused("the program's channel to llft is not open")
        return externals, program

    def _connection(self, cid: ConnId, program: dict | None) -> list:
        """What the newcomer needs of one connection: its messaging state,
        where its output stands, and the program's side of it."""
        m = self.m
        if m.datagrams.handles(cid) or m.outgoing.handles(cid):
            raise CheckpointRefused("the program has UDP ports or outgoing connections, which a checkpoint "
                                    "does not carry to another host")
        consumed, acked, _logged_from = m.ep.connection_state(cid)
        # Messages released to the program but not yet taken (the input
        # waits): the newcomer takes them from the cut, as it may not get
        # them again (the group watermark may have freed them).
        inputs = m.ep.unconsumed(cid)
        consumed += len(inputs)
        numbered = m.ep.sent_count(cid)
        start, buf, closed, close_sent, input_ended, cuts = m.output.cut_state(cid)
        # Messages waiting for messaging's window are not numbered yet: the
        # primary orders where it cut them when it sends them, and the
        # newcomer cuts its own there, so their bytes are the newcomer's to
        # cut; a backup cut them where the primary did, so the newcomer
        # takes those cuts first.
        waiting = [payload.parse_reply(body) for body, _order_info in m.outbox.waiting.get(cid, ())]
        if waiting:
            if waiting[-1][0] == payload.CLOSE:
                close_sent = False
            data = [w for w in waiting if w[0] == payload.DATA]
            if data:
                start, buf = data[0][1], b"".join(w[2] for w in data) + buf
            if not self.of_primary:
                cuts = [[w[1] + len(w[2]), False] if w[0] == payload.DATA else [w[1], True]
                        for w in waiting] + cuts
        num = m._conn_num(cid)
        relay_side = None
        if program is not None and not program.get("queued"):
            pending = m.relay.output_pending(num)
            relayed = m.relay.outputs[num].bytes
            if relayed != start + len(buf):
                raise CheckpointRefused(f"connection {tuple(cid)}: the relay took {relayed} bytes of the program's "
                                        f"output, its messages end at {start + len(buf)}")
            relay_side = [program["key"], program["settings"], program["input"], relayed + len(pending)]
            buf += pending
            self.pending[num] = pending
        elif program is None and num in m.relay.writers:
            # The program closed it; the relay has yet to read what it wrote before.
            pending = self.pending[num] = m.relay.output_pending(num)
            buf += pending
            closed = True
            self.closing.append(num)
        return [cid.client, cid.server, cid.seq, consumed, acked, numbered, start, buf, closed, close_sent,
                input_ended, relay_side, cuts, inputs]

    def _give_back(self):
        """The connections taken from the listeners' queues go back, in order."""
        taken, self.taken = self.taken, []
        for e in sockets.give_back(taken, GIVE_BACK_S):
            log.error("a connection waiting to be accepted could not be given back (%s)", e)
        self.loop.call_soon_threadsafe(setattr, self.m.replica.channel, "handing_held", False)


def image_bytes(cut: dict) -> int:
    return sum(size for size, _crc in cut["listed"].values())


# -- at the newcomer ---------------------------------------------------------------
class NewcomerRestore:
    """The newcomer's replica, restored from the primary's checkpoint."""

    def __init__(self, member, index: int, cut: dict):
        self.m, self.index, self.cut = member, index, cut
        self.images = newcomer_images(member.opts.checkpoint_dir)
        self.inherit: list[tuple[socket.socket, str]] = []
        self.adopted: list[tuple[int, socket.socket, int, bytes]] = []   # (conn id, our end, output at, input)
        self.inputs: list[tuple[ConnId, list[bytes]]] = []   # messages released at the source, not taken
        self.stdio: dict = {}

    async def run(self) -> RestoredReplica:
        """The restored replica; RestoreFailed, DamagedImage or OSError if not."""
        started = time.monotonic()
        self.replica: RestoredReplica | None = None
        try:
            r = self._prepare()
            pid, proc = await asyncio.to_thread(restore.restore, self.images, self.listed, self.files,
                                                self.inherit, r.stream.path, self.stdio, self.files_plan)
        except restore.RestoreFailed as e:
            self._undo()
            raise restore.RestoreFailed(str(e).replace(str(self.images), str(self._keep_logs()))) from None
        except BaseException:
            self._undo()
            self._keep_logs()
            raise
        finally:
            for sock, _key in self.inherit:
                sock.close()
            for f in self.stdio.values():
                f.close()
            shutil.rmtree(self.images, ignore_errors=True)
        r.proc, r.program_pid, r.started = proc, pid, start_time(pid)
        r.checkpoint = {"restore_ms": round((time.monotonic() - started) * 1000, 1),
                        "image_bytes": image_bytes(self.cut)}
        r.channel.started()
        quiesce.release(r.stream)   # its threads, held at a call's entry, go on as a backup's
        return r

    def _keep_logs(self) -> Path:
        """CRIU's logs of a failed restore, kept in the run dir (the image goes)."""
        logs = self.m.run_dir / "checkpoints" / "restored"
        restore.keep_logs(self.images, logs)
        return logs

    def _undo(self):
        for _conn, ours, _at, _in in self.adopted:
            ours.close()
        self.adopted = []
        if self.replica is not None:
            self.replica.channel.close()
            self.replica.stream.close()
            self.replica.stream.unlink()

    def _prepare(self) -> RestoredReplica:
        m, cut, k = self.m, self.cut, self.index
        # (the image's files are in self.images: the fetch wrote them there,
        # each name checked; images.check holds them to the listing)
        self.listed = {name: tuple(v) for name, v in cut["listed"].items()}
        self.files = [tuple(f) for f in cut["files"]]
        out_dir = m.run_dir / f"replica-{k}"
        out_dir.mkdir(exist_ok=True)
        for name in ("stdout", "stderr"):
            (out_dir / name).write_bytes(cut[name])
            self.stdio[name] = open(out_dir / name, "ab")
        path = stream_path(f"{os.getpid()}", k)
        if os.path.exists(path):
            os.unlink(path)
        stream = StreamFile(path, create=True, slots=m.opts.ring_slots, role=ROLE_BACKUP, replica=k)
        r = self.replica = RestoredReplica(k, stream, out_dir, serialize=m.opts.serialize, source=-1,
                                           private_files=cut["uppers"] is not None)
        stream.load_snapshot(cut["ring"], k)
        if cut["source"] == "primary":
            stream.role = ROLE_COPY   # (a backup's image replays on as a backup)
        stream.set_timeouts(stall_ms=m.opts.stall_timeout_ms, end_grace_ms=m.opts.end_grace_ms)
        self.files_plan = None
        if r.private_files:
            self.files_plan = private_files.prepare(r.files_dir)
            private_files.unpack_uppers(r.files_dir, cut["uppers"])
        key, setup = cut["channel"]
        sockets.apply_settings(r.channel.theirs, setup)
        self.inherit.append((r.channel.theirs, key))
        for lkey, key, setup, queued in cut["listeners"]:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ours.setblocking(False)
            r.channel.listeners[lkey if not isinstance(lkey, list) else tuple(lkey)] = ours
            sockets.apply_settings(theirs, setup)
            self.inherit.append((theirs, key))
            for conn_id, unread, conn_setup in queued:
                mine, program_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                sockets.apply_settings(program_end, conn_setup)
                sockets.send_handed(ours, program_end, 0.0)
                program_end.close()
                # (the relay's count of its output, as the source's summary has it)
                self.adopted.append((conn_id, mine, cut["relay"]["outputs"][conn_id][0], unread))
        for c in cut["conns"]:
            relay_side = c[11]
            if relay_side is None:
                continue
            key, setup, unread, output_at = relay_side
            mine, program_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            sockets.apply_settings(program_end, setup)
            self.inherit.append((program_end, key))
            self.adopted.append(((c[0] << 32) | c[2], mine, output_at, unread))
        return r

    def adopt_connections(self) -> None:
        """The messaging state and reply streams of the cut's connections."""
        m, ep = self.m, self.m.ep
        ep.adopt_forgotten(self.cut["tombstones"])
        for client, server, seq, sent in self.cut["retired"]:
            ep.retire(ConnId(client, server, seq), sent)
        for client, seq in self.cut["next_open"]:
            m.next_open[int(client)] = int(seq)
        for (client, server, seq, consumed, acked, numbered, start, buf, closed, close_sent, input_ended,
             _relay, cuts, inputs) in self.cut["conns"]:
            cid = ConnId(client, server, seq)
            ep.adopt_connection(cid, consumed, acked, numbered + 1)
            ep.number_from(cid, numbered)
            m.output.adopt(cid, start, buf, closed, close_sent, input_ended, cuts)
            m._conn_num(cid)
            if inputs:
                self.inputs.append((cid, inputs))

    async def relay_connections(self) -> None:
        """The program's connections, to the relay: what it had not read first."""
        m = self.m
        said = self.cut["relay"]
        m.relay.adopt_summary(said, set(self.cut["closing"]))
        for conn_id, mine, output_at, unread in self.adopted:
            await m.relay.adopt(conn_id, mine, output_at, said["outputs"][conn_id][2:])
            if unread:
                m.relay.data(conn_id, unread)
            cid = m.cids.get(conn_id)
            p = m.output.conns.get(cid) if cid is not None else None
            if p is not None and p.input_ended:
                m.relay.eof(conn_id)
        self.adopted = []
        for cid, bodies in self.inputs:
            for body in bodies:
                m._request(cid, body)
        self.inputs = []
