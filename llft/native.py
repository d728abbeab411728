"""Python's view of the shared-memory ABI in native/: one replica's stream
file (control block + OrderInfo ring) and the OrderInfo codec.

Everything here goes through the same C code the preload library uses, so a
record written by the shim decodes here byte for byte."""
from __future__ import annotations

import errno
import mmap
import os
import threading
from dataclasses import dataclass

from llft._native import ffi, lib

REC_SIZE = lib.LLFT_REC_SIZE
DATA_BYTES = lib.LLFT_DATA_BYTES
EXIT_DIVERGED = lib.LLFT_EXIT_DIVERGED
EXIT_NOSTREAM = lib.LLFT_EXIT_NOSTREAM
EXIT_UNREACHABLE = lib.LLFT_EXIT_UNREACHABLE
ROLE_OFF, ROLE_PRIMARY, ROLE_BACKUP = lib.LLFT_ROLE_OFF, lib.LLFT_ROLE_PRIMARY, lib.LLFT_ROLE_BACKUP
ROLE_COPY = lib.LLFT_ROLE_COPY   # a copy of the primary's checkpoint: a backup from its first call (demote.c)
ROLE_NAMES = {ROLE_OFF: "off", ROLE_PRIMARY: "primary", ROLE_BACKUP: "backup", ROLE_COPY: "backup",
              lib.LLFT_ROLE_DEMOTING: "backup"}
DEFAULT_SLOTS = 1 << 18
CLOCK_IDS = {"realtime": 0, "monotonic": 1, "monotonic_raw": 4, "boottime": 7}


class StreamError(Exception):
    """A stream file that cannot be used (missing, truncated, foreign)."""


class StreamCorrupt(StreamError):
    """A record that fails its check or has impossible fields."""


_VALIDATE_REASONS = {
    lib.LLFT_REC_CORRUPT: "fails its integrity check (torn or altered)",
    lib.LLFT_REC_BADFIELD: "has impossible fields (unknown call, bad length)",
}


def op_name(op: int) -> str:
    return ffi.string(lib.llft_op_name(op)).decode()


def op_code(name: str) -> int:
    """The op number of a call name as the shim reports it (e.g. 'time')."""
    for op in range(lib.LLFT_OP_MAX):
        if lib.llft_op_valid(op) and op_name(op) == name:
            return op
    raise KeyError(name)


@dataclass(frozen=True)
class OrderInfo:
    """One (T, O, N, D) entry: thread tid's n-th call, on object obj; the
    remaining fields are D, the call's outcome."""

    op: int
    tid: int
    n: int
    obj: int = 0
    turn: int = 0
    ret: int = 0
    err: int = 0
    val: int = 0
    data: bytes = b""

    @property
    def name(self) -> str:
        return op_name(self.op)

    @property
    def slots(self) -> int:
        return 1 + lib.llft_data_slots(len(self.data))


def encode(entries) -> bytes:
    """OrderInfo entries -> sealed ring slots (seq left 0: a ring assigns it)."""
    total = sum(e.slots for e in entries)
    buf = ffi.new("char[]", total * REC_SIZE)
    i = 0
    for e in entries:
        rec = ffi.cast("llft_rec_t *", buf + i * REC_SIZE)
        rec.op, rec.nslots, rec.tid, rec.tn = e.op, e.slots, e.tid, e.n
        rec.obj, rec.turn, rec.ret, rec.err, rec.val = e.obj, e.turn, e.ret, e.err, e.val
        if e.data:
            rec.val = len(e.data)
        lib.llft_rec_seal(rec)
        for k in range(e.slots - 1):
            d = ffi.cast("llft_data_t *", buf + (i + 1 + k) * REC_SIZE)
            chunk = e.data[k * DATA_BYTES:(k + 1) * DATA_BYTES]
            d.op, d.len = lib.LLFT_OP_DATA, len(chunk)
            ffi.memmove(d.bytes, chunk, len(chunk))
            lib.llft_rec_seal(d)
        i += e.slots
    return ffi.buffer(buf)[:]


