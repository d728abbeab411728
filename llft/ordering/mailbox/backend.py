"""The `mailbox` backend on one host: the primary's record chunks reach
the backups through a replicated shared-memory mailbox (n copies, each a
segment of its own; up to n − 1 of them may fail).

One sender thread batches the chunks the pump sends, numbered in the
pump's order, into mailbox messages; one receiver thread per backup
takes the mailbox's messages in the mailbox's order and writes the
chunks into the backup's ring in number order.  The numbers make each
ring's stream exact whatever the mailbox decided: threads of one Python
process can overrun the protocols' time bounds (the GIL, the scheduler),
and a message so delayed may be rejected by every receiver.  So the
sender keeps each chunk until every backup has it, and sends again what
a backup has lacked for longer than a message takes to be delivered;
a receiver skips what it has and holds what comes early until the gap
is filled.  A backup that fails is reported to the mailbox's
membership, which frees the messages it held up."""
from __future__ import annotations

import logging
import os
import struct
import threading
import time

from llft.ordering.backend import RecordOrdering
from llft.ordering.mailbox import membership, server
from llft.ordering.mailbox.config import Timing
from llft.ordering.mailbox.mailbox import AllCopiesCrashed, Mailbox
from llft.ordering.mailbox.protocol1 import Receiver1
from llft.ordering.mailbox.protocol2 import Receiver2
from llft.ordering.mailbox.segment import MailboxFull
from llft.ordering.mailbox.steps import Clock, Stopped, run

log = logging.getLogger("llft.ordering")

MS = 1_000_000
# Bounds for threads of one Python process: a step takes tens of
# microseconds, but the GIL and the scheduler can hold a thread for
# milliseconds.  One clock for all: no skew between them.
TIMING = Timing(delta_s=5 * MS, delta_f=2 * MS, delta_d=3 * MS, delta_r=2 * MS, delta_fd=2 * MS,
                poll=1 * MS, rho=1 * MS, epsilon=2 * MS, delta_j=5 * MS, delta_l=5 * MS)
MESSAGE_BYTES = 320 * 1024   # a whole pump chunk (4096 slots of 64 bytes) and its framing
SLOTS = 48
RECEIVER_SLOTS = 32
_CHUNK = struct.Struct("<QI")   # a chunk's number and length, before its bytes


class _Member:
    """One backup's receiver: its slot in the mailbox and its thread."""

    def __init__(self, sink, slot: int, entry: int, next_seq: int):
        self.sink, self.slot, self.entry = sink, slot, entry
        self.next_seq = next_seq              # the next chunk its ring needs
        self.early: dict[int, bytes] = {}     # chunks past a gap
        self.moved = time.monotonic()         # when next_seq last moved
        self.stopped = False
        self.thread: threading.Thread | None = None


