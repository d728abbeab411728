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

import os

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
