"""LLFT wire format: message types and headers (LLFT Figs. 2 and 7).

A *message* is a msgpack array of the Fig. 2 header fields followed by the
piggybacked ordering information, a type-specific body and the application
payload.  Messages travel in *frames* (see `llft.ordering.llmp.messaging.fragments`): each
datagram carries a fixed binary header with the protocol version and the
destination group, and ends with a keyed MAC, so a datagram that is not for
us, or not from someone holding the group's key, is dropped before msgpack
ever sees it.

Everything that can go wrong with input raises `DropError(reason)`; callers
count it in a `DropCounters` and carry on.
"""
from __future__ import annotations

import enum
import operator
import struct
from typing import Any, Iterable

import msgpack

PROTOCOL_VERSION = 1
MAGIC = b"LL"


class MsgType(enum.IntEnum):
    # Fig. 2: messaging protocol
    REQUEST = 1
    REPLY = 2
    FIRST_ACK = 3
    SECOND_ACK = 4
    NACK = 5
    HEARTBEAT = 6
    KEEP_ALIVE = 7
    # Fig. 7: membership protocol (behaviour comes with the membership issue)
    PROPOSE_PRIMARY = 16
    PROPOSE_PRIMARY_ACK = 17
    NEW_PRIMARY_VIEW = 18
    NEW_PRIMARY_VIEW_ACK = 19
    PROPOSE_BACKUP = 20
    ACCEPT_BACKUP = 21
    ACCEPT_BACKUP_ACK = 22
    REMOVE_BACKUP = 23
    REMOVE_BACKUP_ACK = 24
    STATE = 25
    STATE_ACK = 26
    # A newcomer's checkpoint taken of a backup (cluster/backup_checkpoint.py)
    CHECKPOINT_FOR = 27
    CHECKPOINT_OFFERED = 28


APPLICATION_TYPES = frozenset({MsgType.REQUEST, MsgType.REPLY})


class Role(enum.IntEnum):
    """The sender's role on the connection (the fourth element of the
    connection identity, LLFT §III-A2)."""
    CLIENT = 0
    SERVER = 1
    INTRA = 2  # the intra-group connection


class DropReason(str, enum.Enum):
    MALFORMED = "malformed"
    TRUNCATED = "truncated"
    BAD_VERSION = "bad-version"
    UNKNOWN_TYPE = "unknown-type"
    BAD_MAC = "bad-mac"
    FOREIGN_GROUP = "foreign-group"


class DropError(Exception):
    """An input datagram or message that must be dropped, with the reason."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = str(reason.value if isinstance(reason, DropReason) else reason)


class DropCounters:
    """Dropped inputs by reason; `snapshot()` is a plain dict for llft-status."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def count(self, reason: str, n: int = 1) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + n

    def total(self) -> int:
        return sum(self._counts.values())

    def __getitem__(self, reason: str) -> int:
        return self._counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


# Header fields in wire order.  `sender` (member id within its group) and
# `last_msn` (the sender's msgSeqCount, so a receiver detects a lost tail and
# can advance its watermark on an idle connection) extend Fig. 2.
HEADER_FIELDS = (
    "src_group", "dst_group", "conn_seq", "role", "sender", "pvn",
    "precedence", "msn", "ack_pvn", "ack", "back", "timestamp", "last_msn",
)
_U64 = (1 << 64) - 1
MAX_TIMESTAMP = 1 << 62


class Piggyback:
    """Ordering information carried by a message (LLFT §III-C).

    `own`: the sending primary's ordering entries, `own_first` is the order
    sequence number of the first blob.  `refl`: entries of the *receiving*
    group's primary reflected back to that group.  `refl_ack`: highest order
    sequence number of its own that the sender has seen reflected back, so the
    remote primary stops reflecting it.  `needs`: on an application message,
    the highest of the sender's own entries made before it (its content may
    depend on any of them): output commit, the receiver hands it on only
    once it holds them all (ordering.RemoteOrder).  Blobs are opaque to
    messaging.
    """

    __slots__ = ("own_first", "own", "refl_first", "refl", "refl_ack", "needs")

    def __init__(self, own_first: int = 0, own: list[bytes] | None = None,
                 refl_first: int = 0, refl: list[bytes] | None = None, refl_ack: int = 0, needs: int = 0):
        self.own_first, self.own = own_first, own or []
        self.refl_first, self.refl = refl_first, refl or []
        self.refl_ack, self.needs = refl_ack, needs

    def to_wire(self) -> list:
        return [self.own_first, self.own, self.refl_first, self.refl, self.refl_ack, self.needs]

    @classmethod
    def from_wire(cls, v: Any) -> "Piggyback":
        if not (isinstance(v, list) and len(v) == 6):
            raise DropError(DropReason.MALFORMED, "piggyback")
        of, own, rf, refl, ra, needs = v
        for n in (of, rf, ra, needs):
            _check_uint(n, "piggyback")
        for blobs in (own, refl):
            if not isinstance(blobs, list) or not all(isinstance(b, bytes) for b in blobs):
                raise DropError(DropReason.MALFORMED, "piggyback blobs")
        return cls(of, own, rf, refl, ra, needs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Piggyback) and self.to_wire() == other.to_wire()

    def __repr__(self) -> str:
        return (f"Piggyback(own={self.own_first}+{len(self.own)}, refl={self.refl_first}+{len(self.refl)}, "
                f"ack={self.refl_ack}, needs={self.needs})")


