"""The send side's timing rules, each of which the netns run once broke."""
from __future__ import annotations

from llft.ordering.llmp.messaging.recvside import RecvEntry, RecvSide
from llft.ordering.llmp.messaging.sendside import SendSide, SentEntry


def filled(n: int, at: float = 0.0) -> SendSide:
    tx = SendSide(rto=0.03, rto_min=0.01, rto_max=1.0)
    for _ in range(n):
        m = tx.next_msn()
        tx.append(SentEntry(m, m, b"x", at))
    return tx


def test_ack_covering_a_retransmission_gives_no_rtt_sample():
    tx = filled(10)
    tx.retransmitted(tx.sent[1], 0.5)
    tx.on_ack(10, 100, now=3.0)          # the ack also measured a 3 s stall behind msn 1
    assert tx.srtt == 0 and tx.rto == 0.03
    m = tx.next_msn()
    tx.append(SentEntry(m, m, b"x", 3.0))
    tx.on_ack(11, 101, now=3.002)
    assert abs(tx.srtt - 0.002) < 1e-9 and tx.rto == 0.01
    assert tx.quiet() == 0.01


def test_timeout_retransmits_the_first_unacked_only():
    tx = filled(10)
    assert [e.msn for e in tx.due(now=1.0, limit=1)] == [1]
    tx.retransmitted(tx.sent[1], 1.0)
    assert tx.due(now=1.01, limit=1) == []        # msn 2..10 expired too, but are not the gap
    assert [e.msn for e in tx.due(now=1.07, limit=1)] == [1]   # backed off: 2 x rto


def test_acked_retransmission_free_by_watermark():
    tx = filled(5)
    tx.on_ack(5, 50, now=0.001)
    assert tx.on_back(3) == 3 and list(tx.sent) == [4, 5]


def test_receiver_bounds_what_it_holds():
    """At most `window` unconsumed; and once the delivered list (consumed,
    waiting for the group watermark) reaches its bound, at most 2 x window
    held in all."""
    rx = RecvSide(window=4, kept_messages=4)
    for m in range(1, 5):
        assert rx.receive(RecvEntry(m, m, b"", None)) == "new"
    assert rx.receive(RecvEntry(5, 5, b"", None)) == "window"   # 4 unconsumed
    for _ in range(4):
        rx.take()
    for m in range(5, 9):
        assert rx.receive(RecvEntry(m, m, b"", None)) == "new"
    for _ in range(4):
        rx.take()
    # 8 consumed but not yet freed by the group watermark: nothing more fits
    assert rx.receive(RecvEntry(9, 9, b"", None)) == "window"
    assert rx.gc(group_wm=4) == 4
    assert rx.receive(RecvEntry(9, 9, b"", None)) == "new"
    assert rx.receive(RecvEntry(9, 9, b"", None)) == "duplicate"
    # Below the delivered list's bound, consumed messages do not count.
    rx = RecvSide(window=4, kept_messages=100)
    for m in range(1, 41):
        assert rx.receive(RecvEntry(m, m, b"", None)) == "new"
        rx.take()
    assert len(rx.delivered) == 40
