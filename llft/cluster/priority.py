"""Scheduling priority of a member's controller.

The fault detectors' timeouts are a few Heartbeat intervals long, so a
member whose event loop is not scheduled for that long looks dead to the
others.  On a loaded host a process of ordinary priority waits tens of ms
for a CPU now and then (measured here: gaps of 50-200 ms between a primary's
Heartbeats at load 15 on 2 cores, none over 30 ms with this), so the
controller runs under SCHED_RR, as the heartbeat daemons of cluster stacks
do (corosync, keepalived); it sleeps in its event loop when there is
nothing to do.  Its threads inherit it: a thread of ordinary priority
preempted while it holds the GIL would stall the event loop (priority
inversion), and one that starts at ordinary priority waits for a CPU
before Thread.start returns (a new primary starts its record shipper on
the view change's path).  Its replica runs at ordinary priority
(llft/replica.py resets it between fork and exec)."""
from __future__ import annotations

import os

RT_PRIORITY = 1          # the lowest real-time priority: above every ordinary process, below the kernel's


def realtime() -> bool:
    """Puts the calling thread under SCHED_RR; False where not permitted."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(RT_PRIORITY))
    except (OSError, AttributeError):
        return False
    return True
