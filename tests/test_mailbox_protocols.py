"""The mailbox protocols' own properties (specs/mailbox.md §11) on the
deterministic harness: random interleavings, clock offsets and faults
drawn from a seed, the protocols unchanged on real segments."""
from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llft.ordering.mailbox import membership, server
from llft.ordering.mailbox.config import ConfigError, Timing, quorum, tolerated_receivers
from llft.ordering.mailbox.protocol1 import Receiver1
from llft.ordering.mailbox.segment import Copy, MailboxFull
from llft.ordering.mailbox.sim import Sim
from mailbox_harness import (MS, TIMING, Scenario, check_consensus, check_copies_agree,
                                   check_order, check_queues_empty, check_validity, run, settle)

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def scenarios(protocol: int):
    @st.composite
    def build(draw):
        copies = draw(st.integers(1, 3))
        receivers = draw(st.integers(1, 4))
        tolerated = tolerated_receivers(receivers, protocol)
        kills = draw(st.integers(0, min(tolerated, receivers - 1)))
        fast = 0
        if protocol == 2:
            fast = draw(st.integers(0, tolerated - kills))
        return Scenario(
            protocol=protocol, copies=copies, receivers=receivers,
            senders=draw(st.integers(1, 3)), messages=draw(st.integers(1, 4)),
            seed=draw(st.integers(0, 2**32 - 1)),
            copy_crashes=draw(st.integers(0, copies - 1)),
            sender_kills=draw(st.integers(0, 1)),
            receiver_kills=kills, fast_receivers=fast)
    return build()


def check_all(sc: Scenario) -> None:
    check_consensus(sc)
    check_order(sc)
    check_validity(sc)
    check_copies_agree(sc)
    check_queues_empty(sc)


@SETTINGS
@given(scenarios(1))
def test_protocol_1_with_crashed_copies_senders_and_receivers(sc):
    with tempfile.TemporaryDirectory() as d:
        check_all(run(sc, d))


@SETTINGS
@given(scenarios(2))
def test_protocol_2_with_crashed_copies_senders_receivers_and_fast_clocks(sc):
    with tempfile.TemporaryDirectory() as d:
        check_all(run(sc, d))


def test_all_copies_but_one_fail_mid_run(tmp_path):
    """P4 at its limit: f = n − 1 copies fail while messages are in flight."""
    for protocol in (1, 2):
        for seed in range(4):
            d = tmp_path / f"{protocol}-{seed}"
            d.mkdir()
            check_all(run(Scenario(protocol=protocol, copies=3, receivers=3, senders=2,
                                   messages=4, seed=seed, copy_crashes=2), str(d)))


def fast_receiver_runs(tmp_path, protocol: int) -> list[Scenario]:
    """Three receivers, one with a clock far ahead; the sender's steps
    take up to their bounds, so the fast one can decide between them."""
    runs = []
    for seed in range(6):
        d = tmp_path / str(seed)
        d.mkdir()
        runs.append(run(Scenario(protocol=protocol, copies=2, receivers=3, senders=1, messages=3,
                                 seed=seed, fast_receivers=1, timing=Timing(delta_s=6 * MS)), str(d)))
    return runs


def test_protocol_1_is_broken_by_a_fast_receiver(tmp_path):
    """P12, the known limitation: in Protocol 1 a receiver whose clock runs
    far ahead decides before an intact sender set its a-flags, and every
    other receiver follows its reject."""
    rejected = 0
    for sc in fast_receiver_runs(tmp_path, 1):
        check_consensus(sc)
        rejected += sum(1 for ds in sc.decisions.values() for x in ds if not x.accepted)
    assert rejected > 0, "a fast receiver never made Protocol 1 reject: the negative control failed"


def test_protocol_2_tolerates_the_fast_receiver(tmp_path):
    """P11: the same fast receiver, under Protocol 2, rejects nothing an
    intact sender sent."""
    for sc in fast_receiver_runs(tmp_path, 2):
        check_all(sc)


@pytest.mark.parametrize("stall", ["before-write", "between-phases"])
def test_protocol_2_rejects_a_message_that_expired_before_it_was_available(tmp_path, stall):
    """P11: a sender that stalls past T + X, before it writes or between its
    phases: every intact receiver rejects its message, and the order of
    the others is kept."""
    for seed in range(4):
        d = tmp_path / str(seed)
        d.mkdir()
        sc = run(Scenario(protocol=2, copies=2, receivers=3, senders=2, messages=2, seed=seed,
                          slow_sender=stall), str(d))
        check_all(sc)
        late = [s.ts for s in sc.sent if s.sender == "sender0" and s.ts is not None]
        assert late
        for ds in sc.decisions.values():
            decided = {x.ts: x.accepted for x in ds}
            assert all(decided.get(ts) is False for ts in late), "a late message was accepted"


def test_protocol_2_orders_a_late_but_young_message_before_younger_ones(tmp_path):
    """P3 with a slow sender: a message that turns up after younger ones,
    before it expired, is still decided and delivered in timestamp order at
    every intact receiver (delivery waits for T + X + ε)."""
    for seed in range(6):
        d = tmp_path / str(seed)
        d.mkdir()
        check_all(run(Scenario(protocol=2, copies=2, receivers=3, senders=3, messages=3,
                               seed=seed, slow_sender="within-expiry"), str(d)))


