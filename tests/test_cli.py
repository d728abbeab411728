"""Command-line behaviour a user meets first: help, and one clear line for
each bad invocation, never a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from conftest import tool


def run(*args, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("name", ["llft-run", "llft-kill", "llft-status", "llft-gateway"])
def test_help(name):
    p = run(tool(name), "--help")
    assert p.returncode == 0 and "usage:" in p.stdout


@pytest.mark.parametrize("args, message", [
    ([], "no program given"),
    (["--", "/no/such/program"], "no such file"),
    (["--", "no-such-command-xyz"], "command not found"),
    (["--replicas", "0", "--", "true"], "at least 1"),
    (["--replicas", "many", "--", "true"], "invalid int value"),
    (["--ring-slots", "1000", "--", "true"], "power of two"),
    (["--replay-from", "/no/such/stream", "--", "true"], "no such file"),
    (["--join", "--", "true"], "--join needs --group"),
    (["--join", "--group", "g", "--", "true"], "needs --key-file"),
    (["--join", "--group", "g", "--replicas", "2", "--", "true"], "one replica on this host"),
    (["--join", "--group", "g", "--key-file", "/no/such/key", "--", "true"], "cannot read key file"),
    (["--mode", "semi-passive", "--", "true"], "give --checkpoint-every too"),
    (["--mode", "semi-passive", "--checkpoint-every", "1", "--replicas", "1", "--", "true"], "--replicas 2 or more"),
    (["--mode", "semi-passive", "--checkpoint-every", "1", "--keep", "2", "--", "true"], "no --keep"),
    (["--mode", "passive", "--", "true"], "invalid choice"),
])
def test_llft_run_bad_input(args, message, tmp_path):
    p = run(tool("llft-run"), "--run-dir", str(tmp_path / "rd"), *args)
    assert p.returncode == 2
    assert message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_llft_run_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = run(tool("llft-run"), "--run-dir", str(blocker / "sub"), "--", "true")
    assert p.returncode == 2
    assert "cannot use run dir" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_exit_status_is_the_primary_s(tmp_path):
    p = run(tool("llft-run"), "--replicas", "2", "--run-dir", str(tmp_path / "rd"), "--", "sh", "-c", "exit 7")
    assert p.returncode == 7, p.stderr


def test_status_and_kill_without_a_group(tmp_path):
    for name, extra in (("llft-status", []), ("llft-kill", ["--primary"])):
        p = run(tool(name), *extra, cwd=tmp_path)
        assert p.returncode == 2 and "no llft run" in p.stderr and "Traceback" not in p.stderr


def test_status_json_after_a_run(examples, tmp_path):
    rd = tmp_path / "rd"
    assert run(tool("llft-run"), "--replicas", "3", "--run-dir", str(rd), "--", examples / "race", "2", "50").returncode == 0
    p = run(tool("llft-status"), "--run-dir", str(rd), "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert [m["role"] for m in report["members"]] == ["primary", "backup", "backup"]
    assert all(m["state"] == "exited" for m in report["members"])


def test_kill_unknown_replica(examples, tmp_path):
    rd = tmp_path / "rd"
    run(tool("llft-run"), "--replicas", "2", "--run-dir", str(rd), "--", "true")
    p = run(tool("llft-kill"), "--run-dir", str(rd), "--replica", "5")
    assert p.returncode == 2 and "no replica 5" in p.stderr
    p = run(tool("llft-kill"), "--run-dir", str(rd), "--backup", "1")
    assert p.returncode == 1 and "not running" in p.stderr


@pytest.mark.parametrize("args, message", [
    ([], "--group NAME is required"),
    (["--group", "g"], "--port PORT"),
    (["--group", "g", "--port", "7000"], "needs --key-file"),
    (["--group", "g", "--port", "99999", "--key-file", "k"], "--port PORT"),
    (["--group", "g", "--port", "7000", "--udp-port", "0", "--key-file", "k"], "--udp-port 0: ports are 1-65535"),
    (["--group", "g", "--port", "7000", "--udp-port", "dns", "--key-file", "k"], "expected [PROG:]PUBLIC"),
])
def test_llft_gateway_bad_input(args, message, tmp_path):
    p = run(tool("llft-gateway"), "--run-dir", str(tmp_path / "rd"), *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_gateway_key_file_is_made_private(tmp_path):
    key = tmp_path / "k"
    assert run(tool("llft-gateway"), "--make-key", str(key)).returncode == 0
    assert key.stat().st_mode & 0o777 == 0o600 and len(bytes.fromhex(key.read_text().strip())) >= 16
    key.chmod(0o644)
    p = run(tool("llft-gateway"), "--group", "g", "--port", "7000", "--key-file", str(key))
    assert p.returncode == 2 and "chmod 600" in p.stderr


@pytest.mark.parametrize("args, message", [
    (["--partition", "0 / 1,2"], "need a group across hosts"),
    (["--loss", "20%"], "need a group across hosts"),
    (["--primary", "--heal"], "say what to break"),
    ([], "say what to break"),
])
def test_network_faults_on_a_local_group_are_refused(args, message, tmp_path):
    rd = tmp_path / "rd"
    run(tool("llft-run"), "--replicas", "2", "--run-dir", str(rd), "--", "true")
    p = run(tool("llft-kill"), "--run-dir", str(rd), *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_llft_run_serializes_programs_known_to_race(tmp_path):
    """memcached's LRU threads, Node's and the JVM's own threads race on
    memory outside any lock (docs/determinizer.md): llft-run runs them with
    --serialize and says so; told --no-serialize, it says how else to run
    them; memcached without its LRU threads runs as it is (here stand-ins
    that exit at once, named so)."""
    import shutil
    for name in ("memcached", "node", "java"):
        fake = tmp_path / name
        fake.symlink_to(shutil.which("true"))
        chosen = run(tool("llft-run"), "--replicas", "1", "--run-dir", str(tmp_path / f"{name}-a"), "--", str(fake))
        assert chosen.returncode == 0 and "running it with --serialize" in chosen.stderr, chosen.stderr
    fake = tmp_path / "memcached"
    warned = run(tool("llft-run"), "--replicas", "1", "--no-serialize", "--run-dir", str(tmp_path / "b"), "--",
                 str(fake), "-t", "4")
    assert warned.returncode == 0, warned.stderr
    assert "--serialize, or with -o no_lru_crawler,no_lru_maintainer" in warned.stderr, warned.stderr
    quiet = run(tool("llft-run"), "--replicas", "1", "--run-dir", str(tmp_path / "c"), "--", str(fake), "-t", "4",
                "-o", "no_lru_crawler,no_lru_maintainer")
    assert quiet.returncode == 0 and "serialize" not in quiet.stderr, quiet.stderr
    both = run(tool("llft-run"), "--serialize", "--no-serialize", "--", str(fake))
    assert both.returncode == 2 and "choose one" in both.stderr


def test_status_shows_what_each_replica_sent(examples, tmp_path):
    from serving import ServingGroup, line_client
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000])
    try:
        with group.connect() as s:
            line_client(s, [f"SET k{i} v{i}" for i in range(40)] + ["DIGEST"])
        deadline = time.monotonic() + 20
        while True:   # the state file is rewritten every second; backups may lag
            p = run(tool("llft-status"), "--run-dir", str(group.run_dir), "--json")
            sent = [m.get("sent") for m in json.loads(p.stdout)["members"]]
            if all(x and x["bytes"] == sent[0]["bytes"] > 0 for x in sent) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert sent[0]["connections"] >= 1 and len({x["digest"] for x in sent}) == 1, sent
        text = run(tool("llft-status"), "--run-dir", str(group.run_dir)).stdout
        assert text.count(f"{sent[0]['bytes']} {sent[0]['digest']}") == 3, text
    finally:
        group.stop()


def test_output_comparison_tells_a_lagging_backup_from_a_diverged_one():
    from llft.members import output_differs, output_digest
    primary = {"1": {"bytes": 10, "sha256": "aa"}, "2": {"bytes": 5, "sha256": "bb"},
               "closed": {"connections": 3, "bytes": 7, "sha256": "cc"}}
    behind = {"1": {"bytes": 4, "sha256": "dd"}, "closed": {"connections": 3, "bytes": 7, "sha256": "ee"}}
    assert output_differs(primary, behind) == []
    assert output_differs(primary, dict(behind, **{"2": {"bytes": 5, "sha256": "ff"}})) == ["2"]
    assert output_digest(primary) == output_digest(dict(primary))
    assert output_digest(primary)["connections"] == 5 and output_digest(primary)["bytes"] == 22
    assert output_digest(primary)["digest"] != output_digest(behind)["digest"]


def test_a_reader_that_stops_early_gets_no_traceback(examples, tmp_path):
    """`llft-status | head -1`: the pipe closes under llft-status."""
    rd = tmp_path / "rd"
    assert run(tool("llft-run"), "--replicas", "3", "--run-dir", str(rd), "--", examples / "race", "2", "50").returncode == 0
    r, w = os.pipe()
    os.close(r)                                  # the reader is gone before the first line
    p = subprocess.run([tool("llft-status"), "--run-dir", str(rd)], stdout=w, stderr=subprocess.PIPE, text=True,
                       timeout=30)
    os.close(w)
    assert p.returncode == 141 and "Traceback" not in p.stderr, p.stderr
