"""The sending half of a connection: msgSeqCount and the sent list
(Fig. 6 lines 1-17, 44-46, 73-81)."""
from __future__ import annotations

from collections import OrderedDict


class SentEntry:
    """A message this member originated.  At the primary `data` is the
    encoded message (retransmitted byte for byte) and `ts` its timestamp.  A
    backup logs the payload without multicasting it and does not know the
    primary's timestamp, so it keeps `bound`: the timestamp of the first
    message from the remote primary that acknowledged this msn, which is
    greater than the primary's timestamp for it (Lamport)."""

    __slots__ = ("msn", "ts", "data", "last_tx", "tx_count", "bound")

    def __init__(self, msn: int, ts: int, data: bytes, now: float):
        self.msn, self.ts, self.data, self.last_tx = msn, ts, data, now
        self.tx_count = 1
        self.bound = 0


class SendSide:
    """Retransmission timing follows TCP (RFC 6298): a smoothed round-trip
    estimate from acknowledgments of messages sent once (Karn), and
    exponential backoff per message, so a loaded receiver is not buried
    under retransmissions it has no time to acknowledge."""

    def __init__(self, rto: float = 0.03, rto_min: float = 0.01, rto_max: float = 1.0) -> None:
        self.rto, self.rto_min, self.rto_max = rto, rto_min, rto_max
        self.srtt = 0.0
        self.rttvar = 0.0
        self.msg_seq_count = 0
        self.sent: OrderedDict[int, SentEntry] = OrderedDict()  # the sent list
        self.sent_bytes = 0    # of the entries in the sent list
        self.acked_count = 0   # entries the remote primary acknowledged, kept for its group watermark...
        self.acked_bytes = 0   # ...and their bytes (what is in flight is the rest)
        self.remote_ack = 0    # remote primary has received all msns <= this
        self.remote_back = 0   # remote group watermark for this connection
        self._bounded_upto = 0  # backups: entries <= this have a bound
        # A newcomer's: the messages below this number the remote group had
        # before it joined (its primary had freed them).  It generates them
        # again, numbered but not logged: nothing on the connection would
        # ever free them, and they would fill its window.
        self.log_from = 0

    def next_msn(self) -> int:
        self.msg_seq_count += 1
        return self.msg_seq_count

    def append(self, entry: SentEntry) -> None:
        self.sent[entry.msn] = entry
        self.sent_bytes += len(entry.data)
        if entry.msn <= self.remote_ack:   # (a backup logs what the remote primary has already)
            self.acked_count += 1
            self.acked_bytes += len(entry.data)

    def clear(self) -> None:
        self.sent.clear()
        self.sent_bytes = self.acked_count = self.acked_bytes = 0

    def in_flight(self) -> tuple[int, int]:
        """Entries the remote primary has not acknowledged: how many, their bytes."""
        return len(self.sent) - self.acked_count, self.sent_bytes - self.acked_bytes

    def on_ack(self, ack: int, ts: int, now: float) -> int:
        """Returns how many entries of the sent list it acknowledged."""
        newly_acked = 0
        if ack > self.remote_ack:
            # Karn, extended to a cumulative ack: no sample if anything it
            # covers was retransmitted (the ack then also measured a stall).
            newly = [self.sent.get(m) for m in range(self.remote_ack + 1, min(ack, self.msg_seq_count) + 1)]
            e = self.sent.get(ack)
            if e is not None and e.ts and all(x is None or x.tx_count == 1 for x in newly):
                self._rtt_sample(now - e.last_tx)
            self.remote_ack = ack
            for x in newly:
                if x is not None:
                    newly_acked += 1
                    self.acked_bytes += len(x.data)
            self.acked_count += newly_acked
        # Backups: every logged message up to `ack` was received by the
        # remote primary before it sent this message stamped `ts`.
        hi = min(self.remote_ack, self.msg_seq_count)
        for msn in range(self._bounded_upto + 1, hi + 1):
            e = self.sent.get(msn)
            if e is not None and e.ts == 0:
                e.bound = ts
        if hi > self._bounded_upto:
            self._bounded_upto = hi
        return newly_acked

    def _rtt_sample(self, r: float) -> None:
        if not self.srtt:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar += (abs(self.srtt - r) - self.rttvar) / 4
            self.srtt += (r - self.srtt) / 8
        self.rto = min(self.rto_max, max(self.rto_min, self.srtt + 4 * self.rttvar))

    def on_back(self, back: int) -> int:
        """Record the remote group watermark and free (lines 79-81); returns
        how many entries were freed."""
        if back > self.remote_back:
            self.remote_back = back
        freed = 0
        sent, wm = self.sent, self.remote_back
        while sent:
            e = next(iter(sent.values()))
            ts = e.ts or e.bound
            if not ts or ts > wm:
                break
            sent.popitem(last=False)
            self.sent_bytes -= len(e.data)
            if e.msn <= self.remote_ack:
                self.acked_count -= 1
                self.acked_bytes -= len(e.data)
            freed += 1
        return freed

    def due(self, now: float, limit: int) -> list[SentEntry]:
        """The first `limit` unacknowledged entries whose retransmission
        timer expired (line 45).  Only those: the remote primary's ack stops
        at its first gap, so later entries are probably there already; gaps
        it sees are reported precisely by Nacks.  Each entry's timer doubles
        with every try."""
        out = []
        for msn in range(self.remote_ack + 1, min(self.remote_ack + limit, self.msg_seq_count) + 1):
            e = self.sent.get(msn)
            if e is not None and now - e.last_tx >= min(self.rto_max, self.rto * (1 << min(e.tx_count - 1, 10))):
                out.append(e)
        return out

    def retransmitted(self, e: SentEntry, now: float) -> None:
        e.last_tx = now
        e.tx_count += 1

    def quiet(self) -> float:
        """How long a Nack may take to reflect a retransmission: one round
        trip, within [rto_min, rto]."""
        return min(max(self.srtt, self.rto_min), self.rto)

    def recently_sent(self, e: SentEntry, now: float) -> bool:
        """A Nack that crossed our last retransmission of e: do not repeat it."""
        return now - e.last_tx < self.quiet()
