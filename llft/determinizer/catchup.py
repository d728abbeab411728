"""Catching up a replica that joins a running group (log-based rejoin).

The forwarder keeps every chunk of OrderInfo it forwards in a saved stream
(the group's whole history, across failovers, or what followed the stored
checkpoint: llft/checkpoint/stored.py).  A new backup's ring is fed
from that file first, by a thread of its own, so the other backups never
wait for it; once it has been given everything written so far, it joins
the ordering backend under the forwarder's lock, and every later chunk
comes through the backend like any backup's: no record is missed or given
twice, and the joiner sees one continuous stream."""
from __future__ import annotations

import logging
import threading
import time

from llft.determinizer.streams import WRITE_TIMEOUT_MS, SavedStreamWriter, read_frames
from llft.native import StreamError, count_groups

log = logging.getLogger("llft.catchup")


class CatchUpFeeder(threading.Thread):
    """start: where in the saved stream the joiner's history begins (a
    stored checkpoint's ring holds what precedes it, and records: as many
    record groups as it was given before)."""

    def __init__(self, forwarder, sink, start: int = SavedStreamWriter.HEADER, records: int = 0):
        super().__init__(name=f"llft-catchup-{sink.replica}", daemon=True)
        self.forwarder = forwarder
        self.sink = sink
        sink.joined.clear()
        self.start_at = start
        self.records = records    # record groups given, from the history and before it
        self.started_at = time.monotonic()
        self.joined_at: float | None = None
        self.error: str | None = None

    def run(self):
        fwd = self.forwarder
        try:
            with open(fwd.saver.path, "rb") as f:
                f.seek(self.start_at)
                while not self.sink.dead:
                    with fwd.lock:
                        end = fwd.saver.flush()
                        if f.tell() == end:
                            if fwd.ended:   # the group has ended meanwhile: so does this stream
                                self._write_end()
                            else:
                                fwd.ordering.add(self.sink)
                            self.joined_at = time.monotonic()
                            self.sink.joined.set()
                            return
                    while f.tell() < end and not self.sink.dead:
                        self._write(read_frames(f, end))
        except (OSError, StreamError) as e:
            self.error = f"cannot read the group's history: {e}"
            log.error("replica %d: %s", self.sink.replica, self.error)
            self.sink.dead = True

    def _write(self, chunk: bytes):
        self.records += count_groups(chunk)
        if not self.sink.dead and not self.sink.feed(chunk, WRITE_TIMEOUT_MS):
            log.info("replica %d died while catching up", self.sink.replica)

    def _write_end(self):
        if not self.sink.stream.write_end(self.forwarder.source.exit_status, timeout_ms=2000):
            log.warning("replica %d: could not mark the end of its stream", self.sink.replica)
