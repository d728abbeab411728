"""The `llft` backend on one host: the primary's order is the order of its
ring, and the pump writes each chunk straight into every backup's ring
(shared memory), in the pump's own thread."""
from __future__ import annotations

from llft.ordering.backend import RecordOrdering


class RingFeed(RecordOrdering):
    name = "llft"

    def __init__(self):
        self._sinks: list = []
        self._pending: list[tuple[bytes, list]] = []

    def add(self, sink) -> None:
        self._sinks.append(sink)

    def send(self, chunk: bytes) -> None:
        # The sinks as they are now: one added later got chunk from the history.
        self._pending.append((chunk, list(self._sinks)))

    def deliver(self) -> None:
        while self._pending:
            chunk, sinks = self._pending.pop(0)
            for sink in sinks:
                sink.give(chunk)

    def remove(self, sink, crashed: bool) -> None:
        if sink in self._sinks:
            self._sinks.remove(sink)

    def flush(self, timeout: float) -> bool:
        self.deliver()
        return True

    def members(self) -> list:
        return list(self._sinks)
