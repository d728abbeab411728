"""What a member keeps of the group's past, in memory, bounded.

State transfer is by log (docs/cluster.md, "Membership"): a newcomer's
program replays every ordering entry since the group began and every
request each connection handed on.  That history grows with every request,
at every member.  Past `limit` bytes a member stops keeping it: the
requests go, and the ordering entries are kept only as far back as a view
change needs them (a new primary hands a lagging backup the entries it
lacks, member._held_after).  From then on a newcomer is brought up from a
checkpoint of the primary instead (checkpoint_join.py), or, where none can
be taken, refused with the reason."""
from __future__ import annotations

import logging
import time
from collections import OrderedDict

log = logging.getLogger("llft.history")

DEFAULT_LIMIT = 32 << 20   # at every member, in memory
REQUEST_OVERHEAD = 64      # a kept request's tuple and list slot, roughly
# Past the limit, what is dropped is freed this many items per entry added:
# freeing it all at once (300,000 objects) held the event loop for 40 ms and
# more, past a primary's fault timeout.
FREE_BATCH = 2048


class GroupHistory:
    def __init__(self, limit: int = DEFAULT_LIMIT):
        self.limit = limit
        # oseq -> ordering blob, in order.  An OrderedDict: popping a plain
        # dict's first item again and again is quadratic (each next(iter())
        # skips every slot deleted before it), which froze a member past the
        # limit for half a minute with 8 MiB of entries kept.
        self.entries: OrderedDict[int, bytes] = OrderedDict()
        self.inputs: dict = {}                # ConnId -> [request, ...], every one handed on
        self.entry_bytes = 0
        self.input_bytes = 0
        self.complete_since: float | None = None   # None while complete; when it stopped being so
        self._dropped: list[list] = []        # requests past the limit, still to be freed

    @property
    def complete(self) -> bool:
        return self.complete_since is None

    def start_from(self, history: list) -> None:
        """A newcomer: the history it joined with."""
        for oseq, blob in history:
            self.add_entry(oseq, blob)

    def add_entry(self, oseq: int, blob: bytes) -> None:
        self.entries[oseq] = blob
        self.entry_bytes += len(blob)
        if self.complete:
            self._check()
        else:
            self._free_some()

    def add_input(self, cid, req: tuple) -> None:
        if not self.complete:
            return
        self.inputs.setdefault(cid, []).append(req)
        self.input_bytes += REQUEST_OVERHEAD + sum(len(x) for x in req if isinstance(x, (bytes, str)))
        self._check()

    def _check(self) -> None:
        if self.entry_bytes + self.input_bytes <= self.limit:
            return
        self.complete_since = time.time()
        log.warning("the group's history passed %d MiB: this member keeps no more of it (the clients' requests "
                    "are dropped, the ordering information trimmed to the last %d MiB); a new member can no "
                    "longer be brought up to date, so none can join (--history-limit)", self.limit >> 20,
                    self.limit >> 22)
        self._dropped = list(self.inputs.values())
        self.inputs = {}
        self.input_bytes = 0
        self._free_some()

    def _free_some(self) -> None:
        """Frees up to FREE_BATCH of the dropped requests and of the oldest
        entries beyond the quarter of the limit kept."""
        left, dropped = FREE_BATCH, self._dropped
        while dropped and left > 0:
            reqs = dropped[-1]
            n = min(left, len(reqs))
            del reqs[len(reqs) - n:]
            left -= n
            if not reqs:
                dropped.pop()
        entries, keep = self.entries, self.limit // 4
        while left > 0 and self.entry_bytes > keep and len(entries) > 1:
            self.entry_bytes -= len(entries.popitem(last=False)[1])
            left -= 1

    def begin_after_checkpoint(self) -> None:
        """A newcomer restored from a checkpoint: it has no history from
        the start to give another (it gives a checkpoint of its own)."""
        self.complete_since = time.time()

    def why_incomplete(self) -> str | None:
        if self.complete:
            return None
        return (f"its history passed the limit of {self.limit >> 20} MiB at "
                f"{time.strftime('%H:%M:%S', time.localtime(self.complete_since))}, so a new member cannot be "
                f"brought up to date by replaying it")

    def summary(self) -> dict:
        return {"complete": self.complete, "bytes": self.entry_bytes + self.input_bytes, "limit": self.limit,
                "entries": len(self.entries)}
