"""Scenarios of the mailbox protocols on the deterministic harness: senders
and receivers on real segments, faults drawn from a seed, and the checks
of the paper's properties (specs/mailbox.md §11) over what happened."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from llft.ordering.mailbox import membership, server
from llft.ordering.mailbox.config import Timing
from llft.ordering.mailbox.mailbox import Delivery, Mailbox
from llft.ordering.mailbox.protocol1 import Receiver1
from llft.ordering.mailbox.protocol2 import Receiver2
from llft.ordering.mailbox.segment import PUBLISHED, Timestamp
from llft.ordering.mailbox.sim import Process, Sim
from llft.ordering.mailbox.steps import Until

TIMING = Timing()
MS = 1_000_000


def settle(protocol) -> object:
    """Run a protocol that only steps (no waits) to its end."""
    try:
        while True:
            effect = next(protocol)
            assert not isinstance(effect, Until), "settle() is for protocols that never wait"
    except StopIteration as done:
        return done.value


@dataclass
class Sent:
    payload: bytes
    ts: Timestamp | None = None   # set once the Send returned
    sender: str = ""


@dataclass
class Scenario:
    protocol: int
    copies: int
    receivers: int
    senders: int
    messages: int                   # per sender
    seed: int
    copy_crashes: int = 0           # copies failed at random steps (< copies)
    sender_kills: int = 0
    receiver_kills: int = 0         # crashed, then reported to the membership
    fast_receivers: int = 0         # timing-faulty: clocks far ahead
    slow_sender: str = ""           # sender0 stalls: "before-write", "between-phases", "within-expiry"
    timing: Timing = TIMING
    # What happened.
    sent: list[Sent] = field(default_factory=list)
    decisions: dict[str, list[Delivery]] = field(default_factory=dict)
    faulty: set[str] = field(default_factory=set)
    receiver_objects: dict[str, object] = field(default_factory=dict)
    sim: Sim | None = None
    admin: Mailbox | None = None
    end: int = 0


def run(sc: Scenario, directory: str) -> Scenario:
    name = f"s{sc.seed}"
    rng = random.Random(sc.seed ^ 0x5EED)
    server.create(name, sc.copies, sc.protocol, sc.timing, receivers=sc.receivers + 2,
                  slots=4 * sc.senders * sc.messages + 8, message_bytes=64, directory=directory)
    sim = sc.sim = Sim(sc.seed)
    sc.admin = server.connect(name, sc.timing, pid=1, clock=sim.clock(), directory=directory)

    slots = {}
    for r in range(sc.receivers):
        mb = server.connect(name, sc.timing, pid=100 + r, clock=sim.clock(), directory=directory)
        slots[r] = settle(membership.join(mb))
    start = sc.timing.delta_j + sc.timing.epsilon + 1

    def receiver_process(r: int, skew: int) -> Process:
        label = f"receiver{r}"
        clock = sim.clock(skew)
        mb = server.connect(name, sc.timing, pid=100 + r, clock=clock, directory=directory)
        slot, entry = slots[r]
        got = sc.decisions.setdefault(label, [])
        if sc.protocol == 1:
            rec = Receiver1(mb, slot)

            def loop():
                while True:
                    got.append((yield from rec.receive()))
            proto = loop()
        else:
            rec = Receiver2(mb, slot, entry)
            proto = rec.run(got.append)
        sc.receiver_objects[label] = rec
        p = sim.spawn_with(label, clock, proto)
        return p

    fast = set(rng.sample(range(sc.receivers), sc.fast_receivers))
    receivers = []
    for r in range(sc.receivers):
        # Intact clocks differ by less than ε; a fast one runs far ahead.
        skew = 20 * sc.timing.epsilon if r in fast else rng.randrange(sc.timing.epsilon // 2)
        if r in fast:
            sc.faulty.add(f"receiver{r}")
        receivers.append(receiver_process(r, skew))

    senders = []
    for s in range(sc.senders):
        label = f"sender{s}"
        clock = sim.clock(rng.randrange(sc.timing.epsilon // 2))
        mb = server.connect(name, sc.timing, pid=10 + s, clock=clock, directory=directory)
        gaps = [rng.randrange(2 * sc.timing.expiry_for(sc.copies)) for _ in range(sc.messages)]
        slow = sc.slow_sender if s == 0 else ""

        def sending(mb=mb, gaps=gaps, label=label, slow=slow):
            for i, gap in enumerate(gaps):
                yield Until(mb.clock.now() + gap)
                record = Sent(f"{label}:{i}".encode(), sender=label)
                sc.sent.append(record)
                ts = yield from _stalling(mb, record.payload, slow, sc)
                record.ts = ts
        # Each step of a Send takes up to its bound: an intact sender.
        bound = min(sc.timing.delta_s, sc.timing.delta_f)
        senders.append(sim.spawn_with(label, clock, sending(), at=start,
                                      step_time=lambda: rng.randrange(bound)))

    _inject_faults(sc, sim, rng, receivers, senders, slots)
    sc.end = start + (2 * sc.messages + 40) * sc.timing.expiry_for(sc.copies)
    sim.run(until=sc.end)
    return sc


def _stalling(mb: Mailbox, payload: bytes, slow: str, sc: Scenario):
    """A Send; a slow sender stalls for longer than Protocol 2's expiry,
    after reading its clock ("before-write") or between its two phases
    ("between-phases"), so that its message is old when it becomes
    available; or for half the expiry before it writes ("within-expiry"),
    so that its message turns up after younger ones, still young enough
    to be accepted."""
    ts = Timestamp(mb.clock.now(), mb.pid)
    expiry = sc.timing.expiry_for(sc.copies)
    if slow == "before-write":
        yield Until(mb.clock.now() + 3 * expiry)
    elif slow == "within-expiry":
        yield Until(mb.clock.now() + expiry // 2)
    phases = mb.send(payload, ts)
    steps = 0
    try:
        effect = next(phases)
        while True:
            yield effect
            steps += 1
            if slow == "between-phases" and steps == sc.copies:
                yield Until(mb.clock.now() + 3 * expiry)
            effect = phases.send(None)
    except StopIteration as done:
        return done.value


def _inject_faults(sc: Scenario, sim: Sim, rng: random.Random, receivers: list[Process],
                   senders: list[Process], slots: dict) -> None:
    # Faults strike after a random number of the senders' steps, so that
    # they fall while messages are in flight.
    total = max(1, sc.senders * sc.messages * 2 * sc.copies)
    plan = []
    for i in rng.sample(range(sc.copies), sc.copy_crashes):
        plan.append((rng.randrange(total), "copy", i))
    for p in rng.sample(senders, sc.sender_kills):
        plan.append((rng.randrange(total), "sender", p))
    intact = [p for p in receivers if p.name not in sc.faulty]
    for p in rng.sample(intact, sc.receiver_kills):
        plan.append((rng.randrange(total), "receiver", p))
    plan.sort(key=lambda f: f[0])
    steps = [0]

    def before_step(p: Process) -> None:
        if p.name.startswith("sender"):
            steps[0] += 1
        while plan and plan[0][0] <= steps[0]:
            _, kind, what = plan.pop(0)
            if kind == "copy":
                sc.admin.copies[what].crash()
            elif kind == "sender":
                sim.kill(what)
            else:
                sim.kill(what)
                sc.faulty.add(what.name)
                r = int(what.name.removeprefix("receiver"))
                _report_later(sc, sim, slots[r][0])

    sim.before_step = before_step


def _report_later(sc: Scenario, sim: Sim, slot: int) -> None:
    """The membership service reports the crash a while later."""
    def report():
        yield Until(sc.admin.clock.now() + 10 * MS)
        yield from membership.report_crash(sc.admin, slot)
    sim.spawn_with("membership", sc.admin.clock, report(), at=sim.now)


# The properties.

def intact_receivers(sc: Scenario) -> dict[str, list[Delivery]]:
    return {r: d for r, d in sc.decisions.items() if r not in sc.faulty}


def check_consensus(sc: Scenario) -> None:
    """P1: every intact receiver decided the same messages, the same way."""
    views = {r: {d.ts: d.accepted for d in ds} for r, ds in intact_receivers(sc).items()}
    first = next(iter(views.values()))
    for r, v in views.items():
        assert v == first, f"{r} decided differently: {_diff(first, v)}"


def check_order(sc: Scenario) -> None:
    """P3: each intact receiver accepts in increasing timestamp order, and
    all accept the same sequence with the same data."""
    seqs = {}
    for r, ds in intact_receivers(sc).items():
        accepted = [(d.ts, d.data) for d in ds if d.accepted]
        assert all(a[0] < b[0] for a, b in zip(accepted, accepted[1:])), f"{r} out of order"
        seqs[r] = accepted
    first = next(iter(seqs.values()))
    for r, s in seqs.items():
        assert s == first, f"{r} accepted another sequence"
    for r in intact_receivers(sc):
        rec = sc.receiver_objects[r]
        assert getattr(rec, "conflicts", 0) == 0, f"{r} met a conflicting decision"
        assert getattr(rec, "order_violations", 0) == 0, f"{r} accepted out of order"


def check_validity(sc: Scenario) -> None:
    """P2: every message whose Send completed (its sender intact through
    it, and not stalled) is accepted, with its data, by every intact
    receiver."""
    for r, ds in intact_receivers(sc).items():
        accepted = {d.ts: d.data for d in ds if d.accepted}
        for s in sc.sent:
            if s.ts is not None and not (sc.slow_sender and s.sender == "sender0"):
                assert accepted.get(s.ts) == s.payload, f"{r} did not accept {s.payload!r}"


def check_queues_empty(sc: Scenario) -> None:
    """P9, P14: once every receiver is done (crashed ones reported), every
    intact copy's queue is empty."""
    from llft.ordering.mailbox.segment import MemoryCrashed
    for c in sc.admin.copies:
        try:
            with c.step():
                left = [e.ts for e in c.published()]
        except MemoryCrashed:
            continue
        assert not left, f"copy {c.index} still holds {len(left)} messages"


def check_copies_agree(sc: Scenario) -> None:
    """P10: no decided message has different decisions in two intact copies."""
    from llft.ordering.mailbox.segment import BOTTOM, MemoryCrashed
    seen: dict[Timestamp, int] = {}
    for c in sc.admin.copies:
        try:
            with c.step():
                entries = [e for e in c.published() if e.state == PUBLISHED]
        except MemoryCrashed:
            continue
        for e in entries:
            if e.decision != BOTTOM:
                assert seen.setdefault(e.ts, e.decision) == e.decision, f"copies disagree on {e.ts}"


def _diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(f"{k}: {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k))[:400]
