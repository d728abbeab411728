"""One copy of a mailbox: a shared-memory segment standing for one memory
module (specs/mailbox.md §3).  The layout is fixed-size little-endian
records, so any process that maps the file reads the same fields:

    header   64 B   magic, version, copy index, copies, protocol, crashed,
                    receiver slots R, queue slots Q, message bytes S
    receivers R ×   state, pid, entry time, exit time
    queue     Q ×   state, a-flag, D, LD, nrd, nxp, length, sender,
                    timestamp (time, pid), d-flags[R], data[S]

Every access is one atomic step under the copy's lock (`step()`), which
also enforces the memory's fail-silent model: once a copy is marked
crashed, every later step on it, by any process, raises MemoryCrashed.
Nothing here sleeps while holding the lock."""
from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from typing import Iterator

MAGIC = 0x3158424D  # "MBX1"
VERSION = 1

BOTTOM = -1        # ⊥ of a decision or a d-flag
NO_DFLAG = -2      # the message carries no d-flag for this receiver slot

FREE, WRITING, PUBLISHED = 0, 1, 2                 # queue slot states
R_FREE, R_ACTIVE, R_CRASHED, R_LEFT = 0, 1, 2, 3   # receiver slot states
NEVER = (1 << 63) - 1                              # an exit time of ∞

_HEADER = struct.Struct("<IHHHBBHII")
_HEADER_BYTES = 64
_CRASHED_AT = 11                      # offset of the crashed byte in the header
_RECEIVER = struct.Struct("<B7xqqq")  # state, pid, entry, exit
_ENTRY = struct.Struct("<BbbbiiIqqq")  # state, a, D, LD, nrd, nxp, length, sender, ts time, ts pid
_TS = struct.Struct("<qq")             # an entry's timestamp (time, pid)
_TS_AT = _ENTRY.size - _TS.size        # where it lies in the entry


class MemoryCrashed(Exception):
    """The copy is fail-silent: this and every later access to it fail."""


class MailboxFull(Exception):
    """No free queue slot: the buffers were sized below the load (§4.7)."""


@dataclass(frozen=True, order=True)
class Timestamp:
    time: int
    pid: int


@dataclass
class Entry:
    """A queue slot's fields as one step read them."""
    slot: int
    state: int
    a_flag: int
    decision: int
    local_decision: int
    nrd: int
    nxp: int
    length: int
    sender: int
    ts: Timestamp
    dflags: list[int]

    def dflag_count(self) -> int:
        return sum(1 for f in self.dflags if f != NO_DFLAG)


@dataclass
class Receiver:
    slot: int
    state: int
    pid: int
    entry: int
    exit: int

    def eligible(self, ts: Timestamp) -> bool:
        """A sender gives this receiver a d-flag iff entry ≤ ts < exit and it is active."""
        return self.state == R_ACTIVE and self.entry <= ts.time < self.exit


class Layout:
    """Where each field of a copy lies, from its three sizes."""

    def __init__(self, receivers: int, slots: int, message_bytes: int):
        self.receivers, self.slots, self.message_bytes = receivers, slots, message_bytes
        self.receivers_at = _HEADER_BYTES
        self.queue_at = self.receivers_at + receivers * _RECEIVER.size
        entry = _ENTRY.size + receivers + message_bytes
        self.entry_bytes = (entry + 7) & ~7
        self.size = self.queue_at + slots * self.entry_bytes

    def receiver(self, slot: int) -> int:
        return self.receivers_at + slot * _RECEIVER.size

    def entry(self, slot: int) -> int:
        return self.queue_at + slot * self.entry_bytes

    def dflags(self, slot: int) -> int:
        return self.entry(slot) + _ENTRY.size

    def data(self, slot: int) -> int:
        return self.dflags(slot) + self.receivers


