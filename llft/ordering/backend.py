"""The seam between the replication core and an ordering backend, as the
core's record pump uses it on one host: the primary's OrderInfo, in
chunks of whole record groups, carried in one order to every backup's
ring.  The core decides roles and failovers; a backend carries.

The pump (llft/determinizer/forwarder.py) holds its join lock while it
saves a chunk to the group's history and `send`s it, and while a catch-up
`add`s a replacement, so that a chunk is either in the history the
replacement replays or reaches it through the backend, never both nor
neither.  Before a view change (PROMOTE) and at the end of the stream
(END) the pump calls `flush`: the cut at which every surviving member has
every chunk of the old view."""
from __future__ import annotations

import abc


class UnknownOrder(ValueError):
    pass


class RecordOrdering(abc.ABC):
    name = ""

    @abc.abstractmethod
    def add(self, sink) -> None:
        """sink (a BackupSink) gets every chunk sent after this returns."""

    @abc.abstractmethod
    def send(self, chunk: bytes) -> None:
        """Fix chunk's place in the order; never blocks (join lock held)."""

    def deliver(self) -> None:
        """Called by the pump, outside the join lock, after each send: a
        backend that delivers from threads of its own does nothing here."""

    @abc.abstractmethod
    def remove(self, sink, crashed: bool) -> None:
        """No more chunks for sink: it takes over (crashed=False) or has
        failed (crashed=True: the backend's membership is told)."""

    @abc.abstractmethod
    def flush(self, timeout: float) -> bool:
        """Wait until every chunk sent is in every live member's ring."""

    @abc.abstractmethod
    def members(self) -> list:
        """The sinks that get chunks, live or not."""

    def counters(self) -> dict:
        """What llft-status shows of the backend."""
        return {}

    def close(self) -> None:
        pass


def ordering_for(name: str, run_id: str, options, stream: int = 0) -> RecordOrdering:
    """The backend --order names, for a group on one host: for the
    stream of its replicas' first processes (stream 0), or of the
    processes they fork (their stream id: native/fork_stream.c)."""
    if name == "llft":
        from llft.ordering.llmp.local import RingFeed
        return RingFeed()
    if name == "mailbox":
        from llft.ordering.mailbox.backend import MailboxOrdering
        return MailboxOrdering(run_id, copies=options.mailbox_copies, protocol=options.mailbox_protocol,
                               stream=stream)
    raise UnknownOrder(f"no ordering backend named {name!r} (there are: {', '.join(ORDERS)})")


ORDERS = ("llft", "mailbox")
