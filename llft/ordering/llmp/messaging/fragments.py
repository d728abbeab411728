"""User-space fragmentation and reassembly of messages larger than a datagram.

A fragmented message's id is a hash of its encoded bytes.  LLFT retransmits
a Request/Reply byte for byte, so the fragments of every retransmission (from
the original sender, or re-multicast by a primary to its backups) fill the
same reassembly buffer: under 20% loss a 1 MiB message (~730 fragments)
would practically never arrive whole in one transmission, but each
retransmission fills 80% of the remaining holes.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from llft.ordering.llmp import wire
from llft.ordering.llmp.wire import DropCounters


def message_id(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") or 1


def split(keyring, dst_group: int, data: bytes, max_datagram: int) -> list[bytes]:
    return list(frames(keyring, dst_group, data, max_datagram))


def frames(keyring, dst_group: int, data: bytes, max_datagram: int) -> Sequence[bytes]:
    """The datagrams of one message; those of a fragmented one are made as they are taken."""
    room = max_datagram - wire.FRAME_OVERHEAD
    if len(data) <= room:
        return [wire.encode_frame(keyring, dst_group, 0, 0, 1, data)]
    return Frames(keyring, dst_group, data, room)


class Frames(Sequence):
    """The datagrams of a fragmented message, each framed and MACed only
    when it is taken: a transport that sends a large message a slice at a
    time spreads that work too, instead of holding its event loop for the
    whole message (a 3 MiB state transfer is ~2,100 MACs)."""

    def __init__(self, keyring, dst_group: int, data: bytes, room: int):
        self.keyring, self.dst_group, self.data, self.room = keyring, dst_group, data, room
        self.msg_id = message_id(data)
        self.count = -(-len(data) // room)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.count))]
        if i < 0:
            i += self.count
        if not 0 <= i < self.count:
            raise IndexError(i)
        return wire.encode_frame(self.keyring, self.dst_group, self.msg_id, i, self.count,
                                 self.data[i * self.room:(i + 1) * self.room])


class _Partial:
    __slots__ = ("chunks", "have", "size", "touched")

    def __init__(self, count: int, now: float):
        self.chunks: list[bytes | None] = [None] * count
        self.have = 0
        self.size = 0
        self.touched = now


class Reassembler:
    """Bounded reassembly: total bytes capped (oldest evicted), and partial
    messages that make no progress for `timeout` seconds are dropped.

    Fragments of a message completed recently are ignored: they are late
    duplicates or a retransmission someone else asked for, and would only
    leave an orphan partial behind."""

    COMPLETED = 8192

    def __init__(self, drops: DropCounters, max_bytes: int, timeout: float):
        self.drops, self.max_bytes, self.timeout = drops, max_bytes, timeout
        self._partials: OrderedDict[tuple, _Partial] = OrderedDict()
        self._completed: OrderedDict[tuple, None] = OrderedDict()
        self._bytes = 0
        self.late_fragments = 0

    def __len__(self) -> int:
        return len(self._partials)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def add(self, frame: wire.Frame, now: float) -> bytes | None:
        if frame.count == 1:
            return frame.chunk
        key = (frame.dst_group, frame.msg_id, frame.count)
        p = self._partials.get(key)
        if p is None:
            if key in self._completed:
                self.late_fragments += 1
                return None
            p = self._partials[key] = _Partial(frame.count, now)
        elif p.chunks[frame.index] is not None:
            return None  # duplicate fragment
        p.chunks[frame.index] = frame.chunk
        p.have += 1
        p.size += len(frame.chunk)
        p.touched = now
        self._bytes += len(frame.chunk)
        self._partials.move_to_end(key)
        if p.have == frame.count:
            del self._partials[key]
            self._bytes -= p.size
            self._completed[key] = None
            if len(self._completed) > self.COMPLETED:
                self._completed.popitem(last=False)
            return b"".join(p.chunks)  # type: ignore[arg-type]
        while self._bytes > self.max_bytes:
            self._evict("reassembly-overflow")
        return None

    def forget(self, dst_group: int, data: bytes, count: int) -> None:
        """The message was not kept after all: accept its fragments again."""
        self._completed.pop((dst_group, message_id(data), count), None)

    def _evict(self, reason: str) -> None:
        _, p = self._partials.popitem(last=False)
        self._bytes -= p.size
        self.drops.count(reason)

    def expire(self, now: float) -> None:
        # Oldest-touched first (move_to_end on every fragment).
        while self._partials and now - next(iter(self._partials.values())).touched > self.timeout:
            self._evict("reassembly-timeout")


class Codec:
    """Datagrams <-> messages for one endpoint: frames, MACs, reassembly and
    counted drops.  Pure: no sockets, no clock of its own."""

    def __init__(self, keyring, accept_groups, config, drops: DropCounters | None = None):
        self.keyring = keyring
        self.accept_groups = set(accept_groups)
        self.max_datagram = config.max_datagram
        self.drops = drops or DropCounters()
        self.reassembler = Reassembler(self.drops, config.reassembly_bytes, config.reassembly_timeout)

    def encode(self, msg: wire.Message) -> list[bytes]:
        return list(self.split(msg.dst_group, wire.encode_message(msg)))

    def forget(self, data: bytes) -> None:
        msg = wire.decode_message(data)
        room = self.max_datagram - wire.FRAME_OVERHEAD
        if len(data) > room:
            self.reassembler.forget(msg.dst_group, data, -(-len(data) // room))

    def split(self, dst_group: int, data: bytes) -> Sequence[bytes]:
        return frames(self.keyring, dst_group, data, self.max_datagram)

    def decode(self, datagram: bytes, now: float) -> tuple[wire.Message, bytes] | None:
        """The message completed by this datagram and its encoded bytes, or
        None (a fragment of an incomplete message, or a counted drop)."""
        try:
            frame = wire.decode_frame(datagram, self.keyring, self.accept_groups)
            data = self.reassembler.add(frame, now)
            if data is None:
                return None
            msg = wire.decode_message(data)
            if msg.dst_group != frame.dst_group:
                raise wire.DropError(wire.DropReason.FOREIGN_GROUP, "header/frame mismatch")
            return msg, data
        except wire.DropError as e:
            self.drops.count(e.reason)
            return None
