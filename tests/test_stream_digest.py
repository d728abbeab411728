"""The relays' output digest (llft/serving/stream_digest.py): the same
whatever chunks the stream comes in, and the same when another process
goes on from its state, so that a replica restored from another's
checkpoint agrees with the others."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llft.serving.stream_digest import BLOCK, StreamDigest


def digest(chunks) -> str:
    d = StreamDigest()
    for c in chunks:
        d.update(c)
    return d.hexdigest()


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=3 * BLOCK + 100), cuts=st.lists(st.integers(0, 3 * BLOCK + 100), max_size=8),
       resume_at=st.integers(0, 3 * BLOCK + 100))
def test_chunks_and_a_resumed_state_give_one_digest(data, cuts, resume_at):
    whole = digest([data])
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    assert digest([data[a:b] for a, b in zip(bounds, bounds[1:])]) == whole
    at = min(resume_at, len(data))
    first = StreamDigest()
    first.update(data[:at])
    went_on = StreamDigest(*first.state())
    went_on.update(data[at:])
    assert went_on.hexdigest() == whole


def test_different_streams_differ():
    assert digest([b"a" * BLOCK, b"b"]) != digest([b"a" * BLOCK, b"c"])
    assert digest([b"a" * BLOCK]) != digest([b"a" * (BLOCK - 1)])
