"""A member's bounded history (llft/cluster/history.py): past its limit it
keeps only the recent quarter of the ordering entries and no requests, and
frees what it dropped a batch at a time, never all in one event-loop turn."""
from __future__ import annotations

from llft.cluster.history import FREE_BATCH, GroupHistory
from llft.cluster.payload import DATA

ENTRY = 200


def filled(limit: int, requests: int, entries: int) -> GroupHistory:
    h = GroupHistory(1 << 40)
    for i in range(requests):
        h.add_input(i % 3, (DATA, b"SET k%d v%d\n" % (i, i)))
    for oseq in range(1, entries + 1):
        h.add_entry(oseq, bytes(ENTRY))
    h.limit = limit
    return h


def test_past_the_limit_the_recent_quarter_of_entries_is_kept_and_requests_go():
    h = filled(1 << 20, 20_000, 3_000)     # 600 KB of entries, ~1.5 MB of requests
    h.add_entry(3_001, bytes(ENTRY))
    assert not h.complete and h.why_incomplete() and h.inputs == {}
    h.add_input(0, (DATA, b"late"))
    assert h.inputs == {}, "no request is kept once past the limit"
    for oseq in range(3_002, 3_100):
        h.add_entry(oseq, bytes(ENTRY))
    kept = list(h.entries)
    assert kept == list(range(kept[0], 3_100)), "the most recent entries, consecutive"
    assert h.entry_bytes == len(kept) * ENTRY <= h.limit // 4 < h.entry_bytes + ENTRY


def test_what_is_dropped_is_freed_a_batch_at_a_time():
    h = filled(1 << 18, 3 * FREE_BATCH, 100)   # ~500 KB of requests
    h.add_entry(101, bytes(ENTRY))
    assert not h.complete
    held = sum(map(len, h._dropped))
    assert 0 < held < 3 * FREE_BATCH, "some requests freed at once, not all"
    adds = 0
    while h._dropped:
        h.add_entry(102 + adds, bytes(ENTRY))
        adds += 1
        assert sum(map(len, h._dropped)) >= held - adds * FREE_BATCH
    assert adds >= 2
