"""How llft finds CRIU (llft/checkpoint/criu.py): `criu check` runs once per
boot and binary, a pass is remembered, a failure never is.  A CRIU of this
test's making stands in for the real one: a script that answers --version
and counts the checks it is asked for."""
from __future__ import annotations

import os
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
