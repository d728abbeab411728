"""A newcomer's checkpoint taken of a backup's replica, so that the
serving primary is not paused for it (LLFT §IV-C adds a backup from a
checkpoint taken at an exact point of the ordering stream; any replica's
is such a point; docs/checkpoints.md).

    primary                          backup X                    newcomer N
    <------------------------------------------------- ProposeBackup
    begin(): N in the view ---- AcceptBackup {state pending} ------->
    CheckpointFor {source X, for N} -->
                                     holds the ordering, drains the
                                     input, CRIU dumps its replica; the
                                     cut (checkpoint_join.py), offered
                                     on a port of its own
                     <-- CheckpointOffered {for N, offer}
    ------------------ AcceptBackup {state: the offer, X's host} ---->
                                     <------------ fetch (token) -----

Why X's cut is enough: begin() puts N in the primary's view before X
takes its cut, and from then on the primary keeps every ordering entry and
every client message for N (its watermarks wait for N's reports); what it
freed before, every backup had reported released, X included, so it is in
X's replica or in the cut (the messages released but not taken, the
entries ordered but not applied).

Membership messages are datagrams: the primary repeats CheckpointFor until
X answers (at most ANSWER_WITHIN_S), and X answers a repeat with its answer
again.  X refuses with the reason (its CRIU does not work, its replica
lags, the program has UDP ports, a checkpoint for another newcomer is under
way); the primary then checkpoints its own replica.  X keeps the image
offered until N acknowledges its admission, or until the admission's
deadline passes."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from llft.ordering.group import CheckpointRefused, SourceRefused
from llft.ordering.llmp.membership.membership import admission_deadline
from llft.cluster.state_transfer import FileState, StateOffers, discard
from llft.ordering.llmp.wire import MsgType

log = logging.getLogger("llft.checkpoint")

REQUEST_EVERY_S = 0.2     # the primary's CheckpointFor, repeated until answered
ANSWER_WITHIN_S = 30.0    # a dump of gigabytes and its hash; past it the primary checkpoints itself
REFUSAL_KEPT_S = 2.0      # a refusal is repeated this long (a request on its way asks again)
# A backup taking a checkpoint heartbeats on (CRIU and the hash run aside):
# one this long silent is gone, or reset (it may be the very newcomer).
SOURCE_SILENT_S = 1.0


def silent_for(ep, member: int) -> float:
    """Seconds since member was last heard (infinite if never)."""
    heard = ep.last_heard.get(member)
    return float("inf") if heard is None else ep.clock.now() - heard


@dataclass
class _Offered:
    """At the backup: one newcomer's checkpoint, being taken or offered."""
    task: asyncio.Task | None = None
    answer: bytes | None = None     # the encoded CheckpointOffered, repeated on request
    offer: dict | None = None
    deadline: float = float("inf")
    in_view: bool = False           # the newcomer was seen in this member's view (it may leave it again)


