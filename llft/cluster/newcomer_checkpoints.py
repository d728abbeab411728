"""Newcomers brought up from a checkpoint instead of the history (LLFT
§IV-C; docs/checkpoints.md), as one member across hosts takes part: at the
primary, deciding that a newcomer needs one and getting it (of a backup,
asked through the membership, or of its own replica); at a backup, taking
one when the primary asks.  The cut itself is checkpoint_join.py's."""
from __future__ import annotations

import asyncio
import logging
import shutil

from llft.cluster.checkpoint_join import NewcomerCheckpoint, offered_state
from llft.cluster.state_transfer import FileState
from llft.ordering.group import CheckpointRefused, SourceRefused

log = logging.getLogger("llft.member")


class NewcomerCheckpoints:
    def __init__(self, member):
        self.m = member
        self.task: asyncio.Task | None = None   # a checkpoint being taken for a newcomer
        self.last: dict | None = None           # llft-status: the last one taken here, or restored

    def problem(self) -> str | None:
        """Why a newcomer cannot be brought up from a checkpoint of this
        member's replica."""
        m = self.m
        if not m.criu_check.done():
            return "CRIU is being checked"
        return m.criu_check.result()

    def admits(self, member: int, restores: bool) -> bool:
        """Admission: True if the newcomer gets a checkpoint (the history
        cannot bring it up to date), taken now, or once the one under way
        is done (it asks again meanwhile); or if it cannot restore one, and
        is refused."""
        m = self.m
        if m.history.complete:
            return False
        if not restores:
            m.group.admission.refuse(member, f"{m.history.why_incomplete()}, and the newcomer cannot "
                                             "restore a checkpoint instead (its CRIU does not work: see its log)")
            return True
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._admit(member, m.group.admission))
        return True

    async def _admit(self, member: int, admission):
        m = self.m
        try:
            # A backup's replica, so that the primary serves on unpaused
            source = m.group.checkpoint_source(member)
            if source is not None:
                admission.begin(member)   # (before the backup's cut: kept for the newcomer from here on)
                try:
                    offer = await m.group.ask_checkpoint(source, member)
                except SourceRefused as e:
                    log.warning("member %d asked to join: %s; this primary's replica is checkpointed instead",
                                member, e)
                else:
                    admission.offered_elsewhere(member, offer, f"a checkpoint of member {source}'s replica")
                    return
                if admission is not m.group.admission or not m.ep.is_primary:
                    return   # no longer primary: the newcomer asks the new one
            taker = NewcomerCheckpoint(m, member, on_cut=None if source is not None else
                                       lambda: admission.begin(member))
            try:
                offered = await self._offered(taker)
            except CheckpointRefused as e:
                log.warning("member %d asked to join: %s", member, e)
                admission.abandon(member, str(e))
                return
            except Exception as e:   # noqa: BLE001 - a newcomer in the view must not wait for good
                log.exception("member %d asked to join: its state could not be made", member)
                admission.abandon(member, f"the primary could not make its state ({e!r})")
                return
        finally:
            self.task = None
        if admission is not m.group.admission or not m.ep.is_primary:
            offered.discard()
            return   # no longer primary: the newcomer asks the new one
        admission.complete(member, offered, "a checkpoint")

    async def here(self, newcomer: int) -> FileState:
        """At a backup the primary asked (backup_checkpoint.py): a
        checkpoint of its replica for newcomer, ready to offer."""
        m = self.m
        problem = self.problem()
        if problem is not None:
            raise CheckpointRefused(f"CRIU does not work at member {m.me} ({problem})")
        if self.task is not None or m.restorer is not None or m.ep.is_primary:
            raise CheckpointRefused(f"member {m.me} is busy (restoring, or checkpointing already)")
        self.task = asyncio.current_task()
        try:
            return await self._offered(NewcomerCheckpoint(m, newcomer))
        finally:
            self.task = None

    async def _offered(self, taker: NewcomerCheckpoint) -> FileState:
        """taker's checkpoint as a newcomer's state (authenticated as it is
        sent: state_transfer.py)."""
        m = self.m
        try:
            cut = await taker.take()
            self.last = dict(taker.figures, newcomer=taker.newcomer, source=taker.source())
            m.write_state("running")   # (llft-status shows it at once)
            state = {"oseq": cut["oseq"], "history": cut.pop("held"), "conns": [], "checkpoint": cut,
                     "settling_ms": max(0, int(m.group.settling_left() * 1000))}
            return offered_state(state, taker.images)
        except BaseException:
            shutil.rmtree(taker.images, ignore_errors=True)
            raise

    async def finish(self, timeout: float) -> None:
        """Waits for the checkpoint under way (it uses the replica's ring until it ends)."""
        if self.task is not None:
            await asyncio.wait([self.task], timeout=timeout)
