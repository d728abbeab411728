"""Sources and sinks of the OrderInfo stream as the controller sees it: an
ordered sequence of chunks, each a whole number of record groups.

- PrimarySource: the primary's shared ring.
- SavedStreamWriter / SavedStreamSource: a stream kept in a file, so a
  backup can be replayed later (debugging, benchmarks, tests).
- BackupSink: a backup's replay ring."""
from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import threading

from llft.native import REC_SIZE, ROLE_PRIMARY, StreamError, StreamFile, count_groups

log = logging.getLogger("llft.streams")

WRITE_TIMEOUT_MS = 100   # each wait for room in a backup's ring, re-checking that it lives

SAVED_MAGIC = b"LLFTSTRM"
SAVED_VERSION = 1
_FRAME = struct.Struct("<I")


class PrimarySource:
    def __init__(self, stream: StreamFile):
        self.stream = stream
        self.exited = threading.Event()
        self.exit_status: int | None = None   # the primary program's, once it has exited

    def read(self, max_slots: int) -> bytes:
        # A backup taking over still consumes the failed primary's last
        # records from this ring: it is ours only once it says it is primary.
        if self.stream.role != ROLE_PRIMARY:
            return b""
        return self.stream.read(max_slots)

    def wait(self, timeout_ms: int) -> None:
        self.stream.wait_data(timeout_ms)

    def position(self) -> int:
        """The ring position read up to."""
        return self.stream.tail

    def finished(self) -> bool:
        return self.exited.is_set()

    def finish(self, exit_status: int | None = None):
        """The primary has exited (with exit_status) or failed: the
        forwarder drains it now."""
        self.exit_status = exit_status
        self.exited.set()
        self.stream.wake()

    def leftover(self) -> int:
        """Slots the primary reserved but never committed (it died mid-write)."""
        return self.stream.pending


