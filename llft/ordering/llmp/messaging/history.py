"""Delivery histories and the checker that judges them (exactly once, in
order, same sequence at every member, payload integrity).

Payloads made by `make_payload` name their stream and index and carry
filler derived from both, so a corrupted, misplaced or duplicated message
is caught, not just a missing one."""
from __future__ import annotations

import hashlib
import struct

_HEAD = struct.Struct("!II8s")


class CheckFailed(AssertionError):
    pass


def _filler(stream: int, index: int, size: int) -> bytes:
    seed = hashlib.blake2b(_HEAD.pack(stream, index, b"")[:8], digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


def make_payload(stream: int, index: int, size: int) -> bytes:
    body = _filler(stream, index, max(0, size - _HEAD.size))
    tag = hashlib.blake2b(body, digest_size=8).digest()
    return _HEAD.pack(stream, index, tag) + body


def parse_payload(payload: bytes) -> tuple[int, int]:
    if len(payload) < _HEAD.size:
        raise CheckFailed(f"payload of {len(payload)} bytes")
    stream, index, tag = _HEAD.unpack_from(payload)
    body = payload[_HEAD.size:]
    if hashlib.blake2b(body, digest_size=8).digest() != tag or body != _filler(stream, index, len(body)):
        raise CheckFailed(f"corrupt payload stream={stream} index={index}")
    return stream, index


def check_streams(expected: dict[int, int], histories: dict[str, list[tuple[int, int]]],
                  streams_of: dict[str, set[int]]) -> None:
    """Every member `name` must have delivered, for each stream in
    streams_of[name], exactly indices 0..expected[stream]-1 in order."""
    for name, hist in histories.items():
        for stream in streams_of[name]:
            got = [i for s, i in hist if s == stream]
            want = list(range(expected[stream]))
            if got != want:
                first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                raise CheckFailed(
                    f"{name} stream {stream}: delivered {len(got)} of {len(want)}, "
                    f"first difference at position {first}: got {got[first:first + 5]} want {want[first:first + 5]}")


def check_same_order(histories: dict[str, list]) -> None:
    """Total order: every history is a prefix of the longest."""
    longest = max(histories.values(), key=len, default=[])
    for name, h in histories.items():
        if h != longest[:len(h)]:
            k = next(i for i, (a, b) in enumerate(zip(h, longest)) if a != b)
            raise CheckFailed(f"{name} diverges at position {k}: {h[k]} vs {longest[k]}")