def decode(raw) -> list[OrderInfo]:
    """Ring slots (whole groups) -> OrderInfo entries; StreamCorrupt on a bad slot."""
    n = len(raw) // REC_SIZE
    if len(raw) % REC_SIZE:
        raise StreamCorrupt(f"{len(raw)} bytes is not a whole number of {REC_SIZE}-byte records")
    buf = ffi.from_buffer(raw)
    bad = lib.llft_count_groups(buf, n)
    if bad < 0:
        index = -bad - 1
        why = _VALIDATE_REASONS.get(lib.llft_rec_check_fields(buf + index * REC_SIZE),
                                    "is out of place (a data slot without its header, or a cut-off group)")
        raise StreamCorrupt(f"record slot {index} {why}")
    out = []
    i = 0
    while i < n:
        rec = ffi.cast("llft_rec_t *", buf + i * REC_SIZE)
        data = b""
        if rec.nslots > 1:
            parts = []
            for k in range(1, rec.nslots):
                d = ffi.cast("llft_data_t *", buf + (i + k) * REC_SIZE)
                parts.append(ffi.buffer(d.bytes, d.len)[:])
            data = b"".join(parts)
        out.append(OrderInfo(op=rec.op, tid=rec.tid, n=rec.tn, obj=rec.obj, turn=rec.turn,
                             ret=rec.ret, err=rec.err, val=rec.val, data=data))
        i += rec.nslots
    return out


def count_groups(raw) -> int:
    n = len(raw) // REC_SIZE
    groups = lib.llft_count_groups(ffi.from_buffer(raw), n)
    if groups < 0:
        raise StreamCorrupt(f"record slot {-groups - 1} is malformed")
    return groups


_scan = threading.local()   # each record pump's scratch for accepted_connections


