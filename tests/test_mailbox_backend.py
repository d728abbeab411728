"""The mailbox backend's contract with the record pump, on real segments
and threads: every chunk reaches every backup's ring once and in order,
whatever the mailbox decides (a rejected message is sent again), a backup
added later gets exactly what was sent after, and a failed backup's
messages do not stay in the mailbox."""
from __future__ import annotations

import threading
import time

from llft.ordering.mailbox.backend import MailboxOrdering
from llft.ordering.mailbox.segment import BOTTOM, MemoryCrashed


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


def test_a_rejected_message_is_sent_again():
    """Every copy's decision on the first message is forced to reject
    before the receivers decide: they follow it, and the chunk must come
    again."""
    b = backend()
    try:
        rings = [Ring(1), Ring(2)]
        for r in rings:
            b.add(r)
        forced = threading.Event()

        def reject_first():
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for c in b._sender.copies:
                    try:
                        with c.step():
                            for e in c.published():
                                if e.decision == BOTTOM:
                                    e.decision = 0
                                    c.put(e)
                                    forced.set()
                    except MemoryCrashed:
                        pass
                if forced.is_set():
                    return
                time.sleep(0.0005)
        saboteur = threading.Thread(target=reject_first)
        saboteur.start()
        data = chunks(40)
        b.send(data[0])
        saboteur.join()
        send_all(b, data[1:])
        assert b.flush(10), "a backup never got the rejected chunk"
        assert forced.is_set()
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
