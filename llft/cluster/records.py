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

from llft.cluster import priority
from llft.cluster.payload import records_blob
from llft.native import REC_SIZE, ROLE_PRIMARY, StreamError, split_groups

log = logging.getLogger("llft.records")

READ_SLOTS = 4097 * 2     # room for the largest record group
BLOB_BYTES = 4096         # ordering information per blob (messaging piggybacks up to 8 KiB per message)
WRITE_TIMEOUT_MS = 100
PROMOTION_POLL_S = 0.0005


class RecordShipper(threading.Thread):
    """Started early and idle until go(): a backup's is ready when it takes
    over, so that starting a thread is not on the view change's path."""

    def __init__(self, source, loop, ship, done):
        super().__init__(name="llft-shipper", daemon=True)
        self.source, self.loop, self.ship, self.done = source, loop, ship, done
        self.records_bytes = 0
        self.reported: int | None = None   # the ring position last handed to the loop
        self.error: str | None = None
        self._go = threading.Event()
        self._cancelled = False

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
                chunk = self.source.read(READ_SLOTS)
                if chunk:
                    self._hand(chunk)
                elif self.source.finished():
                    while chunk := self.source.read(READ_SLOTS):
                        self._hand(chunk)
                    break
                elif self.source.stream.role != ROLE_PRIMARY:
                    # Taking over: the ring still holds the records its replica replays
                    # before it is primary, so wait() would return at once (a spin).
                    time.sleep(PROMOTION_POLL_S)
                else:
                    self._report(self.source.stream.tail, [])   # idle: once, where it starts as primary
                    self.source.wait(20)
        except StreamError as e:
            self.error = str(e)
            log.error("the primary's record stream is unusable: %s", e)
        self.loop.call_soon_threadsafe(self.done)

    def _hand(self, chunk: bytes):
        self.records_bytes += len(chunk)
        self._report(self.source.stream.tail, [records_blob(b) for b in split_groups(chunk, BLOB_BYTES)])

    def _report(self, position: int, blobs: list[bytes]):
        if blobs or position != self.reported:
            self.reported = position
            self.loop.call_soon_threadsafe(self.ship, blobs, position)


class RecordFeeder(threading.Thread):
    END = object()
    PROMOTE = object()

    def __init__(self, stream, alive):
        super().__init__(name="llft-feeder", daemon=True)
        self.stream, self.alive = stream, alive
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.slots = 0
        self.exit_status: int | None = None

    def feed(self, slots: bytes):
        self.q.put(slots)

    def end(self, exit_status: int | None = None):
        """The stream ends after the records queued so far; the primary's
        program exited with exit_status (None: unknown)."""
        self.exit_status = exit_status
        self.q.put(self.END)

    def promote(self):
        """After the records queued so far, the replica takes over as primary."""
        self.q.put(self.PROMOTE)

    def run(self):
        priority.below_event_loop()   # (priority.py)
        while True:
            item = self.q.get()
            if item is self.PROMOTE:
                if not self.stream.write_promote(timeout_ms=5000):
                    log.error("could not tell the replica to take over")
                continue
            if item is self.END:
                if self.alive() and not self.stream.write_end(self.exit_status, timeout_ms=2000):
                    log.warning("could not mark the end of the replica's stream")
                return
            view = memoryview(item)
            while view:
                n = self.stream.write(view, timeout_ms=WRITE_TIMEOUT_MS)
                self.slots += n
                view = view[n * REC_SIZE:]
                if n == 0 and not self.alive():
                    return