class MailboxOrdering(RecordOrdering):
    name = "mailbox"

    def __init__(self, run_id: str, copies: int = 3, protocol: int = 1, timing: Timing = TIMING,
                 directory: str = server.SHM, stream: int = 0):
        group = f"{run_id}-{os.getpid()}"
        self.mailbox_name = server.mailbox_name(group, stream)
        self.copies, self.protocol, self.timing, self.directory = copies, protocol, timing, directory
        server.create(self.mailbox_name, copies, protocol, timing, receivers=RECEIVER_SLOTS,
                      slots=SLOTS, message_bytes=MESSAGE_BYTES, directory=directory)
        if stream:
            server.fail_as(self.mailbox_name, group, copies, directory)
        self.clock = Clock()
        self._sender = self._connect(pid=1)
        self._lock = threading.Condition()
        self._queue: list[tuple[int, bytes]] = []   # (number, chunk) to send, in number order
        self._kept: dict[int, bytes] = {}           # sent, not yet in every live backup's ring
        self._next_seq = 0          # the next chunk's number
        self._sent_upto = 0         # every chunk below this number has been sent once
        self._members: list[_Member] = []
        self._closing = False
        self.stats = {"messages": 0, "chunks": 0, "resent": 0, "full": 0}
        # A chunk a backup lacks this long after it was sent is sent again:
        # well past the time a message takes to be decided and delivered.
        latency = (timing.send_bound(copies) + timing.receive_bound(copies, protocol)
                   + (timing.expiry_for(copies) if protocol == 2 else 0))
        self.resend_after = 4 * latency / 1e9
        self._thread = threading.Thread(target=self._send_loop, name="llft-mailbox-send", daemon=True)
        self._thread.start()

    def _connect(self, pid: int) -> Mailbox:
        return server.connect(self.mailbox_name, self.timing, pid=pid, clock=self.clock,
                              directory=self.directory)

    # -- the pump's side -------------------------------------------------
    def add(self, sink) -> None:
        mb = self._connect(pid=1000 + sink.replica)
        slot, entry = run(membership.join(mb), self.clock)
        # Messages get its d-flag from its entry time on: none is sent
        # before then (the pump waits in this call, holding its lock).
        while self.clock.now() <= entry:
            time.sleep((entry - self.clock.now()) / 1e9 + 1e-4)
        with self._lock:
            m = _Member(sink, slot, entry, self._next_seq)
            self._members.append(m)
        m.thread = threading.Thread(target=self._receive_loop, args=(m, mb),
                                    name=f"llft-mailbox-recv-{sink.replica}", daemon=True)
        m.thread.start()

    def send(self, chunk: bytes) -> None:
        with self._lock:
            self._queue.append((self._next_seq, chunk))
            self._next_seq += 1
            self._lock.notify_all()

    def remove(self, sink, crashed: bool) -> None:
        with self._lock:
            m = next((m for m in self._members if m.sink is sink), None)
            if m is None:
                return
            self._members.remove(m)
            m.stopped = True   # its thread ends at its next wait
        mb = self._sender
        run(membership.report_crash(mb, m.slot) if crashed else membership.disconnect(mb, m.slot), self.clock)

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                behind = [m for m in self._members
                          if not m.stopped and not m.sink.dead and m.sink.alive() and m.next_seq < self._next_seq]
                if not behind and not self._queue:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("mailbox: replicas %s still lack chunks after %.1f s",
                                [m.sink.replica for m in behind], timeout)
                    return False
                self._lock.wait(min(left, 0.01))

    def members(self) -> list:
        with self._lock:
            return [m.sink for m in self._members]

    def counters(self) -> dict:
        failed = sum(c.failed() for c in self._sender.copies)
        return dict(self.stats, backend="mailbox", copies=self.copies, protocol=self.protocol,
                    copies_failed=failed, name=self.mailbox_name, directory=self.directory)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            members = list(self._members)
            for m in members:
                m.stopped = True
            self._lock.notify_all()
        self._thread.join(timeout=2)
        for m in members:
            if m.thread is not None:
                m.thread.join(timeout=2)
        for c in self._sender.copies:
            c.close()
        server.remove(self.mailbox_name, self.copies, self.directory)

    # -- the sender ------------------------------------------------------
    def _send_loop(self) -> None:
        # Each message is decided by every receiver in n slots: sending more
        # often only queues messages; batching keeps the receivers' pace.
        pace = self.copies * self.timing.delta_d
        while True:
            with self._lock:
                self._resend_what_is_missing()
                while not self._queue and not self._closing:
                    self._lock.wait(self.resend_after)
                    self._resend_what_is_missing()
                if self._closing:
                    return
                batch, size = [], 0
                while self._queue and (not batch or size + _CHUNK.size + len(self._queue[0][1]) <= MESSAGE_BYTES):
                    seq, chunk = self._queue.pop(0)
                    batch.append((seq, chunk))
                    size += _CHUNK.size + len(chunk)
                    self._kept[seq] = chunk
                    self._sent_upto = max(self._sent_upto, seq + 1)
            payload = b"".join(_CHUNK.pack(seq, len(c)) + c for seq, c in batch)
            began = time.monotonic()
            self._send_until_on_time(payload)
            self.stats["messages"] += 1
            self.stats["chunks"] += len(batch)
            rest = pace / 1e9 - (time.monotonic() - began)
            if rest > 0:
                time.sleep(rest)

    def _resend_what_is_missing(self) -> None:
        """Under the lock: forget what every live backup has; queue again
        what one has lacked for too long (its message was rejected)."""
        live = [m for m in self._members if not m.stopped and not m.sink.dead]
        if live:
            low = min(m.next_seq for m in live)
            for seq in [s for s in self._kept if s < low]:
                del self._kept[seq]
        now = time.monotonic()
        queued = {seq for seq, _ in self._queue}
        again = set()
        for m in live:
            if m.next_seq < self._sent_upto and now - m.moved > self.resend_after:
                again.update(seq for seq in range(m.next_seq, self._sent_upto)
                             if seq in self._kept and seq not in m.early and seq not in queued)
                m.moved = now
        if again:
            self.stats["resent"] += len(again)
            self._queue = sorted(self._queue + [(seq, self._kept[seq]) for seq in again])

    def _send_until_on_time(self, payload: bytes) -> None:
        """Send until one Send ends within Δs (a later one may have been
        rejected) and there is room in the mailbox."""
        bound = self._sender.send_bound
        while not self._closing:
            began = self.clock.now()
            try:
                run(self._sender.send(payload), self.clock)
            except MailboxFull:
                self.stats["full"] += 1
                time.sleep(self.timing.delta_d * self.copies / 1e9)
                continue
            except AllCopiesCrashed:
                log.error("mailbox: every copy has failed; the backups get no more records")
                self._closing = True
                return
            if self.clock.now() - began <= bound:
                return
            self.stats["resent"] += 1

    # -- the receivers ---------------------------------------------------
    def _receive_loop(self, m: _Member, mb: Mailbox) -> None:
        def stop() -> bool:
            return m.stopped or m.sink.dead
        try:
            if self.protocol == 1:
                rec = Receiver1(mb, m.slot)
                while not stop():
                    d = run(rec.receive(), self.clock, stop)
                    if d.accepted:
                        self._take(m, d.data)
            else:
                rec2 = Receiver2(mb, m.slot, m.entry)
                run(rec2.run(lambda d: d.accepted and self._take(m, d.data), until=stop), self.clock, stop)
        except Stopped:
            pass
        except AllCopiesCrashed:
            log.error("mailbox: every copy has failed; replica %d gets no more records", m.sink.replica)

    def _take(self, m: _Member, data: bytes) -> None:
        at = 0
        while at < len(data):
            seq, n = _CHUNK.unpack_from(data, at)
            at += _CHUNK.size
            if seq >= m.next_seq:
                m.early[seq] = data[at:at + n]
            at += n
        while m.next_seq in m.early and not m.sink.dead:
            m.sink.give(m.early.pop(m.next_seq))
            if m.sink.dead:
                break
            with self._lock:
                m.next_seq += 1
                m.moved = time.monotonic()
                self._lock.notify_all()
