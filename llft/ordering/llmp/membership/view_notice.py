"""The new primary tells its backups where the old view ends (LLFT Fig. 9
line 35, "record an order for the primary view change"): the virtual
synchrony point (the last of the old primary's ordering entries that the
new view follows), the entries some backup still lacks up to it, and where
the new primary's own entries start.  Intra-group NewPrimaryView, repeated
byte for byte until every backup acknowledges it.

The entries a lagging backup lacks can be hundreds of KiB (records of a
second's traffic); in one message, of a hundred fragments, a lossy link
would drop some fragment of every copy.  So the notice goes in parts of at
most `order_budget` bytes of entries each, acknowledged one by one, and a
backup follows the new view once it holds every part."""
from __future__ import annotations

import logging

from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.membership")

RETRY_S = 0.05
MAX_COUNT = 40


def split_entries(first: int, blobs: list[bytes], budget: int) -> list[tuple[int, list[bytes]]]:
    """Consecutive entries from oseq `first`, cut into runs of at most
    budget bytes (at least one entry each); one empty run if none."""
    runs, run, used, of = [], [], 0, first
    for i, blob in enumerate(blobs):
        if run and used + len(blob) > budget:
            runs.append((of, run))
            run, used, of = [], 0, first + i
        run.append(blob)
        used += len(blob)
    runs.append((of, run))
    return runs


class _Part:
    __slots__ = ("data", "sends", "waiting")

    def __init__(self, data: bytes, waiting: set):
        self.data, self.sends, self.waiting = data, 1, waiting


class ViewNotice:
    def __init__(self, ep, on_notice):
        self.ep = ep
        self.on_notice = on_notice      # backups: fn(body)
        self.parts: list[_Part] = []    # primary: the notice's parts, each until every backup acknowledged it
        self.pvn = 0                    # primary: the view the parts announce
        self.last_sent = float("-inf")
        self.followed = 0               # backups: the last view whose notice was applied
        self.receiving = 0              # backups: the view whose parts `received` holds
        self.received: dict[int, tuple[int, list]] = {}   # part -> (of, entries)

    def start(self, view, body: dict) -> None:
        if not view.backups():
            return   # nobody to tell
        runs = split_entries(body["of"], body["ord"], self.ep.config.order_budget)
        self.pvn, self.parts = view.pvn, []
        for k, (of, blobs) in enumerate(runs):
            data = self.ep.send_membership(MsgType.NEW_PRIMARY_VIEW, {**body, "of": of, "ord": blobs, "part": k,
                                                                      "parts": len(runs)})
            self.parts.append(_Part(data, set(view.backups())))
        self.last_sent = self.ep.clock.now()

    def forget(self, members) -> None:
        """Removed members: nobody waits for their acknowledgments."""
        for p in self.parts:
            p.waiting.difference_update(members)

    def tick(self) -> None:
        now = self.ep.clock.now()
        if now - self.last_sent < RETRY_S:
            return
        self.last_sent = now
        for p in self.parts:
            if not p.waiting:
                continue
            if p.sends >= MAX_COUNT:
                log.warning("members %s did not acknowledge part of the new view %d", sorted(p.waiting), self.pvn)
                p.waiting.clear()
                continue
            p.sends += 1
            self.ep.resend(p.data, MsgType.NEW_PRIMARY_VIEW)

    def on_message(self, msg) -> None:
        ep, body = self.ep, msg.body if isinstance(msg.body, dict) else {}
        if msg.TYPE == MsgType.NEW_PRIMARY_VIEW_ACK:
            part = body.get("part", 0)
            if body.get("pvn") == self.pvn and isinstance(part, int) and 0 <= part < len(self.parts):
                self.parts[part].waiting.discard(msg.sender)
            return
        if msg.sender != ep.view.primary or body.get("pvn") != ep.view.pvn or ep.is_primary:
            return
        try:
            part, parts = int(body.get("part", 0)), int(body.get("parts", 1))
            if not 0 <= part < parts:
                raise ValueError("part")
            if self.followed != ep.view.pvn:
                ords = body["ord"]
                if not isinstance(ords, list) or not all(isinstance(b, bytes) for b in ords):
                    raise TypeError("ord")
                if self.receiving != ep.view.pvn:
                    self.receiving, self.received = ep.view.pvn, {}
                self.received[part] = (int(body["of"]), ords)
                if len(self.received) == parts:
                    first = self.received[0][0]
                    blobs = [b for k in range(parts) for b in self.received[k][1]]
                    self.received = {}
                    self.on_notice({"sync": int(body["sync"]), "base": int(body["base"]), "of": first,
                                    "ord": blobs, "members": [int(m) for m in body["members"]]})
                    self.followed = ep.view.pvn
        except (KeyError, TypeError, ValueError):
            ep.drops.count("malformed")
            return
        ep.send_membership(MsgType.NEW_PRIMARY_VIEW_ACK, {"pvn": ep.view.pvn, "part": part})
