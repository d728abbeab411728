"""Scheduling priority of a member's controller.

The fault detectors' timeouts are a few Heartbeat intervals long, so a
member whose event loop is not scheduled for that long looks dead to the
others.  On a loaded host a process of ordinary priority waits tens of ms
for a CPU now and then (measured here: gaps of 50-200 ms between a primary's
Heartbeats at load 15 on 2 cores), so the controller runs under SCHED_RR,
as the heartbeat daemons of cluster stacks do (corosync, keepalived); it
sleeps when there is nothing to do.  Its event loop has the higher of two
real-time priorities; its threads (record shipper and feeder, which mostly
wait on the ring) the lower one: a thread of ordinary priority preempted
while it holds the GIL would stall the event loop (priority inversion),
and one of the same priority could keep it from a CPU for a whole SCHED_RR
quantum (100 ms).  Its replica runs at ordinary priority (llft/replica.py
resets it between fork and exec)."""
from __future__ import annotations

import asyncio
import os
import time

EVENT_LOOP = 2
THREADS = 1             # the lowest real-time priority


def realtime(priority: int) -> bool:
    """Puts the calling thread under SCHED_RR; False where not permitted."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
    except (OSError, AttributeError):
        return False
    return True


def below_event_loop() -> None:
    """Called by a thread of the controller: one step below its event loop,
    if that runs at real-time priority (the thread inherited it)."""
    if os.sched_getscheduler(0) == os.SCHED_RR:
        realtime(THREADS)


# A backup's controller at real-time priority naps this long after a turn of
# its event loop that took a client's request in.  It is off the clients' path (its
# replica's output is only logged), but woken at once by every datagram it
# took both cores from the primary's replica and the gateway, once per
# message: napping, it finds several messages, ordering entries and
# acknowledgments together, as one of ordinary priority does, and still
# answers within a millisecond (its Heartbeats every 5 ms, its verdicts at
# 30).  Measured across hosts with 16 clients: about 1.6 times the requests
# a second (docs/cluster.md, "Not there yet").
BACKUP_NAP_S = 0.001


class BackupNaps:
    """Calls nap() on the event loop once after each turn that took a
    client's request in, while `napping()` says this member should and no
    membership change is under way (an election or a join is a chain of
    round trips between members: there a nap at each hop added up to 3 ms
    to a view change of 3 replicas)."""

    HOLD_OFF_S = 1.0

    def __init__(self, napping):
        self.napping = napping
        self._due = False
        self._quiet_from = 0.0
        self.taken = 0        # naps so far

    def hold_off(self) -> None:
        """A membership message came: no naps for a while."""
        self._quiet_from = time.monotonic() + self.HOLD_OFF_S

    def took_request(self) -> None:
        if not self._due and self.napping() and time.monotonic() >= self._quiet_from:
            self._due = True
            asyncio.get_running_loop().call_soon(self._nap)

    def _nap(self) -> None:
        time.sleep(BACKUP_NAP_S)   # (lets go of the GIL: the record feeder goes on meanwhile)
        self.taken += 1
        self._due = False
