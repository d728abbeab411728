"""The primary's removal of silent backups (llft/cluster/removal.py) on the
simulated network, with real GroupEndpoints: a newcomer whose admission
(it carries the group's log, megabytes) has not reached it yet is not
removed for the silence that costs, however long the admission takes;
it is removed once silent past its grace after the admission arrived,
and a backup that heartbeats is never taken for silent."""
from __future__ import annotations

from llft.auth import Keyring
from llft.cluster.detector import Silence
from llft.cluster.removal import JOIN_GRACE_S, BackupRemoval
from llft.messaging.clock import SimClock
from llft.messaging.config import Config
from llft.messaging.lossy import LossPolicy
from llft.messaging.simnet import SimNetwork, make_group

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
