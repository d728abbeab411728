"""Joining a group across hosts (LLFT §IV, Fig. 7: ProposeBackup,
AcceptBackup and its acknowledgment).

A process started with `llft-run --join` first listens: if a member of its
group is already there (its Heartbeats arrive), it proposes itself as a
backup until the primary accepts it; if nobody is there after
`found_after` seconds, it founds the group as its primary.  The primary
gives each new member the next precedence (never reused), adds it to the
view and multicasts AcceptBackup with the new membership, so every member
learns of it.  The state the newcomer needs (every ordering entry since
its program started, which it replays from the beginning, and each client
connection's input so far) goes to the newcomer alone, over TCP
(state_transfer.py): AcceptBackup only says where to fetch it.

Membership messages are unreliable datagrams: AcceptBackup is repeated
until every backup acknowledges it, for as long as the newcomer may take
to fetch its state (`admission_deadline`)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from llft.ordering.llmp import wire
from llft.cluster.state_transfer import FileState, StateOffers, StateTransferError, discard, fetch_state
from llft.ordering.llmp.messaging.fragments import Codec
from llft.ordering.group import JoinRefused, Joined, NewcomerAdmission
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.lineage import parse_views
from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.membership")

RETRY_S = 0.05
ACK_WAIT_S = 2.0            # for the acknowledgments, beyond the newcomer's fetch of its state
STATE_BYTES_PER_S = 1 << 20  # a slow link's pace, for that fetch
STATE_TIMEOUT_S = 60.0      # the newcomer's own bound on one fetch


def admission_deadline(now: float, state_size: int) -> float:
    """The newcomer acknowledges once its state is here and its program
    started; a member that has not by then is removed."""
    return now + ACK_WAIT_S + state_size / STATE_BYTES_PER_S


def view_body(view: View) -> dict:
    return {"primary": view.primary, "pvn": view.pvn, "prec": [[m, p] for m, p in view.precedences.items()]}


def parse_view(group: int, body) -> View:
    try:
        prec = {int(m): int(p) for m, p in body["prec"]}
        view = View(group, int(body["primary"]), prec, int(body["pvn"]))
    except (KeyError, TypeError, ValueError) as e:
        raise wire.DropError("malformed", f"membership view: {e}") from None
    if view.primary not in prec:
        raise wire.DropError("malformed", "membership view without its primary")
    return view


class Joiner:
    """Before it is a member: watches the group's traffic and asks to join."""

    def __init__(self, ep, found_after: float, give_up_after: float, restores: bool = False,
                 spool: Path | None = None):
        self.ep = ep
        self.restores = restores   # it can be brought up from a checkpoint (CRIU works here)
        self.spool = spool         # where a checkpoint's image is written as it arrives
        # A codec of its own: the group's traffic it decodes and ignores (the
        # gateways' Requests) must not count as received by the endpoint's,
        # which would then drop those messages as late duplicates when they
        # are retransmitted to the member it becomes (a Request sent while we
        # joined, not part of the state, was never delivered to our replica).
        self.codec = Codec(ep.codec.keyring, ep.codec.accept_groups, ep.config, drops=ep.drops)
        self.found_after = found_after
        self.give_up_after = give_up_after
        self.group_seen = False
        self.heard: asyncio.Future | None = None   # done at the group's first Heartbeat: propose then
        self.answer: asyncio.Future | None = None
        self.seen_admissions: list = []
        self.state_pending = False

    def datagram(self, data: bytes, addr) -> None:
        ep = self.ep
        r = self.codec.decode(data, ep.clock.now())
        if r is None:
            return
        msg = r[0]
        if msg.src_group != ep.group or msg.sender == ep.me:
            return
        if msg.TYPE == MsgType.HEARTBEAT and msg.precedence > 0:
            self.group_seen = True
            if self.heard is not None and not self.heard.done():
                self.heard.set_result(None)
        elif msg.TYPE == MsgType.ACCEPT_BACKUP and isinstance(msg.body, dict):
            if msg.body.get("member") == ep.me:
                if self.answer and not self.answer.done():
                    self.answer.set_result((msg.body, addr))
            else:
                # Another newcomer's admission: ours to follow once we are in.
                self.seen_admissions.append(msg)

    async def join(self) -> Joined | None:
        """The membership we joined, or None if we found the group."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.heard = loop.create_future()
        while True:
            self.answer = loop.create_future()
            while not self.answer.done():
                waited = loop.time() - start
                if not self.group_seen and waited >= self.found_after:
                    return None
                if waited >= self.give_up_after:
                    raise JoinRefused(f"the group's primary did not accept us within {self.give_up_after:g} s")
                if self.group_seen:
                    self.ep.send_membership(MsgType.PROPOSE_BACKUP, {"member": self.ep.me,
                                                                     "restores": self.restores})
                # Not yet heard: the first Heartbeat wakes us, and the proposal
                # goes at once (not at the next retry, up to RETRY_S later).
                await asyncio.wait([self.answer] if self.group_seen else [self.answer, self.heard], timeout=RETRY_S)
            body, addr = self.answer.result()
            if body.get("refused"):
                raise JoinRefused(str(body["refused"]))
            if isinstance(body.get("state"), dict) and body["state"].get("pending"):
                # In the view already; the state (a checkpoint) is being made.
                if not self.state_pending:
                    log.warning("admitted as a backup; a checkpoint is being taken for us")
                    self.state_pending = True
                start = loop.time()
                continue
            described = body.get("state")
            # (on the primary's host, or another member's: a checkpoint of a backup)
            host = described.get("host") if isinstance(described, dict) else None
            try:
                state = await fetch_state(host if isinstance(host, str) else addr[0], described, STATE_TIMEOUT_S,
                                          self.spool, key=self.ep.codec.keyring.key(self.ep.group))
            except StateTransferError as e:
                # The primary repeats AcceptBackup while the admission is
                # pending (and admits us afresh once it gave up): try again.
                log.warning("admitted, but the state did not arrive: %s; trying again", e)
                continue
            return self._joined(body, state)

    def _joined(self, body: dict, state: bytes) -> Joined:
        try:
            view = parse_view(self.ep.group, body.get("view"))
            state = msgpack.unpackb(state, raw=False, strict_map_key=False, use_list=True)
            history, conns = state["history"], state.get("conns", [])
            if not isinstance(history, list) or not all(
                    isinstance(h, list) and len(h) == 2 and isinstance(h[0], int) and isinstance(h[1], bytes)
                    for h in history):
                raise TypeError("history")
            if not isinstance(conns, list) or not all(
                    isinstance(c, list) and len(c) == 7 and all(isinstance(x, int) for x in c[:6])
                    and isinstance(c[6], list) for c in conns):
                raise TypeError("conns")
            settling_s = max(int(state.get("settling_ms", 0)), 0) / 1000
            checkpoint = state.get("checkpoint")
            if checkpoint is not None and (not isinstance(checkpoint, dict)
                                           or checkpoint.get("source") not in ("primary", "backup")):
                raise TypeError("checkpoint (of another llft version?)")
            return Joined(view, int(body["index"]), int(state["oseq"]), history, conns, settling_s,
                          parse_views(body.get("lineage")), checkpoint)
        except (KeyError, TypeError, ValueError, wire.DropError, msgpack.UnpackException) as e:
            raise JoinRefused(f"the primary's AcceptBackup or state is malformed: {e}") from None


@dataclass
class _Pending:
    """An admission the primary repeats until every backup acknowledged it."""
    data: bytes                       # the encoded AcceptBackup
    offer: dict                       # where the newcomer fetches its state
    waiting: set = field(default_factory=set)   # backups yet to acknowledge
    due: float = 0.0                  # next repeat
    deadline: float = 0.0             # admission_deadline
    body: dict = field(default_factory=dict)   # the AcceptBackup's


class Admission(NewcomerAdmission):
    """At the primary: accepts new members (ProposeBackup -> AcceptBackup)."""

    def __init__(self, ep, history, serving, on_change, remove, interface: str, checkpoint=None):
        self.ep = ep
        self.state = history            # fn() -> {"oseq", "history", "conns", ...}: what a newcomer needs
        self.serving = serving          # fn() -> str | None: why nobody may join now
        # fn(member, it can restore one) -> bool: True if the newcomer's state is
        # to be a checkpoint, taken meanwhile (checkpoint_join.py), which calls
        # begin() then complete(), or if it was refused
        self.checkpoint = checkpoint
        self.on_change = on_change      # fn(): the view changed
        self.remove = remove            # fn(member, why): RemoveBackup
        self.next_precedence = max(ep.view.precedences.values(), default=0) + 1
        self.pending: dict[int, _Pending] = {}
        self.offers = StateOffers(interface, ep.drops, ep.codec.keyring.key(ep.group))

    def on_message(self, msg) -> None:
        body = msg.body if isinstance(msg.body, dict) else {}
        member = body.get("member")
        if not isinstance(member, int) or member != msg.sender:
            self.ep.drops.count("malformed")
            return
        if msg.TYPE == MsgType.PROPOSE_BACKUP:
            self._propose(member, body.get("restores") is True)
        elif msg.TYPE == MsgType.ACCEPT_BACKUP_ACK:
            entry = self.pending.get(body.get("for"))
            if entry is not None and member in entry.waiting:
                entry.waiting.discard(member)
                log.info("member %d acknowledged the admission of %d", member, body.get("for"))
                if not entry.waiting:
                    self._done(body["for"])

    def _propose(self, member: int, restores: bool = False) -> None:
        if member in self.pending:
            return  # repeated proposal: the AcceptBackup is being repeated already
        if member in self.ep.view:
            return  # accepted and acknowledged before; a late duplicate
        why = self.serving()
        if why:
            self.refuse(member, why)
            return
        if self.checkpoint is not None and self.checkpoint(member, restores):
            return
        self.begin(member, announce=False)
        state = self.state()
        self.complete(member, msgpack.packb(state, use_bin_type=True),
                      what=f"{len(state['conns'])} client connections")

    def refuse(self, member: int, why: str) -> None:
        log.warning("member %d asked to join: refused, %s", member, why)
        self.ep.send_membership(MsgType.ACCEPT_BACKUP, {"member": member, "refused": why})

    def begin(self, member: int, announce: bool = True) -> None:
        """The newcomer joins the view: from now on the ordering information
        and the clients' messages are kept for it.  With announce, its
        AcceptBackup says at once that its state is on the way (every
        backup acknowledges it); otherwise complete() follows at once."""
        view = self.ep.view
        precedence = self.next_precedence
        self.next_precedence += 1
        view.precedences[member] = precedence
        body = {"member": member, "index": precedence - 1, "view": view_body(view), "state": {"pending": True},
                "lineage": self.ep.lineage.listed()}
        self.on_change()
        data = self.ep.send_membership(MsgType.ACCEPT_BACKUP, body) if announce else b""
        now = self.ep.clock.now()
        self.pending[member] = _Pending(data, {}, set(view.backups()), due=now + RETRY_S, deadline=float("inf"),
                                        body=body)

    def complete(self, member: int, state: bytes | FileState, what: str) -> None:
        """The newcomer's state (encoded; what it holds, for the log), as of
        begin(), offered to it alone."""
        entry = self.pending.get(member)
        if entry is None:
            discard(state)
            return   # removed meanwhile
        try:
            self.offers.open()
        except OSError as e:
            discard(state)
            self.abandon(member, f"the primary has no port to hand over the state on ({e})")
            return
        self._offer(member, entry, self.offers.offer(state), what)

    def offered_elsewhere(self, member: int, offer: dict, what: str) -> None:
        """complete(), for a state another member offers on its own port
        (offer: as StateOffers.offer describes it, with that member's host)."""
        entry = self.pending.get(member)
        if entry is not None:
            self._offer(member, entry, offer, what)

    def _offer(self, member: int, entry: _Pending, offer: dict, what: str) -> None:
        entry.offer = offer
        entry.body["state"] = entry.offer
        log.warning("member %d joins as a backup: precedence %d, replica %d, state: %d KiB (%s), offered on %s port "
                    "%d", member, entry.body["index"] + 1, entry.body["index"], entry.offer["size"] // 1024, what,
                    offer.get("host", "this member's"), entry.offer["port"])
        entry.data = self.ep.send_membership(MsgType.ACCEPT_BACKUP, entry.body)
        now = self.ep.clock.now()
        entry.due, entry.deadline = now + RETRY_S, admission_deadline(now, entry.offer["size"])

    def abandon(self, member: int, why: str) -> None:
        """begin() was said, but the state cannot be made: out again."""
        if self.pending.pop(member, None) is not None:
            self.remove(member, why)
        self.refuse(member, why)

    def _done(self, member: int) -> None:
        self.offers.withdraw(self.pending.pop(member).offer)
        if not self.pending:
            self.offers.close()   # no port open while nobody is being admitted

    def unacknowledged_by_newcomers(self) -> list[int]:
        """Members admitted whose AcceptBackup has not reached them yet."""
        return [m for m, entry in self.pending.items() if m in entry.waiting]

    def forget(self, members: list[int]) -> None:
        """Members removed: nobody waits for their acknowledgments."""
        for entry in self.pending.values():
            entry.waiting.difference_update(members)

    def tick(self) -> None:
        now = self.ep.clock.now()
        for member, entry in list(self.pending.items()):
            if member in self.ep.backup_reports:
                # Its Heartbeats show it joined: its acknowledgment was lost.
                # Removing it anyway left a member the primary no longer
                # counted: the group watermark freed the client messages it
                # lacked and it starved.
                entry.waiting.discard(member)
            if not entry.waiting:
                self._done(member)
                continue
            if now < entry.due:
                continue
            if now >= entry.deadline:
                self._done(member)
                if member in entry.waiting:
                    self.remove(member, "never acknowledged its admission")
                else:
                    log.warning("members %s did not acknowledge the admission of %d", sorted(entry.waiting), member)
                continue
            entry.due = now + RETRY_S
            self.ep.resend(entry.data, MsgType.ACCEPT_BACKUP)

    def close(self) -> None:
        self.offers.close()


def follow(ep, msg, on_change) -> None:
    """At a backup: AcceptBackup from the primary (every backup acknowledges
    it, so that all hold the same membership and ranks)."""
    if msg.sender != ep.view.primary or msg.TYPE != MsgType.ACCEPT_BACKUP or not isinstance(msg.body, dict):
        return
    member = msg.body.get("member")
    if msg.body.get("refused") or not isinstance(member, int):
        return
    ep.send_membership(MsgType.ACCEPT_BACKUP_ACK, {"member": ep.me, "for": member})
    if member == ep.me:
        return   # our own admission, repeated: our acknowledgment was lost
    try:
        view = parse_view(ep.group, msg.body.get("view"))
    except wire.DropError as e:
        ep.drops.count(e.reason)
        return
    # Only the newcomer is taken from it: a repeated AcceptBackup carries the
    # membership as it was then, possibly without members admitted since.
    if view.pvn == ep.view.pvn and view.primary == ep.view.primary and member not in ep.view \
            and member in view.precedences:
        ep.view.precedences[member] = view.precedences[member]
        on_change()
