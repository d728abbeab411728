"""llft's use of CRIU (llft/checkpoint/criu.py).  How it is found: `criu
check` runs once per boot and binary, a pass is remembered, a failure never
is (a CRIU of this test's making stands in for the real one there: a script
that answers --version and counts the checks it is asked for).  And a dump's
hooks, with the real CRIU and a real process: what runs before the freeze
runs after CRIU's start-up, with the process not yet seized, and can call
the dump off."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from llft.checkpoint import criu

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="llft uses CRIU only as root")

FAKE_CRIU = """#!/bin/sh
case "$1" in
  --version) echo "Version: 4.2.1" ;;
  check) echo x >> "$(dirname "$0")/checks"; exit {rc} ;;
esac
"""


@pytest.fixture
def fake_criu(tmp_path, monkeypatch):
    prefix = tmp_path / "criu"
    (prefix / "sbin").mkdir(parents=True)
    (prefix / "lib" / "python" / "pycriu").mkdir(parents=True)
    (prefix / "lib" / "python" / "pycriu" / "__init__.py").write_text("")
    monkeypatch.setattr(criu, "CRIU_PREFIX", prefix)
    monkeypatch.setattr(criu, "CHECKED_DIR", tmp_path / "run")
    monkeypatch.setattr(sys, "path", list(sys.path))   # (find() adds the fake prefix's pycriu to it)
    binary = prefix / "sbin" / "criu"

    def install(rc: int = 0):
        binary.write_text(FAKE_CRIU.format(rc=rc))
        binary.chmod(0o755)
        later = time.time_ns() + 10**9 * (1 + checks())   # a new mtime each time, whatever the clock's grain
        os.utime(binary, ns=(later, later))

    def checks() -> int:
        counted = prefix / "sbin" / "checks"
        return len(counted.read_text().split()) if counted.exists() else 0

    criu.find.cache_clear()
    yield install, checks
    criu.find.cache_clear()   # the real CRIU for the tests after this one


def found_again():
    criu.find.cache_clear()
    return criu.find()


def test_a_passed_check_is_remembered_until_the_binary_changes(fake_criu):
    install, checks = fake_criu
    install()
    assert found_again().version == (4, 2, 1)
    assert checks() == 1
    assert found_again().version == (4, 2, 1)
    assert checks() == 1, "a passed check ran again for the same binary in the same boot"
    install()                                    # rebuilt: checked afresh
    found_again()
    assert checks() == 2


def test_a_failed_check_is_never_remembered(fake_criu):
    install, checks = fake_criu
    install(rc=1)
    for expected in (1, 2):
        with pytest.raises(criu.CriuUnavailable, match="check` fails on this kernel"):
            found_again()
        assert checks() == expected
    install(rc=0)                                # mended: found, then remembered
    found_again()
    found_again()
    assert checks() == 3


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("TracerPid:")).split()[1])


@pytest.fixture
def sleeper():
    if criu.problem():
        pytest.skip(criu.problem())
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield p.pid
    p.kill()
    p.wait()


def test_the_hook_before_the_freeze_runs_once_criu_is_ready_to_seize(sleeper, tmp_path):
    said = []

    def before_freeze():
        log = (tmp_path / "dump.log").read_text()
        said.append(("before", tracer_of(sleeper), "Dumping processes" in log))

    def on_frozen():
        said.append(("frozen", tracer_of(sleeper), None))
        return []
    criu.dump(sleeper, tmp_path, externals=[], on_frozen=on_frozen, before_freeze=before_freeze)
    assert [s[0] for s in said] == ["before", "frozen"]
    assert said[0][1] == 0, "CRIU had seized the process before the hook ran"
    assert said[0][2], "the hook ran before CRIU's start-up was over"
    assert said[1][1] != 0, "the process was not seized when CRIU said it was frozen"
    assert tracer_of(sleeper) == 0


def test_a_failing_hook_calls_the_dump_off_and_leaves_the_process_alone(sleeper, tmp_path):
    class Refused(Exception):
        pass

    def before_freeze():
        raise Refused("not now")

    frozen = []
    with pytest.raises(Refused, match="not now"):
        criu.dump(sleeper, tmp_path, externals=[], on_frozen=lambda: frozen.append(1) or [],
                  before_freeze=before_freeze)
    assert not frozen
    with open(f"/proc/{sleeper}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "S"   # asleep, neither stopped nor traced
    assert tracer_of(sleeper) == 0
