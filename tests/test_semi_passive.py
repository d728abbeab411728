"""--mode semi-passive (LLFT sec. II-E): only the primary executes; every
interval a checkpoint of it is stored (the primary held still for CRIU),
with the records and client input after it; when the primary fails, a
copy of the checkpoint is restored, replays them and takes over.  A real
server under real clients, the primary killed by SIGKILL after the k-th
reply: every request applied once, the clients' connections kept."""
from __future__ import annotations

import os
import signal

import pytest

from serving import ServingGroup
from test_checkpoint import group_log, needs_criu
from test_rejoin import KvClient, Workload, live, state, wait_for

KILLS = 3


def taken_over_from(old: dict):
    """llft-status predicate: a primary other than old, caught up."""
    def pred(st):
        return any(r["role"] == "primary" and r["index"] != old["index"]
                   and (r["catch_up"] is None or r["catch_up"]["done"]) for r in live(st))
    return pred


@needs_criu
@pytest.mark.parametrize("replicas", [2, 3])
def test_a_copy_of_the_primarys_checkpoint_takes_over_under_load(replicas, examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], replicas=replicas,
                         extra=["--mode", "semi-passive", "--checkpoint-every", "0.3", "--log-output"])
    wl = Workload(group, KvClient, 3)
    try:
        used = 0
        for n in range(KILLS):
            st = wait_for(lambda st: (st.get("stored_checkpoint") or {}).get("number", 0) > used,
                          f"a checkpoint of primary {n + 1} stored", group, timeout=60)
            used = st["stored_checkpoint"]["number"]
            assert [r["role"] for r in live(st)] == ["primary"], "only the primary executes"
            wl.progresses(f"before kill {n + 1}", replies=60)
            primary = next(r for r in live(state(group)) if r["role"] == "primary")
            os.kill(primary["pid"], signal.SIGKILL)
            st = wait_for(taken_over_from(primary), f"kill {n + 1}: a copy of the checkpoint takes over", group,
                          timeout=60)
            assert len(live(st)) == 1
            wl.progresses(f"after kill {n + 1}")
        final = wl.finish_and_shut_down(group)
    finally:
        wl.stop.set()
        group.stop()
    assert [r["role"] for r in final["replicas"]].count("failed") == KILLS
    assert final["gateway"]["failovers"] == KILLS
    text = group_log(group)
    assert len([line for line in text.splitlines() if "restored from the checkpoint" in line]) == KILLS, text[-3000:]
    assert "diverged" not in text


@needs_criu
def test_a_primary_killed_while_idle_is_replaced_and_its_idle_connection_goes_on(examples, tmp_path):
    """The quiet moment: one connection open and idle across the kill and
    the restore; its state and a new connection's are the group's."""
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], replicas=2,
                         extra=["--mode", "semi-passive", "--checkpoint-every", "0.2", "--log-output"])
    idle = group.connect()
    try:
        c = KvClient(idle)
        assert c.incr("k") == 1
        first = wait_for(lambda st: st.get("stored_checkpoint"), "a checkpoint stored", group)
        wait_for(lambda st: st["stored_checkpoint"]["number"] > first["stored_checkpoint"]["number"] + 1,
                 "a checkpoint stored after the increment", group)
        primary = next(r for r in live(state(group)) if r["role"] == "primary")
        os.kill(primary["pid"], signal.SIGKILL)
        wait_for(taken_over_from(primary), "a copy of the checkpoint takes over", group, timeout=60)
        assert c.incr("k") == 2, "the idle connection carries on"
        with group.connect() as s:
            assert KvClient(s).incr("k") == 3
    finally:
        idle.close()
        group.stop()
