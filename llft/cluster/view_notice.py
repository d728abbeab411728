"""The new primary tells its backups where the old view ends (LLFT Fig. 9
line 35, "record an order for the primary view change"): the virtual
synchrony point (the last of the old primary's ordering entries that the
new view follows), the entries some backup still lacks up to it, and where
the new primary's own entries start.  Intra-group NewPrimaryView, repeated
byte for byte until every backup acknowledges it."""
from __future__ import annotations

import logging

from llft.wire import MsgType

log = logging.getLogger("llft.membership")

RETRY_S = 0.05
MAX_COUNT = 40


class ViewNotice:
    def __init__(self, ep, on_notice):
        self.ep = ep
        self.on_notice = on_notice      # backups: fn(body)
        self.pending: list | None = None   # primary: [data, sends, members yet to acknowledge, pvn]
        self.last_sent = float("-inf")
        self.followed = 0               # backups: the last view whose notice was applied

    def start(self, view, body: dict) -> None:
        if not view.backups():
            return   # nobody to tell
        data = self.ep.send_membership(MsgType.NEW_PRIMARY_VIEW, body)
        self.pending = [data, 1, set(view.backups()), view.pvn]
        self.last_sent = self.ep.clock.now()

    def tick(self) -> None:
        p, now = self.pending, self.ep.clock.now()
        if p is None or now - self.last_sent < RETRY_S:
            return
        self.last_sent = now
        if not p[2] or p[1] >= MAX_COUNT:
            if p[2]:
                log.warning("members %s did not acknowledge the new view %d", sorted(p[2]), p[3])
            self.pending = None
            return
        p[1] += 1
        self.ep.resend(p[0], MsgType.NEW_PRIMARY_VIEW)

    def on_message(self, msg) -> None:
        ep, body = self.ep, msg.body if isinstance(msg.body, dict) else {}
        if msg.TYPE == MsgType.NEW_PRIMARY_VIEW_ACK:
            if self.pending is not None and body.get("pvn") == self.pending[3]:
                self.pending[2].discard(msg.sender)
            return
        if msg.sender != ep.view.primary or body.get("pvn") != ep.view.pvn or ep.is_primary:
            return
        try:
            if self.followed != ep.view.pvn:
                ords = body["ord"]
                if not isinstance(ords, list) or not all(isinstance(b, bytes) for b in ords):
                    raise TypeError("ord")
                self.on_notice({"sync": int(body["sync"]), "base": int(body["base"]), "of": int(body["of"]),
                                "ord": ords, "members": [int(m) for m in body["members"]]})
                self.followed = ep.view.pvn
        except (KeyError, TypeError, ValueError):
            ep.drops.count("malformed")
            return
        ep.send_membership(MsgType.NEW_PRIMARY_VIEW_ACK, {"pvn": ep.view.pvn})
