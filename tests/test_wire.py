"""Wire format: every message type and header field round-trips; every kind
of bad datagram is a counted drop with its reason; keys and key files."""
from __future__ import annotations

import os
import stat

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llft.ordering.llmp import wire
from llft.auth import Keyring, KeyFileError, generate_key_file, load_key
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.fragments import Codec, split
from llft.ordering.llmp.wire import DropError, MsgType, Piggyback

KEYS = Keyring(b"a" * 32)
FIG2 = ("messageType", "sourceGroupId", "destGroupId", "connSeqNum", "primaryViewNum", "precedence",
        "msgSeqNum", "ackViewNum", "ack", "back", "timestamp")
U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)


def test_every_message_type_has_a_class():
    names = {cls.__name__ for cls in wire.MESSAGE_CLASSES.values()}
    assert {"Request", "Reply", "FirstAck", "SecondAck", "Nack", "Heartbeat", "KeepAlive",
            "ProposePrimary", "ProposePrimaryAck", "NewPrimaryView", "NewPrimaryViewAck",
            "ProposeBackup", "AcceptBackup", "AcceptBackupAck", "RemoveBackup", "RemoveBackupAck",
            "State", "StateAck"} <= names
    m = wire.Request(src_group=1)
    for f in FIG2:
        getattr(m, f)  # every Fig. 2 header field is there under its paper name


@given(mtype=st.sampled_from(list(MsgType)), fields=st.fixed_dictionaries(
    {f: st.integers(0, wire.MAX_TIMESTAMP) if f == "timestamp" else U64
     for f in wire.HEADER_FIELDS if f not in ("role", "dst_group")}),
       role=st.integers(0, 2), dst=U32, payload=st.binary(max_size=300),
       pb=st.none() | st.builds(Piggyback, U64, st.lists(st.binary(max_size=64), max_size=4),
                                U64, st.lists(st.binary(max_size=64), max_size=4), U64),
       body=st.none() | st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3))
def test_message_round_trip(mtype, fields, role, dst, payload, pb, body):
    m = wire.make(mtype, role=role, dst_group=dst, payload=payload, piggyback=pb, body=body, **fields)
    data = wire.encode_message(m)
    assert wire.decode_message(data) == m
    codec = Codec(KEYS, {dst}, Config())
    got = [codec.decode(d, 0.0) for d in codec.encode(m)]
    assert got[-1][0] == m and all(g is None for g in got[:-1])


def _frame_of(m, keys=KEYS):
    return split(keys, m.dst_group, wire.encode_message(m), 1472)[0]


def _drop_reason(datagram, accept=(5,), keys=KEYS):
    codec = Codec(keys, set(accept), Config())
    assert codec.decode(datagram, 0.0) is None
    snap = codec.drops.snapshot()
    assert sum(snap.values()) == 1, snap
    return next(iter(snap))


def test_each_drop_reason():
    good = _frame_of(wire.Request(src_group=4, dst_group=5, msn=1, payload=b"x"))
    assert _drop_reason(good, accept=(6,)) == "foreign-group"
    assert _drop_reason(good[:10]) == "truncated"
    assert _drop_reason(good[:-1] + bytes([good[-1] ^ 1])) == "bad-mac"
    assert _drop_reason(good, keys=Keyring(b"b" * 32)) == "bad-mac"
    assert _drop_reason(good, keys=Keyring()) == "bad-mac"          # no key for the group
    assert _drop_reason(b"XX" + good[2:]) == "malformed"
    bad_version = bytearray(good)
    bad_version[2] = 99
    assert _drop_reason(bytes(bad_version)) == "bad-version"

    def body(raw: bytes) -> bytes:   # a correctly MACed frame around any body
        return wire.encode_frame(KEYS, 5, 0, 0, 1, raw)
    fields = [1, 1] + [0] * len(wire.HEADER_FIELDS) + [None, None, b""]
    fields[3] = 5
    assert _drop_reason(body(msgpack.packb([2] + fields[1:]))) == "bad-version"
    assert _drop_reason(body(msgpack.packb([1, 99] + fields[2:]))) == "unknown-type"
    assert _drop_reason(body(msgpack.packb(fields)[:-3])) == "truncated"
    assert _drop_reason(body(msgpack.packb(fields) + b"\x00")) == "malformed"
    assert _drop_reason(body(msgpack.packb(fields[:-1]))) == "malformed"
    assert _drop_reason(body(b"\xc1")) == "malformed"
    neg = list(fields)
    neg[5] = -1
    assert _drop_reason(body(msgpack.packb(neg))) == "malformed"
    s = list(fields)
    s[-1] = "text"
    assert _drop_reason(body(msgpack.packb(s))) == "malformed"
    other = list(fields)
    other[3] = 6
    assert _drop_reason(body(msgpack.packb(other))) == "foreign-group"  # header disagrees with frame


def test_drop_counters_snapshot_is_a_plain_dict():
    c = wire.DropCounters()
    c.count("bad-mac")
    c.count("bad-mac", 2)
    snap = c.snapshot()
    assert snap == {"bad-mac": 3} and type(snap) is dict and c.total() == 3
    snap["x"] = 1
    assert "x" not in c.snapshot()


def test_key_files(tmp_path):
    path = tmp_path / "group.key"
    key = generate_key_file(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_key(str(path)) == key and len(key) == 32
    with pytest.raises(FileExistsError):
        generate_key_file(str(path))
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_key(str(path))
    short = tmp_path / "short.key"
    short.write_text("abcd\n")
    os.chmod(short, 0o600)
    with pytest.raises(KeyFileError):
        load_key(str(short))
    with pytest.raises(KeyFileError):
        load_key(str(tmp_path / "missing"))


def test_group_keys_separate_groups():
    ring = Keyring(default=b"d" * 32, groups={7: b"s" * 32})
    m = wire.Request(src_group=1, dst_group=7, msn=1)
    assert Codec(ring, {7}, Config()).decode(_frame_of(m, ring), 0.0) is not None
    assert _drop_reason(_frame_of(m, Keyring(b"d" * 32)), accept=(7,), keys=ring) == "bad-mac"


def test_fragmented_message_reassembles_in_any_order_and_drops_are_bounded():
    m = wire.Reply(src_group=1, dst_group=5, msn=3, payload=os.urandom(100_000))
    codec = Codec(KEYS, {5}, Config())
    frames = codec.encode(m)
    assert len(frames) > 60 and all(len(f) <= 1472 for f in frames)
    results = [codec.decode(f, 0.0) for f in reversed(frames + frames[:5])]
    done = [r for r in results if r is not None]
    assert len(done) == 1 and done[0][0] == m
    assert len(codec.reassembler) == 0
    # A partial message that stops making progress is dropped and counted.
    small = Config(reassembly_timeout=1.0, reassembly_bytes=50_000)
    codec = Codec(KEYS, {5}, small)
    for f in frames[:-1]:
        codec.decode(f, 0.0)
    assert codec.reassembler.buffered_bytes <= 50_000
    assert codec.drops["reassembly-overflow"] >= 1
    codec.decode(codec.encode(wire.Reply(src_group=1, dst_group=5, msn=4, payload=b"y" * 5000))[0], 0.0)
    codec.reassembler.expire(5.0)
    assert len(codec.reassembler) == 0 and codec.drops["reassembly-timeout"] >= 1
