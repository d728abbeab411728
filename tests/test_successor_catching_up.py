"""A successor chosen while it still replays the group's history: a
replacement (--respawn) that the failover of its primary makes the new
primary before it has caught up.  Until it has replayed its predecessor's
records to their end its processes are backups: the connections it
accepted in the past go to its inboxes, however llft-run names it; and if
it fails before it has taken over (it diverges, most likely) another
backup takes over in its place.  Seen from outside under load: memcached's
group stopped serving when its third failover chose a replacement 10 ms
old (test_failover's condition-wait test, 1 run in 25)."""
from __future__ import annotations

import signal
import time

from serving import ServingGroup, line_client
from test_group_lifecycle import wait_for as wait_until

from llft.nemesis.faults import Group

LINES = 3000


def started(members: Group, index: int):
    """Replica index, the moment the state file names it (it has still to
    start and listen before it is handed its past connections)."""
    end = time.monotonic() + 30
    while (replica := next((r for r in members.replicas() if r.index == index), None)) is None:
        assert time.monotonic() < end, f"replica {index} never started"
        time.sleep(0.0005)
    return replica


def choose_a_starting_replacement(group: ServingGroup) -> int:
    """Kills the primary; once its replacement has started, holds it
    (SIGSTOP, under a fault timeout long enough that it is not fenced),
    kills the new primary, so that the held replacement is chosen to take
    over before it has caught up, and lets it go.  Returns its index."""
    members = Group(group.run_dir)
    first = members.primary()
    members.signal(first, signal.SIGKILL)
    second = members.wait_new_primary(first.pid)
    replacement = started(members, 2)
    members.signal(replacement, signal.SIGSTOP)
    members.signal(second, signal.SIGKILL)
    wait_until(lambda: any(r.index == 2 and r.role == "primary" for r in members.replicas()),
               "the held replacement chosen to take over")
    time.sleep(0.05)   # the record pump hands it the rest of the history meanwhile
    members.signal(replacement, signal.SIGCONT)
    return replacement.index


def test_replacements_chosen_as_they_start_are_handed_their_past_connections(examples, tmp_path):
    """late_divergence, three replicas, a long history: three primaries
    killed one after the other, each as soon as the last has taken over, so
    that the third failover chooses a replacement that started moments
    before (or the replacement of the first primary, which diverges at line
    19,000 of the history as it catches up, and then the next one).  Its
    past connections (--respawn replicates forked processes: they go to
    inboxes) reach the inbox its replayed accepts read, and it serves on:
    the client's next line is counted once after every line before it.
    (Handed to its listener instead, as llft-run named it primary before
    its processes had taken over, they never reached it: 3 runs in 4.)"""
    lines = 20_000
    group = ServingGroup(tmp_path / "rd", [examples / "late_divergence", 7000], replicas=3, extra=["--respawn"],
                         env={"DIVERGE_REPLICA": "3", "DIVERGE_AT": "19000"})
    members = Group(group.run_dir)
    try:
        with group.connect() as s:
            line_client(s, [f"line {i}" for i in range(lines)])
        primary = members.primary()
        members.signal(primary, signal.SIGKILL)
        started(members, 3)
        for _ in range(2):
            primary = members.wait_new_primary(primary.pid)
            members.signal(primary, signal.SIGKILL)
        members.wait_new_primary(primary.pid)
        with group.connect() as s:
            s.settimeout(20)
            assert line_client(s, ["after"])[0] == [f"{lines + 1} after"]
            line_client(s, ["SHUTDOWN"])
        group.finish()
    finally:
        group.stop()
    assert group.proc.returncode == 86, group.stderr   # replica 3 diverged, as it was made to
    assert "replica 3 (" in group.stderr and "diverged" in group.stderr, group.stderr


def test_a_successor_that_fails_before_it_took_over_is_replaced_by_another(examples, tmp_path):
    """late_divergence, two replicas: the replacement chosen to take over
    diverges while it replays the history (at line LINES - 10).  It failed
    as a backup does: the next replacement takes over, and the client's
    next line is counted once after every line before it; the run's status
    says a replica diverged."""
    group = ServingGroup(tmp_path / "rd", [examples / "late_divergence", 7000], replicas=2,
                         extra=["--respawn", "--fault-timeout", "10000"],
                         env={"DIVERGE_REPLICA": "2", "DIVERGE_AT": str(LINES - 10)})
    try:
        with group.connect() as s:
            line_client(s, [f"line {i}" for i in range(LINES)])
        choose_a_starting_replacement(group)
        with group.connect() as s:
            s.settimeout(20)
            assert line_client(s, ["after"])[0] == [f"{LINES + 1} after"]
            line_client(s, ["SHUTDOWN"])
        group.finish()
    finally:
        group.stop()
    assert group.proc.returncode == 86, group.stderr
    assert "replica 2 (taking over) diverged from the primary" in group.stderr, group.stderr
