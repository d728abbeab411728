"""What rides inside the messaging protocol's messages for a replicated TCP
server, and inside its ordering information.

Requests (gateway -> server group), one msgpack array each:
    [OPEN, program_port, client_host, client_port]   a client connected
    [DATA, bytes]                                     the client's bytes
    [EOF]                                             the client shut down its side
    [DGRAM, program_port, number, client_host, client_port, bytes]
                             a client datagram to the program's UDP port, the
                             gateway's number-th on it (one virtual connection
                             per UDP port carries them all, in one order)
    [XCTL]                   the gateway serves outgoing connections: this
                             virtual connection carries the primary's XOPENs
    [XRESULT, k, errno, host, port, local_host, local_port]
                             the outcome of the program's k-th outgoing
                             connect, first on that connection's own virtual
                             connection (then DATA, EOF: the remote's bytes)
    [XPORT, j, local_host, local_port]
                             the gateway serves the program's j-th outgoing UDP
                             port from its UDP port local: first on that port's
                             own virtual connection (then DGRAM: what comes back)
Replies (primary -> gateway):
    [DATA, offset, bytes]    the server's bytes at this offset of the connection's output
    [CLOSE, offset]          the server closed the connection after `offset` bytes
    [DGRAM, k, host, port, bytes]   the program's k-th datagram (from 0) sent
                             from its UDP port, to host:port
    [XOPEN, k, host, port]   the program's k-th outgoing connection: the gateway
                             connects (once per k) and answers with XRESULT
    [XUDP, j, program_port, family]
                             on the UDP control connection: the program's j-th
                             outgoing UDP port (bound to port 0, or by a send);
                             the gateway opens a UDP socket (once per j) and
                             answers with XPORT
    [CLOSE, n]               on an outgoing UDP port's connection: the program
                             closed the port after n datagrams
Offsets (and k) let a gateway drop what it already sent when a new primary
repeats output after a failover.

Ordering information (primary -> its backups), a tag byte then the body:
    b"R" + record slots      the primary's OrderInfo records (whole groups)
    b"B" + msgpack [client_group, server_group, conn_seq, end_offset, closed]
                             where the primary cut its output into a message, so
                             a backup generates the very same messages (msns)
    b"D" + msgpack [client_group, server_group, conn_seq, number]
                             the primary handed that connection's datagram
                             `number` to its program's UDP port next (the
                             datagrams of several gateways share one socket)
    b"O" + msgpack [client_group, server_group, conn_seq]
                             the primary asks for outgoing connections on this
                             gateway's control connection (several gateways
                             may offer one)
    b"U" + msgpack [j, program_port, family]
                             the primary's program's j-th outgoing UDP port, in
                             the order its XUDPs go out (backups follow it)
    b"E" + msgpack [status]  the primary's program exited with this status
    b"V" + msgpack [pvn, [[client_group, server_group, conn_seq, base], ...]]
                             a new primary's first entry: on each connection the
                             remote group has msns <= base; numbering restarts there
"""
from __future__ import annotations

import msgpack

OPEN, DATA, EOF, CLOSE, DGRAM = 0, 1, 2, 3, 4
XCTL, XOPEN, XRESULT = 5, 6, 7   # outgoing connections (llft/cluster/outgoing.py)
XUDP, XPORT = 8, 9               # outgoing UDP (llft/cluster/outgoing_udp.py)
MAX_UDP_PAYLOAD = 65507   # the most an IPv4 UDP datagram carries
TAG_RECORDS, TAG_BOUNDARY, TAG_DATAGRAM, TAG_CONTROL, TAG_END, TAG_VIEW = b"R", b"B", b"D", b"O", b"E", b"V"
TAG_UDP_PORT = b"U"


class BadPayload(ValueError):
    """A message body that is not one of the forms above: counted and dropped."""


def _unpack(raw: bytes) -> list:
    try:
        v = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, TypeError) as e:
        raise BadPayload(f"undecodable: {e}") from None
    if not isinstance(v, list) or not v or not isinstance(v[0], int):
        raise BadPayload("not a tagged array")
    return v


def _pack(*fields) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


# -- requests ------------------------------------------------------------------
def open_request(port: int, host: str, client_port: int) -> bytes:
    return _pack(OPEN, port, host, client_port)


