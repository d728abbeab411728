"""The OrderInfo stream between hosts.  At the primary, RecordShipper reads
its replica's ring and hands the records, cut into ordering-information
blobs, to the event loop (which gives them to messaging), with the ring
position they reach, so that output can wait for the records made before
it.  At a backup, RecordFeeder writes what messaging delivered into its
replica's replay ring, on a thread of its own because a full ring blocks."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

from llft.cluster import priority
from llft.cluster.payload import records_blob
from llft.determinizer.streams import WRITE_TIMEOUT_MS, BackupSink
from llft.native import ROLE_PRIMARY, StreamError, split_groups

log = logging.getLogger("llft.records")

READ_SLOTS = 4097 * 2     # room for the largest record group
BLOB_BYTES = 4096         # ordering information per blob (messaging piggybacks up to 8 KiB per message)
PROMOTION_POLL_S = 0.0005
SHIP_DELAY_S = 0.001      # the thread ships what no message asked for this much later


class RecordShipper(threading.Thread):
    """Started early and idle until go(): a backup's is ready when it takes
    over, so that starting a thread is not on the view change's path.

    Output commit makes each of the primary's messages wait until the
    records made before it are shipped, so the event loop ships them itself
    when a message needs them (pull), without waiting for this thread to be
    woken, to read and to hand them over.  The thread ships the records no
    message asked for, a little later (SHIP_DELAY_S): records then ride in
    fewer, larger entries (at real-time priority it woke for every record,
    3 entries a request).  Whoever reads the ring does so under one lock and
    queues what it read in ring order; only the loop takes from the queue."""

    def __init__(self, source, loop, ship, done):
        super().__init__(name="llft-shipper", daemon=True)
        self.source, self.loop, self.ship, self.done = source, loop, ship, done
        self.records_bytes = 0
        self.reported: int | None = None   # the ring position last queued for the loop
        self.error: str | None = None
        self._go = threading.Event()
        self._cancelled = False
        self._lock = threading.Lock()
        self._read: deque[tuple[list[bytes], int]] = deque()   # (blobs, ring position), in ring order

    def go(self):
        self._go.set()

    def cancel(self):
        """Never needed (a backup that leaves the group): the thread ends."""
        self._cancelled = True
        self._go.set()

    def run(self):
        priority.below_event_loop()   # (priority.py)
        self._go.wait()
        if self._cancelled:
            return
        try:
            while True:
                if self._read_all():
                    self.loop.call_soon_threadsafe(self.drain)
                if self.source.finished():
                    if self._read_all():
                        self.loop.call_soon_threadsafe(self.drain)
                    break
                if self.source.stream.role != ROLE_PRIMARY:
                    # Taking over: the ring still holds the records its replica replays
                    # before it is primary, so wait() would return at once (a spin).
                    time.sleep(PROMOTION_POLL_S)
                    continue
                with self._lock:   # idle: once, where it starts as primary
                    queued = self._queue(self.source.stream.tail, [])
                if queued:
                    self.loop.call_soon_threadsafe(self.drain)
                self.source.wait(20)
                time.sleep(SHIP_DELAY_S)
        except StreamError as e:
            self.error = str(e)
            log.error("the primary's record stream is unusable: %s", e)
        self.loop.call_soon_threadsafe(self.done)

    def pull(self):
        """Event loop: ships at once the records the ring holds (a message waits for them)."""
        try:
            self._read_all()
        except StreamError:
            return   # (the thread reports it)
        self.drain()

    def drain(self):
        """Event loop: hands messaging what was read, in ring order."""
        while True:
            with self._lock:
                if not self._read:
                    return
                blobs, position = self._read.popleft()
            self.ship(blobs, position)

    def _read_all(self) -> bool:
        """Reads what the ring holds into the queue; True if it queued anything."""
        queued = False
        with self._lock:
            while chunk := self.source.read(READ_SLOTS):
                self.records_bytes += len(chunk)
                blobs = [records_blob(b) for b in split_groups(chunk, BLOB_BYTES)]
                queued |= self._queue(self.source.stream.tail, blobs)
        return queued

    def _queue(self, position: int, blobs: list[bytes]) -> bool:
        if blobs or position != self.reported:
            self.reported = position
            self._read.append((blobs, position))
            return True
        return False


class RecordFeeder(threading.Thread):
    END = object()
    PROMOTE = object()

    def __init__(self, index: int, stream, alive):
        super().__init__(name="llft-feeder", daemon=True)
        self.stream, self.alive = stream, alive
        self.sink = BackupSink(index, stream, alive)   # its ring: what it has been given, counted
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.exit_status: int | None = None
        self.promoted = threading.Event()       # PROMOTE is in the ring
        self.promoted_at: float | None = None   # measurement (bench/cluster.py)
        self.queued = 0                         # record chunks given (by the event loop)...
        self.written = 0                        # ...and written into the ring (by this thread)

    def feed(self, slots: bytes):
        self.queued += 1
        self.q.put(slots)

    def caught_up(self) -> bool:
        """Every chunk given so far is in the ring."""
        return self.written == self.queued

    def end(self, exit_status: int | None = None):
        """The stream ends after the records queued so far; the primary's
        program exited with exit_status (None: unknown)."""
        self.exit_status = exit_status
        self.q.put(self.END)

    def promote(self) -> threading.Event:
        """After the records queued so far, the replica takes over as primary;
        the event is set once PROMOTE is in its ring."""
        self.q.put(self.PROMOTE)
        return self.promoted

    def run(self):
        priority.below_event_loop()   # (priority.py)
        while True:
            item = self.q.get()
            if item is self.PROMOTE:
                if not self.stream.write_promote(timeout_ms=5000):
                    log.error("could not tell the replica to take over")
                self.promoted_at = time.monotonic()
                self.promoted.set()
                continue
            if item is self.END:
                if self.alive() and not self.stream.write_end(self.exit_status, timeout_ms=2000):
                    log.warning("could not mark the end of the replica's stream")
                return
            if not self.sink.feed(item, WRITE_TIMEOUT_MS):
                return
            self.written += 1
