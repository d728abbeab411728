"""The OrderInfo ring and codec, through the cffi module (the same C code the
preload library runs)."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llft.native import (REC_SIZE, OrderInfo, StreamCorrupt, StreamError, StreamFile, decode, encode, op_code)

SLOTS = 8192  # the smallest ring: easy to fill and wrap
CLOCK = op_code("clock_gettime")
RANDOM = op_code("getrandom")
LOCK = op_code("pthread_mutex_lock")


@pytest.fixture
def ring(tmp_path):
    s = StreamFile(tmp_path / "stream", create=True, slots=SLOTS)
    yield s
    s.close()


entries = st.builds(
    OrderInfo,
    op=st.sampled_from([CLOCK, RANDOM, LOCK]),
    tid=st.integers(0, 2**32 - 1), n=st.integers(1, 2**32 - 1),
    obj=st.integers(0, 2**64 - 1), turn=st.integers(0, 2**64 - 1),
    ret=st.integers(-2**63, 2**63 - 1), err=st.integers(0, 200),
    val=st.integers(-2**63, 2**63 - 1),
)


def with_data(e: OrderInfo, data: bytes) -> OrderInfo:
    return OrderInfo(op=e.op, tid=e.tid, n=e.n, obj=e.obj, turn=e.turn, ret=e.ret, err=e.err,
                     val=len(data) if data else e.val, data=data)


@settings(max_examples=200)
@given(st.lists(st.tuples(entries, st.binary(max_size=300)), max_size=20))
def test_codec_round_trip(pairs):
    batch = [with_data(e, d) for e, d in pairs]
    assert decode(encode(batch)) == batch


def test_ring_round_trip_in_order(ring):
    batch = [OrderInfo(op=CLOCK, tid=1, n=i + 1, obj=1, val=i * 7) for i in range(100)]
    assert ring.write(encode(batch)) == 100
    assert decode(ring.read(4096)) == batch
    assert ring.pending == 0


def test_full_ring_refuses_more_and_recovers(ring):
    one = encode([OrderInfo(op=CLOCK, tid=0, n=1)])
    assert ring.write(one * SLOTS, timeout_ms=0) == SLOTS
    assert ring.write(one, timeout_ms=50) == 0, "a full ring must not overwrite unread records"
    assert len(ring.read(100)) == 100 * REC_SIZE
    assert ring.write(one * 150, timeout_ms=50) == 100


def test_wrapped_ring_keeps_order(ring):
    seen = []
    n = 0
    for _ in range(5):  # 5 laps of the ring, groups with data straddling the end
        batch = [OrderInfo(op=RANDOM, tid=2, n=n + i + 1, obj=1, ret=100, data=os.urandom(100)) for i in range(2000)]
        n += len(batch)
        raw = encode(batch)
        written = 0
        while written < len(raw) // REC_SIZE:
            written += ring.write(raw[written * REC_SIZE:], timeout_ms=0)
            seen += decode(ring.read(4096))
        seen += decode(ring.read(8192))
    assert [e.n for e in seen] == list(range(1, n + 1))
    assert all(len(e.data) == 100 for e in seen)


def test_reader_never_returns_a_partial_group(ring):
    raw = encode([OrderInfo(op=RANDOM, tid=0, n=1, ret=200, data=b"x" * 200)])
    groups = len(raw) // REC_SIZE
    assert ring.write(raw[:-REC_SIZE], timeout_ms=0) == groups - 1
    assert ring.read(4096) == b"", "a group is handed over only when complete"
    ring.write(raw[-REC_SIZE:], timeout_ms=0)
    assert decode(ring.read(4096))[0].data == b"x" * 200


def test_torn_record_is_never_read(ring):
    """A producer reserved a slot and died before committing it, while
    another producer committed the next one: the reader must stop at the
    gap, not skip it and not hand over the later record out of order."""
    from llft._native import ffi, lib
    cached = ffi.new("uint64_t *")
    torn = lib.llft_ring_reserve(ring.ring, 1, cached)       # never committed
    later = lib.llft_ring_reserve(ring.ring, 1, cached)
    ffi.memmove(lib.llft_ring_slot(ring.ring, later), encode([OrderInfo(op=CLOCK, tid=1, n=1)]), REC_SIZE)
    lib.llft_ring_commit(lib.llft_ring_slot(ring.ring, later), later)
    assert (torn, later) == (0, 1)
    assert ring.read(4096) == b""
    assert not ring.wait_data(10)
    assert ring.pending == 2, "the controller sees two slots it can never read: a torn stream"


def test_a_promoted_ring_lets_its_new_reader_sleep(ring):
    """PROMOTE hands the ring over: the replica that read it writes from
    now on, and the controller reads.  An empty ring must then let the
    controller wait (a closed one never does: its thread spun on a CPU)."""
    ring.write_promote()
    assert decode(ring.read(10))[0].op == op_code("promote")
    assert not ring.closed
    assert not ring.wait_data(10)
    ring.write_end(0)
    assert ring.closed and ring.wait_data(10), "after END the reader must not wait"


def test_corrupt_record_raises_clear_error(ring):
    ring.write(encode([OrderInfo(op=CLOCK, tid=0, n=1, val=5)]))
    slot = ring.raw_slot(0)
    slot[40:41] = bytes([slot[40][0] ^ 0xFF])  # flip the value's bits after it was sealed
    with pytest.raises(StreamCorrupt, match="integrity check"):
        ring.read(10)


def test_decode_rejects_garbage_without_crashing():
    with pytest.raises(StreamCorrupt):
        decode(b"\x00" * REC_SIZE)
    with pytest.raises(StreamCorrupt, match="whole number"):
        decode(b"abc")
    good = encode([OrderInfo(op=RANDOM, tid=0, n=1, data=b"y" * 100)])
    with pytest.raises(StreamCorrupt):
        decode(good[:-REC_SIZE])  # a cut-off group
    with pytest.raises(StreamCorrupt):
        decode(good[REC_SIZE:])   # data slots without their header


@settings(max_examples=300)
@given(st.binary(min_size=REC_SIZE, max_size=REC_SIZE * 4).filter(lambda b: len(b) % REC_SIZE == 0))
def test_decode_random_bytes_is_an_error_or_valid(raw):
    try:
        decode(raw)
    except StreamCorrupt:
        pass


def test_stream_file_errors_are_clear(tmp_path):
    with pytest.raises(StreamError, match="No such file"):
        StreamFile(tmp_path / "missing")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(StreamError, match="empty"):
        StreamFile(tmp_path / "empty")
    (tmp_path / "foreign").write_bytes(b"not a stream" * 1000)
    with pytest.raises(StreamError, match="not an llft stream"):
        StreamFile(tmp_path / "foreign")
    s = StreamFile(tmp_path / "real", create=True, slots=SLOTS)
    s.close()
    with open(tmp_path / "real", "r+b") as f:
        f.truncate(8192)
    with pytest.raises(StreamError, match="truncated"):
        StreamFile(tmp_path / "real")


def test_a_snapshot_with_records_carries_them_across_the_wrap(tmp_path, ring):
    """A backup's ring copied to another host (checkpoint_join.py): the
    control block and the records it has yet to consume, wrapped round the
    end, are read back in order from the copy; a copy of the wrong size, or
    one that does not carry the records its header counts, is refused."""
    one = encode([OrderInfo(op=CLOCK, tid=0, n=1)])
    assert ring.write(one * (SLOTS - 10), timeout_ms=0) == SLOTS - 10
    assert len(ring.read(SLOTS - 10)) == (SLOTS - 10) * REC_SIZE   # the next records wrap
    batch = [OrderInfo(op=CLOCK, tid=2, n=i + 1, obj=3, val=i) for i in range(40)]
    assert ring.write(encode(batch), timeout_ms=0) == 40
    with pytest.raises(StreamError, match="not consumed"):
        ring.snapshot()
    data = ring.snapshot(records=True)
    assert StreamFile.snapshot_records(data) == 40
    copy = StreamFile(tmp_path / "copy", create=True, slots=SLOTS, replica=5)
    copy.load_snapshot(data, 5)
    assert (copy.head, copy.tail) == (ring.head, ring.tail)
    assert decode(copy.read(4096)) == batch
    for bad in (data[:-1], data[:-REC_SIZE]):
        other = StreamFile(tmp_path / f"bad{len(bad)}", create=True, slots=SLOTS)
        with pytest.raises(StreamError):
            other.load_snapshot(bad, 1)
        assert other.head == other.tail == 0, "a refused copy leaves the ring as it was"
        other.close()
    copy.close()