def data_request(chunk: bytes) -> bytes:
    return _pack(DATA, chunk)


def eof_request() -> bytes:
    return _pack(EOF)


def datagram_request(program_port: int, number: int, host: str, client_port: int, data: bytes) -> bytes:
    return _pack(DGRAM, program_port, number, host, client_port, data)


def _port(v) -> bool:
    return isinstance(v, int) and 0 <= v < 65536


def encode_request(req) -> bytes:
    """A parsed request (as kept in a member's input log) back to its bytes."""
    if not isinstance(req, (list, tuple)) or not req:
        raise BadPayload("not a request")
    return _pack(*req)


def parse_request(raw: bytes) -> tuple:
    v = _unpack(raw)
    kind = v[0]
    if kind == OPEN and len(v) == 4 and isinstance(v[1], int) and 0 < v[1] < 65536 \
            and isinstance(v[2], str) and isinstance(v[3], int) and 0 <= v[3] < 65536:
        return OPEN, v[1], v[2], v[3]
    if kind == DATA and len(v) == 2 and isinstance(v[1], bytes):
        return DATA, v[1]
    if kind == EOF and len(v) == 1:
        return (EOF,)
    if kind == DGRAM and len(v) == 6 and _port(v[1]) and v[1] and isinstance(v[2], int) and 0 < v[2] < 1 << 63 \
            and isinstance(v[3], str) and _port(v[4]) and isinstance(v[5], bytes) and len(v[5]) <= MAX_UDP_PAYLOAD:
        return DGRAM, v[1], v[2], v[3], v[4], v[5]
    if kind == XCTL and len(v) == 1:
        return (XCTL,)
    if kind == XRESULT and len(v) == 7 and isinstance(v[1], int) and v[1] >= 0 and isinstance(v[2], int) \
            and v[2] >= 0 and isinstance(v[3], str) and _port(v[4]) and isinstance(v[5], str) and _port(v[6]):
        return tuple(v)
    if kind == XPORT and len(v) == 4 and isinstance(v[1], int) and v[1] >= 0 and isinstance(v[2], str) \
            and _port(v[3]):
        return tuple(v)
    raise BadPayload(f"not a request: {v[:1]}")


def xctl_request() -> bytes:
    return _pack(XCTL)


def xresult_request(k: int, err: int, host: str, port: int, local: tuple[str, int]) -> bytes:
    return _pack(XRESULT, k, err, host, port, local[0], local[1])


def xport_request(j: int, local: tuple[str, int]) -> bytes:
    return _pack(XPORT, j, local[0], local[1])


# -- replies -------------------------------------------------------------------
def data_reply(offset: int, chunk: bytes) -> bytes:
    return _pack(DATA, offset, chunk)


def close_reply(offset: int) -> bytes:
    return _pack(CLOSE, offset)


def datagram_reply(k: int, host: str, port: int, data: bytes) -> bytes:
    return _pack(DGRAM, k, host, port, data)


def _datagram_reply(v: list) -> tuple[int, str, int, bytes]:
    if v[0] == DGRAM and len(v) == 5 and isinstance(v[1], int) and v[1] >= 0 and isinstance(v[2], str) \
            and _port(v[3]) and isinstance(v[4], bytes):
        return v[1], v[2], v[3], v[4]
    raise BadPayload(f"not a datagram reply: {v[:1]}")


def parse_datagram_reply(raw: bytes) -> tuple[int, str, int, bytes]:
    """(k, host, port, bytes) of a reply on a UDP port's connection."""
    return _datagram_reply(_unpack(raw))


def parse_port_reply(raw: bytes) -> tuple:
    """A reply on an outgoing UDP port's connection: (DGRAM, k, host, port,
    bytes), or (CLOSE, n) once the program closed the port after n."""
    v = _unpack(raw)
    if v[0] == CLOSE and len(v) == 2 and isinstance(v[1], int) and v[1] >= 0:
        return CLOSE, v[1]
    return (DGRAM, *_datagram_reply(v))


def xopen_reply(k: int, host: str, port: int) -> bytes:
    return _pack(XOPEN, k, host, port)


