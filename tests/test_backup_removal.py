"""The primary's removal of silent backups (llft/ordering/llmp/membership/removal.py) on the
simulated network, with real GroupEndpoints: a newcomer whose admission
(it carries the group's log, megabytes) has not reached it yet is not
removed for the silence that costs, however long the admission takes;
it is removed once silent past its grace after the admission arrived,
and a backup that heartbeats is never taken for silent."""
from __future__ import annotations

from llft.auth import Keyring
from llft.ordering.llmp.membership.detector import Silence
from llft.ordering.llmp.membership.removal import CLOCK_SILENCE_FACTOR, JOIN_GRACE_S, BackupRemoval
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group

GROUP = 21
TIMEOUT_S = 0.1
TICK_S = 0.02


def test_a_newcomer_is_not_removed_while_its_admission_is_on_its_way():
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(seed=5, delay=0.0005))
    a, b, c = make_group(net, GROUP, 3, Keyring(b"k" * 32), Config(liveness=0.005))
    removed: list = []
    admitting = {c.me}
    removal = BackupRemoval(a, Silence(a, unread=lambda: False), lambda: TIMEOUT_S,
                            lambda members, why: removed.append((members, why, clock.now())),
                            admitting=lambda: admitting)

    def tick():
        removal.tick()
        clock.call_later(TICK_S, tick)
    tick()
    c.close()    # the newcomer says nothing: it is taking in megabytes of log
    clock.run_until(10 * JOIN_GRACE_S)
    assert removed == [], "a newcomer was removed while its admission had not reached it"
    admitting.clear()          # it acknowledged: from here on it replays the log, then heartbeats
    acked = clock.now()
    clock.run_until(acked + 2 * JOIN_GRACE_S)
    silent = [r for r in removed if r[1].startswith("silent")]
    assert [r[0] for r in silent] == [[c.me]], removed
    assert silent[0][2] >= acked + JOIN_GRACE_S, "the grace after the admission was not given"
    # (b, a bare endpoint here, never acknowledges the RemoveBackup that
    # follows, and is removed for that: no member runs beside it.)


def test_a_dead_backup_is_removed_though_this_member_often_stops_listening():
    """The primary's loop runs late every 80 ms (as real-time throttling
    makes it under load), so its silence count starts again each time,
    short of the removal timeout: a dead backup is removed all the same,
    once silent CLOCK_SILENCE_FACTOR timeouts by the clock; a live one,
    heard between the stalls, never is."""
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(seed=7, delay=0.0005))
    a, b, c = make_group(net, GROUP, 3, Keyring(b"k" * 32), Config(liveness=0.005))
    removed: list = []
    silence = Silence(a, unread=lambda: False)
    removal = BackupRemoval(a, silence, lambda: TIMEOUT_S,
                            lambda members, why: removed.append((members, why, clock.now())))

    def tick():
        removal.tick()
        clock.call_later(TICK_S, tick)

    def stall():
        silence.not_listening()
        clock.call_later(0.08, stall)
    tick()
    clock.run_until(JOIN_GRACE_S + 0.5)
    stall()
    c.close()
    dead_at = clock.now()
    clock.run_until(dead_at + 1.0)   # (the stalls alone would keep it in the view for good)
    silent = [r for r in removed if r[1].startswith("silent")]
    assert [r[0] for r in silent] == [[c.me]], removed
    assert dead_at + CLOCK_SILENCE_FACTOR * TIMEOUT_S <= silent[0][2] <= dead_at + CLOCK_SILENCE_FACTOR * TIMEOUT_S + 0.1
    assert b.me not in [m for r in silent for m in r[0]], "a live backup was taken for silent"