class SavedStreamWriter:
    """Appends chunks as frames: [u32 slot count][slots]."""

    HEADER = len(SAVED_MAGIC) + _FRAME.size

    def __init__(self, path):
        self.path = path
        self.f = open(path, "wb")
        self.f.write(SAVED_MAGIC + _FRAME.pack(SAVED_VERSION))
        self.position = self.HEADER   # bytes written so far (whole frames)
        self.closed = False

    def write(self, chunk: bytes):
        self.f.write(_FRAME.pack(len(chunk) // REC_SIZE))
        self.f.write(chunk)
        self.position += _FRAME.size + len(chunk)

    def flush(self) -> int:
        """Makes everything written so far readable from the file; returns its length."""
        if not self.closed:
            self.f.flush()
        return self.position

    def keep_from(self, at: int):
        """Drops the frames before byte at (a frame boundary this writer
        reached): the file holds what follows it only, as if this writer
        had started there."""
        self.f.flush()
        with open(self.path, "rb") as f:
            f.seek(at)
            rest = f.read(self.position - at)
        self.f.close()
        self.f = open(self.path, "wb")
        self.f.write(SAVED_MAGIC + _FRAME.pack(SAVED_VERSION))
        self.f.write(rest)
        self.position = self.HEADER + len(rest)

    def close(self):
        self.closed = True
        self.f.close()


def read_frames(f, end: int, max_bytes: int = 1 << 20) -> bytes:
    """Reads whole frames of a saved stream from f's position up to byte
    end (a frame boundary), at most about max_bytes of slots; returns the
    slots, without the frame headers."""
    out = []
    size = 0
    while f.tell() < end and size < max_bytes:
        (n,) = _FRAME.unpack(f.read(_FRAME.size))
        chunk = f.read(n * REC_SIZE)
        if len(chunk) != n * REC_SIZE:
            raise StreamError(f"saved stream cut short at byte {f.tell()}")
        out.append(chunk)
        size += len(chunk)
    return b"".join(out)


class SavedStreamSource:
    """Replays a saved stream; a cut-off or corrupt file ends the stream
    early with `error` set, and the backup then reports what it lacks."""

    def __init__(self, path):
        try:
            self.f = open(path, "rb")
        except OSError as e:
            raise StreamError(f"{path}: {e.strerror}") from None
        head = self.f.read(len(SAVED_MAGIC) + _FRAME.size)
        if len(head) < len(SAVED_MAGIC) + _FRAME.size or head[:len(SAVED_MAGIC)] != SAVED_MAGIC:
            raise StreamError(f"{path}: not a saved llft stream")
        (version,) = _FRAME.unpack(head[len(SAVED_MAGIC):])
        if version != SAVED_VERSION:
            raise StreamError(f"{path}: saved stream version {version}, expected {SAVED_VERSION}")
        self.path = path
        self.error = None
        self.done = False
        self.exit_status = None   # a saved stream does not say how its program ended

    def read(self, max_slots: int) -> bytes:
        if self.done:
            return b""
        pos = self.f.tell()
        head = self.f.read(_FRAME.size)
        if not head:
            self.done = True
            return b""
        chunk = b""
        if len(head) == _FRAME.size:
            (n,) = _FRAME.unpack(head)
            chunk = self.f.read(n * REC_SIZE)
            if len(chunk) == n * REC_SIZE:
                try:
                    count_groups(chunk)
                    return chunk
                except StreamError as e:
                    self.error = f"{self.path}: frame at byte {pos}: {e}"
        if self.error is None:
            self.error = f"{self.path}: truncated at byte {pos}"
        self.done = True
        return b""

    def wait(self, timeout_ms: int) -> None:
        pass

    def finished(self) -> bool:
        return self.done

    def leftover(self) -> int:
        return 0


class BackupSink:
    """A backup's ring, as the forwarder and a catch-up feeder fill it."""

    def __init__(self, replica: int, stream: StreamFile, alive):
        self.replica = replica
        self.stream = stream
        self.alive = alive
        self.dead = False
        self.delivered = 0                # records written into its ring (what it has to replay)
        self.joined = threading.Event()   # the forwarder feeds it (set at once but for late joiners)
        self.joined.set()

    def feed(self, chunk: bytes, timeout_ms: int) -> bool:
        """Writes whole record groups into the ring, waiting for room as
        long as the replica lives; False once it is gone (dead)."""
        view = memoryview(chunk)
        while view and not self.dead:
            n = self.stream.write(view, timeout_ms=timeout_ms)
            view = view[n * REC_SIZE:]
            if n == 0 and not self.alive():
                self.dead = True
        if not self.dead:
            self.delivered += count_groups(chunk)
        return not self.dead

    def give(self, chunk: bytes) -> None:
        """feed() as an ordering backend does it: a replica found gone is
        said once, and gets nothing more."""
        if not self.dead and not self.feed(chunk, WRITE_TIMEOUT_MS):
            log.info("replica %d is gone; no longer feeding it", self.replica)


def _ring_dir(directory: str | None = None) -> str:
    return directory or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")


def stream_path(run_id: str, replica: int, directory: str | None = None) -> str:
    """Shared-file path of a replica; the same length for every replica, so
    that every replica's environment (and so its stack layout) is alike.
    run_id is the controller's pid."""
    return os.path.join(_ring_dir(directory), f"llft-{run_id}-r{replica:02d}")


def image_dir(run_id: str, replica: int, directory: str | None = None) -> str:
    """Where a checkpoint of the replica that becomes replica is kept while
    it is taken and restored (llft/checkpoint/clone.py): in directory, or
    in memory."""
    return os.path.join(_ring_dir(directory), f"llft-{run_id}-ck{replica:02d}")


_RING_NAME = re.compile(r"llft-(\d+)-(?:r|ck)\d{2,}")


def sweep_dead_rings(directory: str | None = None) -> int:
    """Removes the ring files of controllers that died without removing
    them (killed with SIGKILL: a host crash, as the soak makes them), ours
    only: 16 MiB of shared memory each otherwise stays until reboot.
    Returns how many."""
    base, removed = _ring_dir(directory), 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        m = _RING_NAME.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue                    # its controller lives
        except ProcessLookupError:
            pass
        except OSError:
            continue                    # alive, not ours to judge
        path = os.path.join(base, name)
        try:
            if os.stat(path).st_uid == os.geteuid():
                if os.path.isdir(path):
                    shutil.rmtree(path)   # a checkpoint's images
                else:
                    os.unlink(path)
                removed += 1
        except OSError:
            pass
    if removed:
        log.info("removed %d ring files of llft controllers that died without removing them", removed)
    return removed
