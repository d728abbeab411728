"""The mailbox backend's contract with the record pump, on real segments
and threads: every chunk reaches every backup's ring once and in order,
whatever the mailbox decides (a rejected message is sent again), a backup
added later gets exactly what was sent after, and a failed backup's
messages do not stay in the mailbox."""
from __future__ import annotations

import threading
import time

from llft.ordering.mailbox import backend as mailbox_backend
from llft.ordering.mailbox.backend import MailboxOrdering
from llft.ordering.mailbox.protocol1 import Receiver1
from llft.ordering.mailbox.segment import BOTTOM, MemoryCrashed
from llft.ordering.mailbox.steps import Until


class Ring:
    """What the backend writes into a backup's ring, as the ring would take it."""

    def __init__(self, replica: int):
        self.replica = replica
        self.chunks: list[bytes] = []
        self.dead = False

    def give(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def alive(self) -> bool:
        return not self.dead


def chunks(n: int, start: int = 0) -> list[bytes]:
    return [f"chunk-{i}".encode() * 8 for i in range(start, start + n)]


def backend(protocol: int = 1) -> MailboxOrdering:
    return MailboxOrdering(f"test{threading.get_ident() % 100000}", copies=3, protocol=protocol)


def send_all(b: MailboxOrdering, data: list[bytes]) -> None:
    for c in data:
        b.send(c)
        time.sleep(0.001)


def test_every_chunk_reaches_every_ring_once_in_order():
    for protocol in (1, 2):
        b = backend(protocol)
        try:
            rings = [Ring(1), Ring(2)]
            for r in rings:
                b.add(r)
            data = chunks(60)
            send_all(b, data)
            assert b.flush(10)
            assert all(r.chunks == data for r in rings)
        finally:
            b.close()


def test_a_rejected_message_is_sent_again(monkeypatch):
    """Every copy's decision on the first message is forced to reject
    before the receivers decide: they follow it, and the chunk must come
    again."""
    forced = threading.Event()
    rejected = []   # (receiver slot, timestamp) of each rejection

    class HeldReceiver1(Receiver1):
        """Decides nothing until the saboteur has forced its reject: a
        saboteur thread held off the CPU for the ~23 ms a message waits
        would otherwise find it decided (accepted), and nothing would be
        sent again.  A held receiver is a late one, which Protocol 1
        tolerates."""

        def _decide(self, ts, k):
            while not forced.is_set():
                yield Until(self.mailbox.clock.now() + 1_000_000)
            decision = yield from super()._decide(ts, k)
            if decision != 1:
                rejected.append((self.slot, ts))
            return decision
    monkeypatch.setattr(mailbox_backend, "Receiver1", HeldReceiver1)

    b = backend()
    try:
        rings = [Ring(1), Ring(2)]
        for r in rings:
            b.add(r)

        def reject_first():
            # Until the message is rejected in every copy: the sender may
            # not have written the later copies at the first pass.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                rejected_in = 0
                for c in b._sender.copies:
                    try:
                        with c.step():
                            for e in c.published():
                                if e.decision == BOTTOM:
                                    e.decision = 0
                                    c.put(e)
                                rejected_in += e.decision == 0
                    except MemoryCrashed:
                        pass
                if rejected_in == len(b._sender.copies):
                    forced.set()
                    return
                time.sleep(0.0005)
        saboteur = threading.Thread(target=reject_first)
        saboteur.start()
        data = chunks(40)
        b.send(data[0])
        saboteur.join()
        assert forced.is_set(), "the saboteur found no message to reject"
        send_all(b, data[1:])
        assert b.flush(10), "a backup never got the rejected chunk"
        assert {slot for slot, _ in rejected} == {m.slot for m in b._members}, \
            "a receiver did not follow the forced reject"
        assert all(r.chunks == data for r in rings)
        assert b.counters()["resent"] >= 1
    finally:
        b.close()


def test_a_backup_added_later_gets_what_was_sent_after():
    b = backend()
    try:
        first = Ring(1)
        b.add(first)
        before, after = chunks(20), chunks(20, start=20)
        send_all(b, before)
        late = Ring(2)
        b.add(late)
        send_all(b, after)
        assert b.flush(10)
        assert first.chunks == before + after
        assert late.chunks == after
    finally:
        b.close()


def test_a_failed_backup_holds_no_message_in_the_mailbox():
    b = backend()
    try:
        live, failed = Ring(1), Ring(2)
        b.add(live)
        b.add(failed)
        failed.dead = True
        b.remove(failed, crashed=True)
        data = chunks(30)
        send_all(b, data)
        assert b.flush(10)
        assert live.chunks == data
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with b._sender.copies[0].step() as c:
                if not c.published():
                    break
            time.sleep(0.01)
        with b._sender.copies[0].step() as c:
            assert not c.published(), "messages stayed in the mailbox for a backup that failed"
    finally:
        b.close()
