"""Shared fixtures: the example programs, built once, and a runner for the
installed llft commands (tests exercise the installed package, as a user
would)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
PROGRAMS_DIR = Path(__file__).with_name("programs")


def tool(name: str) -> str:
    path = BIN_DIR / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: run scripts/setup.sh")
    return str(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the test item (item.rep_call...), for
    fixtures that print diagnostics at teardown only when the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def examples() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "examples")], check=True)
    return REPO / "examples" / "bin"


@pytest.fixture(scope="session")
def real_python() -> str:
    """The interpreter binary itself (not a venv or pyenv wrapper)."""
    return os.path.realpath(sys.executable)


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path, replicas: int):
        self.proc = proc
        self.run_dir = run_dir
        self.replicas = replicas

    @property
    def status(self) -> int:
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return self.proc.stderr

    def out(self, k: int) -> str:
        return (self.run_dir / f"replica-{k}" / "stdout").read_text()

    def err(self, k: int) -> str:
        return (self.run_dir / f"replica-{k}" / "stderr").read_text()


@pytest.fixture
def llft_run(tmp_path):
    """llft_run(program_argv, replicas=3, extra=[...], env={...}) -> Run"""
    counter = iter(range(10_000))

    def run(argv, replicas=3, extra=(), env=None, timeout=120, run_dir=None):
        rd = run_dir or tmp_path / f"run{next(counter)}"
        cmd = [tool("llft-run"), "--replicas", str(replicas), "--run-dir", str(rd), *extra, "--", *map(str, argv)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        return Run(proc, rd, replicas)

    return run


@pytest.fixture(autouse=True)
def _stop_serving_groups():
    """No test leaves a replica group running, whatever its outcome."""
    yield
    import serving
    while serving.LIVE:
        serving.LIVE.pop().stop()