class Message:
    """A decoded LLFT message.  One subclass per message type (`TYPE`)."""

    TYPE: MsgType
    __slots__ = HEADER_FIELDS + ("piggyback", "body", "payload")

    def __init__(self, src_group: int = 0, dst_group: int = 0, conn_seq: int = 0, role: int = 0,
                 sender: int = 0, pvn: int = 0, precedence: int = 0, msn: int = 0, ack_pvn: int = 0,
                 ack: int = 0, back: int = 0, timestamp: int = 0, last_msn: int = 0,
                 piggyback: Piggyback | None = None, body: Any = None, payload: bytes = b""):
        # Spelled out (not **kwargs) because it is on the per-message path.
        self.src_group, self.dst_group, self.conn_seq, self.role = src_group, dst_group, conn_seq, role
        self.sender, self.pvn, self.precedence, self.msn = sender, pvn, precedence, msn
        self.ack_pvn, self.ack, self.back, self.timestamp = ack_pvn, ack, back, timestamp
        self.last_msn = last_msn
        self.piggyback, self.body, self.payload = piggyback, body, payload

    @property
    def mtype(self) -> MsgType:
        return self.TYPE

    # Fig. 2 names, for readers following the paper.
    messageType = mtype
    sourceGroupId = property(lambda self: self.src_group)
    destGroupId = property(lambda self: self.dst_group)
    connSeqNum = property(lambda self: self.conn_seq)
    primaryViewNum = property(lambda self: self.pvn)
    msgSeqNum = property(lambda self: self.msn)
    ackViewNum = property(lambda self: self.ack_pvn)

    def header(self) -> dict:
        return {name: getattr(self, name) for name in HEADER_FIELDS}

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self.header() == other.header()
                and self.piggyback == other.piggyback and self.body == other.body
                and self.payload == other.payload)

    def __repr__(self) -> str:
        h = " ".join(f"{k}={v}" for k, v in self.header().items() if v)
        return f"<{type(self).__name__} {h} payload={len(self.payload)}B>"


def _message_class(t: MsgType) -> type:
    name = "".join(part.capitalize() for part in t.name.split("_"))
    return type(name, (Message,), {"TYPE": t, "__slots__": ()})


MESSAGE_CLASSES: dict[int, type] = {t.value: _message_class(t) for t in MsgType}
# Module-level names: wire.Request, wire.FirstAck, wire.ProposePrimaryAck, ...
globals().update({cls.__name__: cls for cls in MESSAGE_CLASSES.values()})
Request = MESSAGE_CLASSES[MsgType.REQUEST]
Reply = MESSAGE_CLASSES[MsgType.REPLY]
FirstAck = MESSAGE_CLASSES[MsgType.FIRST_ACK]
SecondAck = MESSAGE_CLASSES[MsgType.SECOND_ACK]
Nack = MESSAGE_CLASSES[MsgType.NACK]
Heartbeat = MESSAGE_CLASSES[MsgType.HEARTBEAT]
KeepAlive = MESSAGE_CLASSES[MsgType.KEEP_ALIVE]


def make(mtype: MsgType, **fields: Any) -> Message:
    return MESSAGE_CLASSES[mtype](**fields)


_header_of = operator.attrgetter(*HEADER_FIELDS)


def encode_message(m: Message) -> bytes:
    pb = m.piggyback.to_wire() if m.piggyback is not None else None
    return msgpack.packb([PROTOCOL_VERSION, m.TYPE.value, *_header_of(m), pb, m.body, m.payload],
                         use_bin_type=True)


_NFIELDS = 2 + len(HEADER_FIELDS) + 3


def _check_uint(v: Any, what: str) -> None:
    if type(v) is not int or v < 0 or v > _U64:
        raise DropError(DropReason.MALFORMED, what)