class BackupCheckpoints:
    """Both sides: the primary asks (ask), a backup takes and offers
    (take: async fn(newcomer) -> FileState, raising with the reason it
    cannot)."""

    def __init__(self, ep, interface: str, take: Callable[[int], Awaitable[FileState]]):
        self.ep = ep
        self.take = take
        self.offers = StateOffers(interface, ep.drops, ep.codec.keyring.key(ep.group))
        self.asked: dict[int, tuple[int, asyncio.Future]] = {}   # primary: newcomer -> (backup, its answer)
        self.offered: dict[int, _Offered] = {}                    # backup: newcomer -> its checkpoint

    # -- the primary's side ------------------------------------------------
    async def ask(self, source: int, newcomer: int) -> dict:
        """Backup source's offer of a checkpoint for newcomer (with its
        host, as AcceptBackup describes a state); SourceRefused if none."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self.asked[newcomer] = (source, answer)
        deadline = loop.time() + ANSWER_WITHIN_S
        try:
            while not answer.done():
                ep = self.ep
                if not ep.is_primary or source not in ep.view or newcomer not in ep.view:
                    raise SourceRefused(f"the view changed (member {source} or {newcomer} left it, or this member "
                                        f"is no longer primary)")
                if loop.time() > deadline:
                    raise SourceRefused(f"member {source} did not offer a checkpoint within {ANSWER_WITHIN_S:g} s")
                if silent_for(ep, source) > SOURCE_SILENT_S:
                    raise SourceRefused(f"member {source} has been silent for {SOURCE_SILENT_S:g} s")
                ep.send_membership(MsgType.CHECKPOINT_FOR, {"source": source, "for": newcomer})
                await asyncio.wait([answer], timeout=REQUEST_EVERY_S)
            return answer.result()
        finally:
            self.asked.pop(newcomer, None)

    def _answered(self, msg, addr) -> None:
        body = msg.body
        asked = self.asked.get(body.get("for"))
        if asked is None or asked[0] != msg.sender or asked[1].done():
            return   # a repeat, or an answer to a request given up
        source, answer = asked
        if isinstance(body.get("refused"), str):
            answer.set_exception(SourceRefused(f"member {source} gives none: {body['refused']}"))
            return
        offer = body.get("offer")
        if not isinstance(offer, dict) or not isinstance(addr, tuple):
            self.ep.drops.count("malformed")
            return
        answer.set_result(dict(offer, host=addr[0]))

    # -- a backup's side -----------------------------------------------------
    def _asked(self, msg) -> None:
        ep, body = self.ep, msg.body
        newcomer = body.get("for")
        if msg.sender != ep.view.primary or body.get("source") != ep.me or not isinstance(newcomer, int):
            return
        entry = self.offered.get(newcomer)
        if entry is not None:
            if entry.answer is not None:
                ep.resend(entry.answer, MsgType.CHECKPOINT_OFFERED)
            return   # (still being taken)
        busy = next((m for m, e in self.offered.items() if e.task is not None), None)
        if busy is not None:
            self._answer(newcomer, _Offered(), refused=f"a checkpoint for member {busy} is under way")
            return
        entry = self.offered[newcomer] = _Offered()
        entry.task = asyncio.get_running_loop().create_task(self._checkpoint(newcomer, entry))

    async def _checkpoint(self, newcomer: int, entry: _Offered) -> None:
        try:
            state = await self.take(newcomer)
        except asyncio.CancelledError:
            raise
        except Exception as e:   # noqa: BLE001 - the primary must hear why, and checkpoints itself
            if isinstance(e, CheckpointRefused):
                log.warning("the primary asked for a checkpoint of this replica for member %d: %s", newcomer, e)
            else:
                log.exception("a checkpoint of this replica for member %d failed", newcomer)
            self._refuse(newcomer, entry, str(e) or repr(e))
            return
        finally:
            entry.task = None
        if self.offered.get(newcomer) is not entry:
            discard(state)   # closed meanwhile
            return
        try:
            self.offers.open()
        except OSError as e:
            discard(state)
            self._refuse(newcomer, entry, f"no port to offer it on ({e})")
            return
        entry.offer = self.offers.offer(state)
        entry.deadline = admission_deadline(self.ep.clock.now(), entry.offer["size"])
        log.warning("a checkpoint of this replica for member %d: %d KiB, offered on port %d", newcomer,
                    entry.offer["size"] // 1024, entry.offer["port"])
        self._answer(newcomer, entry, offer=entry.offer)

    def _refuse(self, newcomer: int, entry: _Offered, why: str) -> None:
        entry.deadline = self.ep.clock.now() + REFUSAL_KEPT_S
        self._answer(newcomer, entry, refused=why)

    def _answer(self, newcomer: int, entry: _Offered, **said) -> None:
        entry.answer = self.ep.send_membership(MsgType.CHECKPOINT_OFFERED,
                                               dict(said, member=self.ep.me, **{"for": newcomer}))

    def accepted(self, msg) -> None:
        """An AcceptBackup acknowledgment: the newcomer's own says it runs."""
        body = msg.body if isinstance(msg.body, dict) else {}
        if msg.sender == body.get("member") == body.get("for"):
            self._withdraw(msg.sender)

    def _withdraw(self, newcomer: int) -> None:
        entry = self.offered.get(newcomer)
        if entry is None or entry.task is not None:
            return
        del self.offered[newcomer]
        if entry.offer is not None:
            self.offers.withdraw(entry.offer)
        if not self.offered:
            self.offers.close()   # no port open while nothing is offered

    # -- both ------------------------------------------------------------------
    def on_message(self, msg, addr) -> None:
        if not isinstance(msg.body, dict):
            self.ep.drops.count("malformed")
        elif msg.TYPE == MsgType.CHECKPOINT_FOR:
            self._asked(msg)
        elif msg.TYPE == MsgType.CHECKPOINT_OFFERED and self.ep.is_primary:
            self._answered(msg, addr)

    def tick(self) -> None:
        """An offer goes once its admission cannot use it any more: past
        its deadline, or its newcomer removed from the view."""
        now, view = self.ep.clock.now(), self.ep.view
        for newcomer, entry in list(self.offered.items()):
            entry.in_view |= newcomer in view
            if entry.task is None and (now >= entry.deadline or (entry.in_view and newcomer not in view)):
                self._withdraw(newcomer)

    def close(self) -> None:
        for entry in self.offered.values():
            if entry.task is not None:
                entry.task.cancel()
        self.offered.clear()
        self.offers.close()