def accepted_connections(raw) -> list[int]:
    """The connection ids the successful accepts among raw's whole record
    groups took (their ACCEPT records)."""
    n = len(raw) // REC_SIZE
    cap = max(n // 2, 1)   # (an ACCEPT takes two slots)
    ids = getattr(_scan, "ids", None)
    if ids is None or len(ids) < cap:
        ids = _scan.ids = ffi.new("uint64_t[]", max(cap, 2048))
    found = lib.llft_scan_accepts(ffi.from_buffer(raw), n, ids, cap)
    return list(ids[0:found])


class StreamFile:
    """One replica's shared file: control block + OrderInfo ring.

    The controller creates one per replica (create=True); the preload library
    in the replica attaches to it through $LLFT_SHM."""

    def __init__(self, path, *, create=False, slots=DEFAULT_SLOTS, role=ROLE_BACKUP, replica=0, fd=None):
        self.path = os.fspath(path)
        self.named = fd is None   # a file of that name (unlink removes it), or a memfd of a forked process's
        if fd is not None:
            try:
                size = os.fstat(fd).st_size
                self._mm = mmap.mmap(fd, size)
            except (OSError, ValueError) as e:
                raise StreamError(f"{self.path}: {e}") from None
        elif create:
            if slots < lib.LLFT_MAX_GROUP or slots & (slots - 1):
                raise StreamError(f"ring size {slots} must be a power of two >= {lib.LLFT_MAX_GROUP}")
            size = lib.llft_shm_bytes(slots)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
                self._mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        else:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except OSError as e:
                raise StreamError(f"{self.path}: {e.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    raise StreamError(f"{self.path}: empty file, not an llft stream")
                self._mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self._base = ffi.from_buffer(self._mm)
        if create:
            rc = lib.llft_shm_format(self._base, size, slots, role, replica)
            if rc:
                raise StreamError(f"{self.path}: cannot format: {os.strerror(-rc)}")
        else:
            rc = lib.llft_shm_check(self._base, size)
            if rc:
                reason = {-errno.EPROTO: "ABI version mismatch",
                          -errno.EINVAL: "truncated"}.get(rc, "not an llft stream")
                self.close()
                raise StreamError(f"{self.path}: {reason}")
        self.ctl = lib.llft_shm_ctl(self._base)
        self.ring = lib.llft_shm_ring(self._base)
        self._scratch = None

    # -- control block --------------------------------------------------
    @property
    def role(self) -> int:
        return self.ctl.role

    @role.setter
    def role(self, value: int):
        self.ctl.role = value

    @property
    def attached_pid(self) -> int:
        return self.ctl.attached_pid

    @property
    def stream_id(self) -> int:
        """0: a replica's own process; else the id of a process it forked."""
        return self.ctl.stream_id

    @property
    def waited_for(self) -> bool:
        """A forked process its parent waited for as it began (a read of a
        pipe from it, a poll): a daemon's child whose word its parent awaits."""
        return bool(self.ctl.waited_for)

    @property
    def shared_memory(self) -> str:
        """A forked process's: the memory its parent shared with it, as a phrase ("" if none)."""
        return ffi.string(self.ctl.shared_memory).decode(errors="replace")

    @property
    def forks_replicated(self) -> bool:
        return self.ctl.fork_mode == lib.LLFT_FORKS_REPLICATED

    @forks_replicated.setter
    def forks_replicated(self, on: bool):
        """What the program forks gets a stream of its own (native/fork_stream.c)."""
        self.ctl.fork_mode = lib.LLFT_FORKS_REPLICATED if on else lib.LLFT_FORKS_UNRECORDED

    @property
    def stopping(self) -> bool:
        return bool(self.ctl.stopping)

    @stopping.setter
    def stopping(self, on: bool):
        """The group is being stopped: the replica's first process dying is
        no fault its forked processes must stop recording for
        (native/replica_lease.c)."""
        self.ctl.stopping = 1 if on else 0

    @property
    def records(self) -> int:
        return self.ctl.records

    @property
    def threads(self) -> int:
        return self.ctl.threads

    @property
    def promoted_ns(self) -> int:
        """CLOCK_MONOTONIC (time.monotonic_ns) when this replica took over as primary; 0 if it never did."""
        return self.ctl.promoted_ns

    @property
    def diverged(self) -> bool:
        return bool(self.ctl.diverged)

    @property
    def divergence(self) -> str:
        return ffi.string(self.ctl.div_text).decode(errors="replace")

    @property
    def divergence_where(self) -> str:
        """The diverged backup's backtrace, a frame per line."""
        return ffi.string(self.ctl.div_where).decode(errors="replace")

    @property
    def divergence_before(self) -> str:
        """The diverged thread's calls just before, as the primary recorded
        them, newest first, a call per line."""
        return ffi.string(self.ctl.div_before).decode(errors="replace")

    @property
    def refused(self) -> bool:
        """A process of the replica did what llft cannot replicate
        (divergence says what): the group must stop."""
        return bool(self.ctl.refused)

    @property
    def serial_steals(self) -> int:
        """--serialize: turns taken from a thread that ran on without
        giving its turn up (native/serialize.c)."""
        return self.ctl.serial_steals

    @property
    def stopped_for_good(self) -> bool:
        """A backup exited once its threads stopped where the primary's were,
        without its program's exit path: what its stdio held is not out."""
        return bool(self.ctl.stopped_for_good)

    def set_timeouts(self, *, stall_ms: int | None = None, end_grace_ms: int | None = None):
        if stall_ms is not None:
            self.ctl.stall_timeout_ms = stall_ms
        if end_grace_ms is not None:
            self.ctl.end_grace_ms = end_grace_ms

    def listeners(self, socktype: int = 1) -> list[tuple[int, int, str]]:
        """TCP ports the program listens on (UDP ports it has bound, with
        socktype=SOCK_DGRAM): (port, family, the address it bound)."""
        buf = ffi.new("llft_listener_t[]", lib.LLFT_MAX_LISTENERS)
        n = lib.llft_listeners_read(self.ctl, socktype, buf, lib.LLFT_MAX_LISTENERS)
        return [(buf[i].port, buf[i].family, address_text(buf[i].family, bytes(buf[i].addr))) for i in range(n)]

    def any_port_datagram_listeners(self) -> list[tuple[int, int, str]]:
        """UDP ports bound to port 0, or by a send or connect before any bind
        (outgoing UDP): served on any free port, not the gateway's."""
        import socket
        return self.listeners(socket.SOCK_DGRAM | lib.LLFT_LISTENER_ANY_PORT)

    def clock_offsets(self) -> dict[str, int]:
        """Group clock minus this replica's clock, per clock (Consistent Time
        Service): 0 at the primary; kept up to date by a replaying backup."""
        return {name: self.ctl.clock_offset_ns[cid] for name, cid in CLOCK_IDS.items()}

    # -- ring -----------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.ring.capacity

    @property
    def head(self) -> int:
        """Ring position after the last slot reserved (by any thread)."""
        return lib.llft_ring_head(self.ring)

    @property
    def tail(self) -> int:
        """Ring position after the last slot consumed."""
        return lib.llft_ring_tail(self.ring)

    @property
    def pending(self) -> int:
        """Slots reserved or written but not yet consumed."""
        return lib.llft_ring_head(self.ring) - lib.llft_ring_tail(self.ring)

    @property
    def closed(self) -> bool:
        return bool(self.ring.closed)

    def read(self, max_slots: int = 4096) -> bytes:
        """Consumes up to max_slots committed slots (whole groups)."""
        if self._scratch is None or len(self._scratch) < max_slots * REC_SIZE:
            self._scratch = ffi.new("char[]", max_slots * REC_SIZE)
        got = lib.llft_ring_read(self.ring, self._scratch, max_slots)
        if got < 0:
            pos = lib.llft_ring_tail(self.ring)
            raise StreamCorrupt(f"{self.path}: record at position {pos} {_VALIDATE_REASONS.get(got, 'is bad')}")
        return ffi.buffer(self._scratch, got * REC_SIZE)[:] if got else b""

    def write(self, slots, timeout_ms: int = -1) -> int:
        """Appends raw slots (whole groups); returns how many were written."""
        n = len(slots) // REC_SIZE
        return lib.llft_ring_write(self.ring, ffi.from_buffer(slots), n, timeout_ms)

    def write_end(self, status: int | None = None, timeout_ms: int = 1000) -> bool:
        """The primary exited (with this exit status, if known): the stream
        ends here.  A backup whose threads all end up past the end, with
        every record replayed, exits with that status."""
        return lib.llft_ring_write_end(self.ring, -1 if status is None else status, timeout_ms) == 0

    def write_promote(self, timeout_ms: int = 1000) -> bool:
        """The primary failed: once this backup has replayed everything so
        far, it takes over and writes this ring itself."""
        return lib.llft_ring_write_control(self.ring, lib.LLFT_OP_PROMOTE, 0, timeout_ms) == 0

    def wait_data(self, timeout_ms: int) -> bool:
        return bool(lib.llft_ring_wait_data(self.ring, timeout_ms))

    def wake(self):
        """Wakes whoever waits in wait_data, so that it looks again now."""
        lib.llft_ring_wake(self.ring)

    def _unconsumed_runs(self):
        """(ring position, slots) of the slots it has yet to consume, in
        order: at most two runs, as the ring wraps once."""
        pos, head = self.tail, self.head
        while pos < head:
            run = min(head - pos, self.capacity - pos % self.capacity)
            yield pos, run
            pos += run

    def copy_from(self, src: "StreamFile", replica: int):
        """This (new, same-sized) stream becomes a copy of src as it is now:
        its control block and ring header, and the slots src has yet to
        consume.  src's consumer must be stopped (frozen for a checkpoint)
        and its producer held, so that the copy is one instant of src."""
        if src.capacity != self.capacity:
            raise StreamError(f"{self.path}: {self.capacity} slots, {src.path} has {src.capacity}")
        ffi.memmove(self.ctl, src.ctl, lib.LLFT_CTL_BYTES + lib.LLFT_RING_HDR)
        self.ctl.replica = replica
        for pos, run in src._unconsumed_runs():
            ffi.memmove(lib.llft_ring_slot(self.ring, pos), lib.llft_ring_slot(src.ring, pos), run * REC_SIZE)

    def snapshot(self, records: bool = False) -> bytes:
        """Its control block and ring header as they are, for a ring on
        another host (load_snapshot): copy_from's.  Without records, for a
        ring whose records are all consumed (a held primary's, all
        shipped); with them, followed by the slots it has yet to consume
        (a backup's: its consumer frozen, its producer held)."""
        if self.head != self.tail and not records:
            raise StreamError(f"{self.path}: {self.head - self.tail} records are not consumed yet")
        out = bytearray(ffi.buffer(self.ctl, lib.LLFT_CTL_BYTES + lib.LLFT_RING_HDR))
        for pos, run in self._unconsumed_runs():
            out += ffi.buffer(lib.llft_ring_slot(self.ring, pos), run * REC_SIZE)
        return bytes(out)

    @staticmethod
    def snapshot_records(data: bytes) -> int:
        """How many slots a snapshot carries."""
        return (len(data) - lib.LLFT_CTL_BYTES - lib.LLFT_RING_HDR) // REC_SIZE

    def load_snapshot(self, data: bytes, replica: int):
        """This (new, same-sized) stream becomes the one snapshot() was
        taken of, with the slots it carries where they were."""
        capacity, n = self.capacity, lib.LLFT_CTL_BYTES + lib.LLFT_RING_HDR
        if len(data) < n or (len(data) - n) % REC_SIZE:
            raise StreamError(f"{self.path}: a snapshot of {len(data)} bytes is not this library's")
        saved = bytes(ffi.buffer(self.ctl, n))
        ffi.memmove(self.ctl, data[:n], n)
        if self.capacity != capacity or self.head - self.tail != self.snapshot_records(data):
            ffi.memmove(self.ctl, saved, n)
            raise StreamError(f"{self.path}: {capacity} slots; the stream copied has a different number "
                              "(--ring-slots), or not the records it says")
        self.ctl.replica = replica
        at = n
        for pos, run in self._unconsumed_runs():
            ffi.memmove(lib.llft_ring_slot(self.ring, pos), data[at:at + run * REC_SIZE], run * REC_SIZE)
            at += run * REC_SIZE

    def raw_slot(self, pos: int):
        """The slot at ring position pos, as a writable cffi buffer (tests)."""
        return ffi.buffer(lib.llft_ring_slot(self.ring, pos), REC_SIZE)

    def close(self):
        if self._mm is None:
            return
        self.ctl = self.ring = None
        ffi.release(self._base)
        self._mm.close()
        self._mm = None

    def unlink(self):
        if not self.named:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


CONN_HEADER_SIZE = ffi.sizeof("llft_conn_header_t")


def conn_header(conn_id: int, host: str, port: int) -> bytes:
    """What the controller writes first on each connection to a program's
    listener: which client connection it is, and who the client is."""
    import ipaddress
    import socket
    h = ffi.new("llft_conn_header_t *")
    ip = ipaddress.ip_address(host)
    h.conn_id = conn_id
    h.family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    h.port = socket.htons(port)
    ffi.memmove(h.addr, ip.packed, len(ip.packed))
    return ffi.buffer(h)[:]


def parse_conn_header(raw: bytes) -> tuple[int, str, int]:
    """(conn_id, host, port) of a header, as conn_header writes it."""
    import ipaddress
    import socket
    h = ffi.from_buffer("llft_conn_header_t *", raw[:CONN_HEADER_SIZE])
    n = 16 if h.family == socket.AF_INET6 else 4
    return h.conn_id, str(ipaddress.ip_address(bytes(ffi.buffer(h.addr, n)))), socket.ntohs(h.port)


CONNECT_REQUEST_SIZE = ffi.sizeof("llft_connect_request_t")
CONNECT_ASK = lib.LLFT_CONNECT_ASK


def _ip(family: int, raw) -> str:
    return address_text(family, bytes(ffi.buffer(raw, 16)))


def address_text(family: int, raw: bytes) -> str:
    """An address as the shim keeps it (16 bytes, network order) in text.
    An IPv4-mapped IPv6 address (::ffff:127.0.0.1, what a JVM binds for
    127.0.0.1) is its IPv4 address: only IPv4 clients reach it, and a
    socket can listen on it only as that."""
    import ipaddress
    import socket
    ip = ipaddress.ip_address(raw[:16] if family == socket.AF_INET6 else raw[:4])
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


CHANNEL_MSG_SIZE = ffi.sizeof("llft_channel_msg_t")
CHAN_LISTEN, CHAN_DGRAM, CHAN_CONNECT = lib.LLFT_CHAN_LISTEN, lib.LLFT_CHAN_DGRAM, lib.LLFT_CHAN_CONNECT
CHAN_STREAM, CHAN_INBOX, CHAN_PORT = lib.LLFT_CHAN_STREAM, lib.LLFT_CHAN_INBOX, lib.LLFT_CHAN_PORT
# Ephemeral ports: the first process numbers its own from the first OWN; the controller gives the rest.
EPHEMERAL_FIRST, EPHEMERAL_COUNT = lib.LLFT_EPHEMERAL_FIRST, lib.LLFT_EPHEMERAL_COUNT
EPHEMERAL_OWN = lib.LLFT_EPHEMERAL_OWN
LISTENER_ANY_PORT = lib.LLFT_LISTENER_ANY_PORT


@dataclass(frozen=True)
class ChannelMessage:
    """What a replica's shim sends on its channel with a socket's other end."""
    kind: int        # CHAN_LISTEN, CHAN_DGRAM, CHAN_CONNECT, CHAN_STREAM, CHAN_INBOX, CHAN_PORT
    port: int
    family: int
    type: int        # CHAN_DGRAM: LISTENER_ANY_PORT for an outgoing (any-port) UDP socket; CHAN_STREAM: the role;
                     # CHAN_PORT: SOCK_STREAM or SOCK_DGRAM
    addr: str        # the address the program bound
    stream: int = 0  # CHAN_STREAM, CHAN_INBOX: the (forked) process's stream id...
    parent: int = 0  # ...and its parent's


def parse_channel_message(raw: bytes) -> ChannelMessage:
    """ValueError for anything the shim never sends."""
    import socket
    if len(raw) != CHANNEL_MSG_SIZE:
        raise ValueError(f"{len(raw)} bytes, not {CHANNEL_MSG_SIZE}")
    m = ffi.from_buffer("llft_channel_msg_t *", raw)
    if m.kind == CHAN_STREAM:
        ids = bytes(m.addr)
        if m.type not in (ROLE_PRIMARY, ROLE_BACKUP):
            raise ValueError(f"a stream of role {m.type}")
        return ChannelMessage(m.kind, 0, 0, m.type, "", int.from_bytes(ids[:8], "little"),
                              int.from_bytes(ids[8:], "little"))
    if m.kind == CHAN_INBOX:
        return ChannelMessage(m.kind, 0, 0, 0, "", int.from_bytes(bytes(m.addr)[:8], "little"))
    if m.kind == CHAN_PORT and m.type not in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        raise ValueError(f"a port for a socket of type {m.type}")
    if m.kind not in (CHAN_LISTEN, CHAN_DGRAM, CHAN_CONNECT, CHAN_PORT):
        raise ValueError(f"kind {m.kind}")
    if m.kind != CHAN_CONNECT and m.family not in (socket.AF_INET, socket.AF_INET6):
        raise ValueError(f"address family {m.family}")
    family = m.family if m.family in (socket.AF_INET, socket.AF_INET6) else socket.AF_INET
    return ChannelMessage(m.kind, m.port, m.family, m.type, address_text(family, bytes(m.addr)))


def parse_connect_request(raw: bytes) -> tuple[int, int, int, str, int]:
    """(conn_id, flags, family, host, port) of what the shim writes first on an
    outgoing connection; ValueError for a family it never writes."""
    import socket
    rq = ffi.from_buffer("llft_connect_request_t *", raw[:CONNECT_REQUEST_SIZE])
    if rq.family not in (socket.AF_INET, socket.AF_INET6):
        raise ValueError(f"address family {rq.family}")
    return rq.conn_id, rq.flags, rq.family, _ip(rq.family, rq.addr), socket.ntohs(rq.port)


def connect_reply(conn_id: int, err: int, local: tuple[str, int] | None = None) -> bytes:
    """The controller's answer to the primary's connect: the real connect's
    errno (0: connected) and the connection's local address."""
    import ipaddress
    import socket
    rep = ffi.new("llft_connect_reply_t *")
    rep.conn_id = conn_id
    rep.err = err
    if local is not None:
        ip = ipaddress.ip_address(local[0])
        rep.family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        rep.port = socket.htons(local[1])
        ffi.memmove(rep.addr, ip.packed, len(ip.packed))
    return ffi.buffer(rep)[:]


def disable_aslr():
    """Called between fork and exec of a replica (preexec_fn)."""
    lib.llft_disable_aslr()


def ignore_census_signals():
    """Called between fork and exec of a replica (preexec_fn): the signals of
    a checkpoint's quiesce are ignored until the preload library takes them."""
    lib.llft_ignore_census_signals()


def die_with_parent(parent: int):
    """Called between fork and exec of a replica (preexec_fn): SIGKILL when
    the controller (parent, whose thread forked it) ends."""
    lib.llft_die_with_parent(parent)


_NSLOTS_AT = ffi.offsetof("llft_rec_t", "nslots")


def split_groups(raw: bytes, max_bytes: int) -> list[bytes]:
    """Cuts a run of whole record groups (as StreamFile.read returns it) into
    runs of at most max_bytes; a group bigger than that goes alone."""
    out, start, pos, n = [], 0, 0, len(raw)
    while pos < n:
        size = int.from_bytes(raw[pos + _NSLOTS_AT:pos + _NSLOTS_AT + 2], "little") * REC_SIZE
        if pos > start and pos + size - start > max_bytes:
            out.append(raw[start:pos])
            start = pos
        pos += size
    if start < n:
        out.append(raw[start:])
    return out