def decode_message(data: bytes) -> Message:
    """Decode one message body (already authenticated and reassembled)."""
    try:
        v = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except msgpack.exceptions.ExtraData as e:
        raise DropError(DropReason.MALFORMED, "trailing data") from e
    except (ValueError, msgpack.exceptions.UnpackException) as e:
        # unpackb reports a message that stops in the middle as "incomplete input"
        short = isinstance(e, msgpack.exceptions.OutOfData) or "incomplete" in str(e)
        reason = DropReason.TRUNCATED if short else DropReason.MALFORMED
        raise DropError(reason, str(e)[:80]) from e
    except Exception as e:  # msgpack raises a few odd types on hostile input
        raise DropError(DropReason.MALFORMED, type(e).__name__) from e
    if not isinstance(v, list) or len(v) < 2:
        raise DropError(DropReason.MALFORMED, "not a message array")
    if v[0] != PROTOCOL_VERSION:
        raise DropError(DropReason.BAD_VERSION, repr(v[0])[:20])
    cls = MESSAGE_CLASSES.get(v[1]) if type(v[1]) is int else None
    if cls is None:
        raise DropError(DropReason.UNKNOWN_TYPE, repr(v[1])[:20])
    if len(v) != _NFIELDS:
        raise DropError(DropReason.MALFORMED, f"{len(v)} fields")
    hdr = v[2:-3]
    for x in hdr:
        if type(x) is not int or x < 0 or x > _U64:
            raise DropError(DropReason.MALFORMED, "header field")
    pb, body, payload = v[-3:]
    if not isinstance(payload, bytes):
        raise DropError(DropReason.MALFORMED, "payload")
    m = cls(*hdr, None if pb is None else Piggyback.from_wire(pb), body, payload)
    if m.role not in (0, 1, 2):
        raise DropError(DropReason.MALFORMED, "role")
    if m.timestamp > MAX_TIMESTAMP:
        # Lamport clocks take max(ours, theirs) + 1: one absurd value would
        # otherwise push every clock in the system past 64 bits.
        raise DropError(DropReason.MALFORMED, "timestamp")
    return m


# ---------------------------------------------------------------------------
# Type-specific bodies.  Membership bodies are free-form maps for now.

def nack_body(conn: tuple[int, int, int], msns: Iterable[int]) -> list:
    """Nack body: the connection (client, server, seq) and missing msns."""
    return [list(conn), list(msns)]


def parse_nack_body(body: Any) -> tuple[tuple[int, int, int], list[int]]:
    if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], list)
            and len(body[0]) == 3 and isinstance(body[1], list)):
        raise DropError(DropReason.MALFORMED, "nack body")
    for n in body[0] + body[1]:
        _check_uint(n, "nack body")
    return tuple(body[0]), body[1]  # type: ignore[return-value]


def parse_int_rows(body: Any, width: int, what: str) -> list[list[int]]:
    """A list of fixed-width rows of unsigned ints (heartbeat tables)."""
    if not isinstance(body, list):
        raise DropError(DropReason.MALFORMED, what)
    for row in body:
        if not (isinstance(row, list) and len(row) == width):
            raise DropError(DropReason.MALFORMED, what)
        for n in row:
            _check_uint(n, what)
    return body


def uint_field(body: Any, key: str, what: str) -> int:
    """An unsigned int from a map body, 0 if absent."""
    if not isinstance(body, dict):
        raise DropError(DropReason.MALFORMED, what)
    n = body.get(key, 0)
    _check_uint(n, what)
    return n


# ---------------------------------------------------------------------------
# Frames: the datagram envelope.

# magic, version, flags, dest group, message id, fragment index, fragment count
FRAME_HEADER = struct.Struct("!2sBBIQII")
MAC_LEN = 16
FRAME_OVERHEAD = FRAME_HEADER.size + MAC_LEN


class Frame:
    __slots__ = ("dst_group", "msg_id", "index", "count", "chunk")

    def __init__(self, dst_group: int, msg_id: int, index: int, count: int, chunk: bytes):
        self.dst_group, self.msg_id, self.index, self.count, self.chunk = dst_group, msg_id, index, count, chunk


def encode_frame(keyring, dst_group: int, msg_id: int, index: int, count: int, chunk: bytes) -> bytes:
    head = FRAME_HEADER.pack(MAGIC, PROTOCOL_VERSION, 0, dst_group, msg_id, index, count)
    return head + chunk + keyring.mac(dst_group, head, chunk)


def decode_frame(datagram: bytes, keyring, accept_groups) -> Frame:
    """Check envelope, destination group and MAC of one datagram.

    The group is checked before the MAC so a foreign datagram costs no
    hashing, and the MAC before anything is parsed beyond the fixed header.
    """
    if len(datagram) < FRAME_OVERHEAD:
        raise DropError(DropReason.TRUNCATED, f"{len(datagram)} bytes")
    magic, version, _flags, dst, msg_id, index, count = FRAME_HEADER.unpack_from(datagram)
    if magic != MAGIC:
        raise DropError(DropReason.MALFORMED, "magic")
    if version != PROTOCOL_VERSION:
        raise DropError(DropReason.BAD_VERSION, str(version))
    if dst not in accept_groups:
        raise DropError(DropReason.FOREIGN_GROUP, str(dst))
    hs, end = FRAME_HEADER.size, len(datagram) - MAC_LEN
    head, chunk, tag = datagram[:hs], datagram[hs:end], datagram[end:]
    if not keyring.verify(dst, head, chunk, tag):
        raise DropError(DropReason.BAD_MAC)
    if count == 0 or index >= count:
        raise DropError(DropReason.MALFORMED, "fragment index")
    return Frame(dst, msg_id, index, count, chunk)
