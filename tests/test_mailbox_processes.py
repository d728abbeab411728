"""The mailbox protocols between real processes on the real clock: copies
in /dev/shm segments, senders and receivers in processes of their own,
and a copy failed mid-run once the receivers have delivered some
messages.  The group keeps delivering, in one order, with nothing an
intact sender sent lost.

Real processes can overrun the per-copy bounds (a loaded machine
preempts them for milliseconds), and an overrun is a timing failure.
So each Send is timed against Δs, and under Protocol 2 each receiver
notes which messages it decided late; validity is asserted for the
messages whose run stayed within the failure hypothesis."""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from llft.ordering.mailbox import membership, server
from llft.ordering.mailbox.config import Timing, tolerated_receivers
from llft.ordering.mailbox.protocol1 import Receiver1
from llft.ordering.mailbox.protocol2 import Receiver2
from llft.ordering.mailbox.steps import run

MS = 1_000_000
# Generous per-copy bounds: Python steps take tens of microseconds, but a
# process on a loaded machine can be preempted for milliseconds.
TIMING = Timing(delta_s=15 * MS, delta_f=10 * MS, delta_d=25 * MS, delta_r=5 * MS,
                delta_fd=5 * MS, poll=2 * MS, rho=2 * MS, epsilon=10 * MS,
                delta_j=10 * MS, delta_l=10 * MS)
COPIES, RECEIVERS, SENDERS, MESSAGES = 3, 3, 2, 12


class TimedReceiver2(Receiver2):
    """A Protocol 2 receiver that notes when it last ended its part of a
    message's decision in a copy.  The decision starts at T + Δs + ε + ρ
    and takes a slot of δd per copy (the ε pause and the quorum wait
    included), so an intact receiver has ended every part by
    T + Δs + ε + ρ + n·δd, which is X − ε: its nxp votes came before the
    expiry.  A part that ends later is this receiver's timing failure."""

    def __init__(self, *args):
        super().__init__(*args)
        t, n = self.mailbox.timing, len(self.mailbox.copies)
        self.decide_within = self.mailbox.send_bound + t.epsilon + t.rho + n * t.delta_d
        self.ended: dict = {}

    def _decide_in(self, c, ts, first):
        try:
            return (yield from super()._decide_in(c, ts, first))
        finally:
            self.ended[ts] = self.mailbox.clock.now()

    def late(self, ts) -> bool:
        return self.ended.get(ts, ts.time) - ts.time > self.decide_within


def receiving(name: str, protocol: int, slot: int, entry: int, out, stop) -> None:
    mb = server.connect(name, TIMING, pid=os.getpid())
    if protocol == 1:
        # Protocol 1 tolerates late receivers: none is counted as failed.
        rec = Receiver1(mb, slot)
        while not stop.is_set():
            d = run(rec.receive(), mb.clock)
            out.put((slot, d.ts.time, d.ts.pid, d.accepted, d.data, False))
    else:
        rec2 = TimedReceiver2(mb, slot, entry)
        run(rec2.run(lambda d: out.put((slot, d.ts.time, d.ts.pid, d.accepted, d.data, rec2.late(d.ts))),
                     until=stop.is_set), mb.clock)


def sending(name: str, index: int, out) -> None:
    mb = server.connect(name, TIMING, pid=os.getpid())
    for i in range(MESSAGES):
        began = time.monotonic_ns()
        ts = run(mb.send(f"{index}:{i}".encode()), mb.clock)
        took = time.monotonic_ns() - began
        out.put((ts.time, ts.pid, f"{index}:{i}".encode(), took))
        time.sleep(0.005)


@pytest.mark.parametrize("protocol", [1, 2])
def test_copies_fail_while_processes_send_and_receive(protocol):
    name = f"t{os.getpid()}-{protocol}"
    server.create(name, COPIES, protocol, TIMING, receivers=RECEIVERS + 1, slots=128, message_bytes=32)
    ctx = multiprocessing.get_context("fork")
    delivered, sent, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = []
    try:
        admin = server.connect(name, TIMING, pid=os.getpid())
        joined = [run(membership.join(admin), admin.clock) for _ in range(RECEIVERS)]
        time.sleep((TIMING.delta_j + TIMING.epsilon) / 1e9)
        for slot, entry in joined:
            procs.append(ctx.Process(target=receiving, args=(name, protocol, slot, entry, delivered, stop)))
        for s in range(SENDERS):
            procs.append(ctx.Process(target=sending, args=(name, s, sent)))
        for p in procs:
            p.start()

        total = SENDERS * MESSAGES
        got: dict[int, list] = {slot: [] for slot, _ in joined}
        failed = []
        late: dict[tuple, int] = {}    # message -> receivers that decided it late
        deadline = time.monotonic() + 60
        while min(len(v) for v in got.values()) < total and time.monotonic() < deadline:
            try:
                slot, t, pid, accepted, data, was_late = delivered.get(timeout=1)
            except Exception:
                continue
            got[slot].append(((t, pid), accepted, data))
            if was_late:
                late[(t, pid)] = late.get((t, pid), 0) + 1
            # Driven by progress: after the 8th delivery, copies 0 and 1 fail.
            if not failed and sum(len(v) for v in got.values()) >= 8:
                server.fail_copy(name, 0)
                server.fail_copy(name, 1)
                failed.append(True)
        stop.set()
        sends = [sent.get(timeout=10) for _ in range(total)]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=0.5)
            if p.is_alive():
                p.kill()
        server.remove(name, COPIES)

    assert failed, "the receivers never delivered 8 messages"
    decisions = {slot: {ts: (acc, data) for ts, acc, data in v} for slot, v in got.items()}
    first = next(iter(decisions.values()))
    assert all(d == first for d in decisions.values()), "receivers decided differently"
    orders = {slot: [ts for ts, acc, _ in v if acc] for slot, v in got.items()}
    for order in orders.values():
        assert order == sorted(order) and order == next(iter(orders.values()))
    assert len(first) == total
    bound = TIMING.send_bound(COPIES)
    tolerated = tolerated_receivers(RECEIVERS, protocol)
    checked = 0
    for t, pid, payload, took in sends:
        # An intact sender (its Send ended within Δs), and no more receivers
        # late on its message than the protocol tolerates.
        if took <= bound and late.get((t, pid), 0) <= tolerated:
            assert first.get((t, pid)) == (True, payload), f"{payload!r} was not accepted"
            checked += 1
    if not checked:
        pytest.skip(f"validity unchecked: every message had a late sender or more than "
                    f"{tolerated} late receivers (the machine overran the bounds)")
