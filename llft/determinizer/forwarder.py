"""The record pump: reads the primary's OrderInfo stream, keeps it in the
group's history, and hands it to the ordering backend (llft/ordering/),
which carries it to every backup's ring in order.  Across a primary
change it drains the failed primary's stream, waits for the backend's
cut, and tells the successor to take over."""
from __future__ import annotations

import logging
import threading
import time

from llft.native import REC_SIZE, StreamError, count_groups
from llft.ordering.backend import RecordOrdering

log = logging.getLogger("llft.forwarder")

READ_SLOTS = 4096
# The most a view change or the stream's end waits for the backend's cut.
FLUSH_S = 10.0
# After a small chunk, let records gather a little: fewer, larger chunks cost
# this thread and the backups (woken once per chunk) much less per request,
# and only the backups, which never hold the clients up, wait longer.
BATCH_S = 0.0002
BATCH_SLOTS = 256


class RecordForwarder(threading.Thread):
    def __init__(self, source, sinks, ordering: RecordOrdering, saver=None):
        super().__init__(name="llft-forwarder", daemon=True)
        self.source = source
        self.ordering = ordering
        for sink in sinks:
            ordering.add(sink)
        self.saver = saver
        self.records = 0
        self.slots = 0
        self.sent = 0   # records handed to the backend (under lock)
        self.sent_to = self._position()   # the source's ring position they were read up to (under lock)
        self.error: str | None = None
        self.torn = 0
        self.successor = None  # (source, sink) taking over when the source fails
        self.lock = threading.Lock()   # guards the saver, ended and joins (catch-ups add sinks under it)
        self.ended = False
        self.promoting = False   # a failover is under way: from fail_over until PROMOTE is written
        self.on_chunk = None     # (chunk) -> None, for each chunk forwarded (llft/serving/routes.py)

    def fail_over(self, new_source, promoted_sink) -> threading.Event:
        """The source failed: once its last records are forwarded, promoted_sink
        takes over (it gets PROMOTE instead of END) and becomes the source; the
        other sinks go on with the new primary's records.  Returns an event
        set once PROMOTE is written."""
        with self.lock:
            self.successor = (new_source, promoted_sink, threading.Event())
            self.promoting = True
            return self.successor[2]

    def _position(self) -> int | None:
        position = getattr(self.source, "position", None)
        return position() if position else None

    def sent_all_of(self, stream) -> bool:
        """Under the lock: every record the primary's ring (stream) holds
        has been handed to the backend."""
        return self.sent_to is not None and self.sent_to == stream.head

    def run(self):
        try:
            self._pump()
        except StreamError as e:
            self.error = str(e)
            log.error("the primary's record stream is unusable: %s", e)
        finally:
            with self.lock:
                self.ended = True
                if self.saver:
                    self.saver.close()
            self.ordering.flush(FLUSH_S)
            for sink in self.ordering.members():
                if not sink.dead and not sink.stream.write_end(self.source.exit_status, timeout_ms=2000):
                    log.warning("replica %d: could not mark the end of its stream", sink.replica)

    def _pump(self):
        while True:
            chunk = self.source.read(READ_SLOTS)
            if chunk:
                self._deliver(chunk, self._position())
                if len(chunk) < BATCH_SLOTS * REC_SIZE:
                    time.sleep(BATCH_S)
                continue
            if self.source.finished():
                while chunk := self.source.read(READ_SLOTS):
                    self._deliver(chunk, self._position())
                self.torn = self.source.leftover()
                if self.torn:
                    log.warning("the primary stopped in the middle of writing %d record slot(s); "
                                "they are discarded", self.torn)
                if getattr(self.source, "error", None):
                    self.error = self.source.error
                with self.lock:
                    successor, self.successor = self.successor, None
                if successor is None:
                    return
                new_source, sink, promoted = successor
                # A successor still catching up gets the failed primary's last
                # records from the saved stream: wait until it is fed from here.
                while not sink.joined.wait(0.05):
                    if sink.dead or not sink.alive():
                        log.error("replica %d died before it caught up", sink.replica)
                        break
                self.ordering.flush(FLUSH_S)
                self.ordering.remove(sink, crashed=False)
                if not sink.stream.write_promote(timeout_ms=5000):
                    log.error("replica %d: could not tell it to take over", sink.replica)
                with self.lock:
                    self.promoting = False
                promoted.set()
                log.info("forwarding replica %d's records from here on", sink.replica)
                with self.lock:
                    self.source = new_source
                    self.sent_to = self._position()
                continue
            self.source.wait(20)

    def _deliver(self, chunk: bytes, position: int | None):
        groups = count_groups(chunk)
        self.records += groups
        self.slots += len(chunk) // REC_SIZE
        with self.lock:
            if self.saver:
                self.saver.write(chunk)
            self.ordering.send(chunk)
            self.sent += groups
            self.sent_to = position
        if self.on_chunk is not None:
            self.on_chunk(chunk)
        self.ordering.deliver()