def parse_xopen_reply(raw: bytes) -> tuple[int, str, int]:
    """(k, host, port) of a reply on a gateway's outgoing control connection."""
    v = _unpack(raw)
    if v[0] == XOPEN and len(v) == 4 and isinstance(v[1], int) and v[1] >= 0 and isinstance(v[2], str) \
            and _port(v[3]) and v[3]:
        return v[1], v[2], v[3]
    raise BadPayload(f"not an outgoing open: {v[:1]}")


def xudp_reply(j: int, program_port: int, family: int) -> bytes:
    return _pack(XUDP, j, program_port, family)


def parse_xudp_reply(raw: bytes) -> tuple[int, int, int]:
    """(j, program port, family) of a reply on a gateway's UDP control connection."""
    v = _unpack(raw)
    if v[0] == XUDP and len(v) == 4 and _counts(v[1:]) and _port(v[2]) and v[2]:
        return v[1], v[2], v[3]
    raise BadPayload(f"not an outgoing UDP port: {v[:1]}")


def parse_reply(raw: bytes) -> tuple:
    v = _unpack(raw)
    if v[0] == DATA and len(v) == 3 and isinstance(v[1], int) and v[1] >= 0 and isinstance(v[2], bytes):
        return DATA, v[1], v[2]
    if v[0] == CLOSE and len(v) == 2 and isinstance(v[1], int) and v[1] >= 0:
        return CLOSE, v[1]
    raise BadPayload(f"not a reply: {v[:1]}")


# -- ordering information ------------------------------------------------------
def records_blob(slots: bytes) -> bytes:
    return TAG_RECORDS + slots


def boundary_blob(conn: tuple[int, int, int], end: int, closed: bool) -> bytes:
    return TAG_BOUNDARY + _pack(*conn, end, closed)


def datagram_blob(conn: tuple[int, int, int], number: int) -> bytes:
    return TAG_DATAGRAM + _pack(*conn, number)


def control_blob(conn: tuple[int, int, int]) -> bytes:
    return TAG_CONTROL + _pack(*conn)


def udp_port_blob(j: int, program_port: int, family: int) -> bytes:
    return TAG_UDP_PORT + _pack(j, program_port, family)


def end_blob(status: int) -> bytes:
    return TAG_END + _pack(status)


def view_blob(pvn: int, bases: list[tuple[tuple[int, int, int], int]]) -> bytes:
    return TAG_VIEW + _pack(pvn, [[*cid, base] for cid, base in bases])


def _counts(xs) -> bool:
    """Every one a non-negative integer (group ids, sequence numbers, offsets)."""
    return all(isinstance(x, int) and x >= 0 for x in xs)


def parse_blob(blob: bytes) -> tuple:
    tag, body = blob[:1], blob[1:]
    if tag == TAG_RECORDS:
        return TAG_RECORDS, body
    if tag == TAG_BOUNDARY:
        v = _unpack(body)
        if len(v) == 5 and _counts(v[:4]) and isinstance(v[4], bool):
            return TAG_BOUNDARY, (v[0], v[1], v[2]), v[3], v[4]
    if tag == TAG_DATAGRAM:
        v = _unpack(body)
        if len(v) == 4 and _counts(v):
            return TAG_DATAGRAM, (v[0], v[1], v[2]), v[3]
    if tag == TAG_CONTROL:
        v = _unpack(body)
        if len(v) == 3 and _counts(v):
            return TAG_CONTROL, (v[0], v[1], v[2])
    if tag == TAG_UDP_PORT:
        v = _unpack(body)
        if len(v) == 3 and _counts(v) and _port(v[1]):
            return TAG_UDP_PORT, v[0], v[1], v[2]
    if tag == TAG_END:
        v = _unpack(body)
        if len(v) == 1:
            return TAG_END, v[0]
    if tag == TAG_VIEW:
        v = _unpack(body)
        if len(v) == 2 and isinstance(v[1], list) and all(isinstance(r, list) and len(r) == 4 and _counts(r)
                                                          for r in v[1]):
            return TAG_VIEW, v[0], [((r[0], r[1], r[2]), r[3]) for r in v[1]]
    raise BadPayload(f"unknown ordering information {tag!r}")
