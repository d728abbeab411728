"""What the replication core across hosts reads and sets of a member's
end of the protocol beyond sending and receiving (GroupMember in
llft/ordering/group.py): the primary's ordering information, and each
connection as a newcomer takes it over or a new view goes on with it
(viewchange.py does the work)."""
from __future__ import annotations

from llft.ordering.ids import ConnId
from llft.ordering.llmp.messaging import viewchange
from llft.ordering.llmp.messaging.retire import RETIRED_DROP


class HandoverMixin:
    # -- ordering information ------------------------------------------------
    def order(self, blob: bytes) -> int:
        return self.add_order_info(blob)

    def ordered_upto(self) -> int:
        return self.order_log.next_oseq - 1 if self.is_primary else self.sequencer.upto

    def order_stable(self, oseq: int) -> bool:
        return self.order_log.confirmed >= oseq

    def drop_counts(self) -> dict[str, int]:
        return self.drops.snapshot()

    def expected_drops(self) -> set[str]:
        return {RETIRED_DROP}

    # -- connections as a newcomer takes them over -----------------------------
    def has_connection(self, cid: ConnId) -> bool:
        return cid in self.conns

    def sent_count(self, cid: ConnId) -> int:
        return self.conns[cid].tx.msg_seq_count

    def retired(self) -> dict[ConnId, int]:
        return self.retired_sent

    def retire(self, cid: ConnId, sent: int) -> None:
        self.retire_now(cid, sent)

    def connection_state(self, cid: ConnId) -> tuple[int, int, int]:
        return viewchange.connection_state(self, cid)

    def adopt_connection(self, cid: ConnId, consumed: int, acked: int, logged_from: int) -> None:
        viewchange.adopt_connection(self, cid, consumed, acked, logged_from)

    def unconsumed(self, cid: ConnId) -> list[bytes]:
        return viewchange.unconsumed(self, cid)

    def number_from(self, cid: ConnId, count: int) -> None:
        viewchange.number_from(self, cid, count)

    def rebase(self, cid: ConnId, base: int) -> list[bytes]:
        return viewchange.rebase(self, cid, base)

    def forgotten(self) -> list:
        return self.tombstones.listed()

    def adopt_forgotten(self, listed: list) -> None:
        self.tombstones.adopt(listed)