class Copy:
    """One mapped copy.  `step()` is the only way in."""

    def __init__(self, path: str, fd: int, mem: mmap.mmap, index: int):
        self.path, self._fd, self._mem, self.index = path, fd, mem, index
        magic, version, idx, copies, protocol, _, receivers, slots, size = _HEADER.unpack_from(mem, 0)
        if magic != MAGIC or version != VERSION or idx != index:
            raise ValueError(f"{path} is not copy {index} of a mailbox (magic {magic:#x}, "
                             f"version {version}, copy {idx})")
        self.copies, self.protocol = copies, protocol
        self.layout = Layout(receivers, slots, size)
        # flock excludes other processes; threads of this one share the
        # open file, so they take this lock first.
        self._threads = threading.Lock()

    @classmethod
    def create(cls, path: str, index: int, copies: int, protocol: int,
               receivers: int, slots: int, message_bytes: int) -> "Copy":
        layout = Layout(receivers, slots, message_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, layout.size)
            mem = mmap.mmap(fd, layout.size)
        except BaseException:
            os.close(fd)
            raise
        _HEADER.pack_into(mem, 0, MAGIC, VERSION, index, copies, protocol, 0,
                          receivers, slots, message_bytes)
        return cls(path, fd, mem, index)

    @classmethod
    def open(cls, path: str, index: int) -> "Copy":
        fd = os.open(path, os.O_RDWR)
        try:
            return cls(path, fd, mmap.mmap(fd, os.fstat(fd).st_size), index)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._mem.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    @contextlib.contextmanager
    def step(self) -> Iterator["Copy"]:
        """One atomic step on this copy; MemoryCrashed if it has failed."""
        with self._threads:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                if self._mem[_CRASHED_AT]:
                    raise MemoryCrashed(f"mailbox copy {self.index} has failed")
                yield self
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def failed(self) -> bool:
        """Whether the module has failed (one step that does nothing)."""
        try:
            with self.step():
                return False
        except MemoryCrashed:
            return True

    def crash(self) -> None:
        """The module fails: every later access, from any process, fails."""
        with self._threads:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._mem[_CRASHED_AT] = 1
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    # Fields.  Call these only inside step().

    def receiver(self, slot: int) -> Receiver:
        state, pid, entry, exit_ = _RECEIVER.unpack_from(self._mem, self.layout.receiver(slot))
        return Receiver(slot, state, pid, entry, exit_)

    def receivers(self) -> list[Receiver]:
        return [self.receiver(s) for s in range(self.layout.receivers)]

    def set_receiver(self, r: Receiver) -> None:
        _RECEIVER.pack_into(self._mem, self.layout.receiver(r.slot), r.state, r.pid, r.entry, r.exit)

    def entry(self, slot: int) -> Entry:
        state, a, d, ld, nrd, nxp, length, sender, t, p = _ENTRY.unpack_from(self._mem, self.layout.entry(slot))
        at = self.layout.dflags(slot)
        flags = list(struct.unpack_from(f"<{self.layout.receivers}b", self._mem, at))
        return Entry(slot, state, a, d, ld, nrd, nxp, length, sender, Timestamp(t, p), flags)

    def put(self, e: Entry) -> None:
        """Write back the fields a step changed (everything but the data)."""
        _ENTRY.pack_into(self._mem, self.layout.entry(e.slot), e.state, e.a_flag, e.decision,
                         e.local_decision, e.nrd, e.nxp, e.length, e.sender, e.ts.time, e.ts.pid)
        struct.pack_into(f"<{self.layout.receivers}b", self._mem, self.layout.dflags(e.slot), *e.dflags)

    def published(self) -> list[Entry]:
        """The queue in timestamp order (slot order means nothing)."""
        found = []
        for s in range(self.layout.slots):
            if self._mem[self.layout.entry(s)] == PUBLISHED:
                found.append(self.entry(s))
        found.sort(key=lambda e: e.ts)
        return found

    def find(self, ts: Timestamp) -> Entry | None:
        # Every decision step looks one message up: compare the timestamps
        # in place and read only the entry that matches, so that a step
        # costs the same whatever else the queue holds.
        for s in range(self.layout.slots):
            at = self.layout.entry(s)
            if self._mem[at] == PUBLISHED and _TS.unpack_from(self._mem, at + _TS_AT) == (ts.time, ts.pid):
                return self.entry(s)
        return None

    def insert(self, sender: int, ts: Timestamp, data: bytes, dflags: list[int]) -> None:
        """Fill a free slot and publish it: the paper's "add to the queue in
        timestamp order" (readers sort by timestamp)."""
        if len(data) > self.layout.message_bytes:
            raise ValueError(f"a message of {len(data)} bytes is over the mailbox's "
                             f"{self.layout.message_bytes}")
        for s in range(self.layout.slots):
            at = self.layout.entry(s)
            if self._mem[at] != FREE:
                continue
            self._mem[at] = WRITING
            d = self.layout.data(s)
            self._mem[d:d + len(data)] = data
            self.put(Entry(s, WRITING, 0, BOTTOM, 0, 0, 0, len(data), sender, ts, dflags))
            self._mem[at] = PUBLISHED
            return
        raise MailboxFull(f"mailbox copy {self.index}: all {self.layout.slots} slots are in use")

    def data(self, e: Entry) -> bytes:
        d = self.layout.data(e.slot)
        return bytes(self._mem[d:d + e.length])

    def remove(self, e: Entry) -> None:
        self._mem[self.layout.entry(e.slot)] = FREE