def test_a_decision_in_a_copy_that_then_fails_is_followed(tmp_path):
    """The race of §5.3: the sender set its a-flag in M1 only, then died;
    receiver A accepts in M1 and M1 fails; receiver B, finding M1 failed,
    must follow A's decision in M2 rather than reject on M2's a-flag."""
    server.create("race", 2, 1, TIMING, receivers=4, slots=8, message_bytes=16, directory=str(tmp_path))
    sim = Sim(3)
    mbs = [server.connect("race", TIMING, pid=30 + i, clock=sim.clock(), directory=str(tmp_path))
           for i in range(3)]
    a_slot, entry = settle(membership.join(mbs[0]))
    b_slot, _ = settle(membership.join(mbs[1]))
    sim.now = entry + 1
    sender = sim.spawn_with("sender", mbs[2].clock, mbs[2].send(b"m"), at=sim.now)
    a = sim.spawn_with("A", mbs[0].clock, Receiver1(mbs[0], a_slot).receive(), at=sim.now)
    # B starts half a slot after A's decision in M1.
    b_start = sim.now + mbs[0].send_bound + TIMING.epsilon + TIMING.delta_d // 2
    b = sim.spawn_with("B", mbs[1].clock, Receiver1(mbs[1], b_slot).receive(), at=b_start)
    m1 = mbs[2].copies[0]

    def before_step(p):
        if p is sender and p.steps == 3:       # wrote M1, M2, set the a-flag in M1
            sim.kill(sender)
        if not m1_failed:
            with m1.step():
                decided = [e for e in m1.published() if e.decision == 1]
            if decided:
                m1.crash()
                m1_failed.append(True)
    m1_failed: list = []
    sim.before_step = before_step
    sim.run(until=sim.now + 200 * MS)
    assert m1_failed and sender.dead
    assert a.result.accepted, "A saw the a-flag in M1 and should have accepted"
    assert b.result is not None and b.result.accepted, "B rejected what A accepted: consensus broken"


def test_join_and_leave_bound_the_d_flags(tmp_path):
    """P13: a receiver gets d-flags exactly for messages with entry ≤ ts < exit."""
    server.create("jl", 2, 1, TIMING, receivers=4, slots=32, message_bytes=16, directory=str(tmp_path))
    sim = Sim(1)
    clock = sim.clock()
    mb = server.connect("jl", TIMING, pid=7, clock=clock, directory=str(tmp_path))
    sender = server.connect("jl", TIMING, pid=8, clock=clock, directory=str(tmp_path))
    slot, entry = settle(membership.join(mb))
    early = settle(sender.send(b"early"))      # before the entry time
    sim.now = entry
    inside = settle(sender.send(b"inside"))
    exit_time = settle(membership.leave(mb, slot))
    sim.now = exit_time
    after = settle(sender.send(b"after"))
    for c in mb.copies:
        with c.step():
            flags = {e.ts: e.dflags[slot] for e in c.published()}
        assert flags[early] == -2 and flags[inside] == -1 and flags[after] == -2


def test_a_crash_report_frees_what_the_dead_receiver_held(tmp_path):
    """P14: a crashed receiver's messages leave the queue once it is reported."""
    server.create("gc", 2, 1, TIMING, receivers=4, slots=32, message_bytes=16, directory=str(tmp_path))
    sim = Sim(2)
    mbs = [server.connect("gc", TIMING, pid=20 + i, clock=sim.clock(), directory=str(tmp_path))
           for i in range(2)]
    slots = [settle(membership.join(m))[0] for m in mbs]
    sim.now = 20 * MS
    ts = settle(mbs[0].send(b"x"))
    sim.now += 20 * MS
    live = Receiver1(mbs[0], slots[0])
    p = sim.spawn_with("r", mbs[0].clock, live.receive(), at=sim.now)
    sim.run(until=sim.now + 100 * MS)
    assert p.result.accepted and p.result.ts == ts
    with mbs[0].copies[0].step() as c:
        assert len(c.published()) == 1, "removed though a receiver had not read it"
    settle(membership.report_crash(mbs[0], slots[1]))
    for c in mbs[0].copies:
        with c.step():
            assert not c.published()


def test_bad_configurations_are_refused():
    with pytest.raises(ConfigError):
        TIMING.check(0, 1)
    with pytest.raises(ConfigError):
        TIMING.check(2, 3)
    with pytest.raises(ConfigError, match="expiry"):
        Timing(expiry=1).check(3, 2)
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_a_full_mailbox_and_an_oversized_message_are_errors(tmp_path):
    server.create("full", 1, 1, TIMING, receivers=2, slots=2, message_bytes=8, directory=str(tmp_path))
    mb = server.connect("full", TIMING, pid=3, directory=str(tmp_path))
    with pytest.raises(ValueError, match="over the mailbox"):
        settle(mb.send(b"x" * 9))
    settle(mb.send(b"a"))
    settle(mb.send(b"b"))
    with pytest.raises(MailboxFull):
        settle(mb.send(b"c"))


def test_a_file_that_is_not_a_mailbox_copy_is_refused(tmp_path):
    bogus = tmp_path / "llft-mbx-x.0"
    bogus.write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not copy 0 of a mailbox"):
        Copy.open(str(bogus), 0)
