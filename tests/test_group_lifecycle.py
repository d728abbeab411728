"""A group on one host as its user sees it: llft-status's view of the
membership, several groups side by side, stopping with a signal, and a
client that floods."""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from conftest import tool
from serving import ServingGroup, kill_primary, line_client


def status(run_dir: Path) -> dict:
    p = subprocess.run([tool("llft-status"), "--run-dir", str(run_dir), "--json"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def wait_for(predicate, what: str, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_status_shows_view_precedence_and_rank_across_a_failover(examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    first = status(group.run_dir)
    assert first["view"] == {"pvn": 1, "primary": 0}
    assert [(m["index"], m["role"], m["precedence"], m["rank"]) for m in first["members"]] == \
        [(0, "primary", 0, 1), (1, "backup", 1, 2), (2, "backup", 2, 3)]
    with group.connect() as s:
        assert line_client(s, ["before"])[0] == ["1 before"]
        kill_primary(group.run_dir)
        assert line_client(s, ["after"])[0] == ["2 after"]     # the same connection, served by the new primary
    after = wait_for(lambda: (st := status(group.run_dir))["view"]["pvn"] == 2 and st, "view 2 in the state file")
    assert after["view"] == {"pvn": 2, "primary": 1}
    assert [(m["index"], m["role"], m["rank"]) for m in after["members"]] == \
        [(0, "failed", None), (1, "primary", 1), (2, "backup", 2)]
    text = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir)], capture_output=True,
                          text=True, timeout=30).stdout
    assert "view 2  primary 1" in text
    group.stop()


def test_two_groups_side_by_side_on_one_host(examples, tmp_path):
    """Same program, same port inside each group, distinct public ports: a
    failure in one group leaves the other alone."""
    a = ServingGroup(tmp_path / "a", [examples / "echo_server", 7000], extra=["--group", "alpha"])
    b = ServingGroup(tmp_path / "b", [examples / "echo_server", 7000], extra=["--group", "beta"])
    with a.connect() as sa, b.connect() as sb:
        assert line_client(sa, ["a1", "a2"])[0] == ["1 a1", "2 a2"]
        assert line_client(sb, ["b1"])[0] == ["1 b1"]
        kill_primary(a.run_dir)
        assert line_client(sa, ["a3"])[0] == ["3 a3"]
        assert line_client(sb, ["b2"])[0] == ["2 b2"]
    sa_state, sb_state = status(a.run_dir), status(b.run_dir)
    assert (sa_state["group"], sa_state["view"]["pvn"]) == ("alpha", 2)
    assert (sb_state["group"], sb_state["view"]["pvn"]) == ("beta", 1)
    assert [m["state"] for m in sb_state["members"]] == ["running"] * 3
    a.stop()
    b.stop()


def test_sigterm_stops_the_whole_group(examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    with group.connect() as s:
        line_client(s, ["hello"])
        members = status(group.run_dir)["members"]
        pids = [m["pid"] for m in members]
        streams = [Path(m["stream"]) for m in members]
        assert all(psutil.pid_exists(p) for p in pids)
        group.proc.send_signal(signal.SIGTERM)
        assert group.proc.wait(timeout=30) == 128 + signal.SIGTERM
    gone = [p for p in pids if not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE]
    assert gone == pids, "a replica outlived llft-run"
    assert not [p for p in streams if p.exists()], "shared-memory streams left behind"
    assert status(group.run_dir)["phase"] in ("finished", "stopped")


def test_replicas_die_with_a_killed_controller(examples, tmp_path):
    """llft-run SIGKILLed (it cannot clean up): its replicas go too, rather
    than run on unreplicated, holding the program's ports."""
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    pids = [m["pid"] for m in status(group.run_dir)["members"]]
    assert all(psutil.pid_exists(p) for p in pids)
    group.proc.kill()
    group.proc.wait(timeout=30)

    def alive():
        return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    try:
        wait_for(lambda: not alive(), "the replicas to end with their controller", timeout=10)
    finally:
        for p in alive():     # (ours: the replicas this test started)
            psutil.Process(p).kill()


def test_the_rings_of_a_killed_controller_are_removed_by_the_next_run(examples, tmp_path):
    """A controller killed with SIGKILL leaves its replicas' rings in shared
    memory (16 MiB each); the next llft-run removes those of controllers
    that are dead, and no other."""
    import os
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    rings = [Path(r["stream"]) for r in json.loads((group.run_dir / "llft-run.json").read_text())["replicas"]]
    group.proc.kill()
    group.proc.wait(timeout=30)
    assert all(r.exists() for r in rings), "the killed controller removed its rings after all"
    live = rings[0].with_name(f"llft-{os.getpid()}-r63")      # a live process's, by its name
    live.write_bytes(b"")
    try:
        again = ServingGroup(tmp_path / "rd2", [examples / "echo_server", 7000])
        with again.connect() as s:
            line_client(s, ["SHUTDOWN"])
        again.finish()
        assert not any(r.exists() for r in rings), "a dead controller's rings are still there"
        assert live.exists(), "a ring of a live process was removed"
        assert "removed 3 ring files of llft controllers that died" in (tmp_path / "rd2" / "llft.log").read_text()
    finally:
        live.unlink(missing_ok=True)


def test_a_flooding_client_does_not_grow_memory_nor_starve_others(examples, tmp_path):
    """A client that sends without ever reading its replies: llft-run pushes
    back (the client's writes block) instead of buffering it all, and the
    group keeps serving everyone else."""
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    controller = psutil.Process(group.proc.pid)
    rss_before = controller.memory_info().rss
    sent = [0]
    stop = threading.Event()
    flooder = group.connect()

    def flood():
        line = b"x" * 1000 + b"\n"
        chunk = line * 64
        try:
            while not stop.is_set():
                sent[0] += flooder.send(chunk)
        except OSError:
            pass
    t = threading.Thread(target=flood, daemon=True)
    t.start()
    peak = rss_before
    with group.connect() as s:
        for i in range(20):
            replies, _ = line_client(s, [f"polite {i}"])
            assert replies[0].endswith(f" polite {i}")
            peak = max(peak, controller.memory_info().rss)
            time.sleep(0.25)
    assert sent[0] > 1 << 20, "the flood never got going"
    stop.set()
    flooder.close()
    t.join(10)
    growth = (peak - rss_before) >> 20
    assert growth < 64, f"llft-run grew by {growth} MiB while a client sent {sent[0] >> 20} MiB unread"
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    outputs = [r["outputs"] for r in state["replicas"]]
    assert outputs[1] == outputs[0] == outputs[2]
