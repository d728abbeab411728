"""Programs that drop their privileges before they serve: started through
setpriv (util-linux) or a launcher that calls setuid itself and execs the
server with an environment of its own.  Each replica's program runs as the
unprivileged user, still replicated (the stream file and the preload
library reach it as fds, so llft may be installed where that user cannot
look, and the exec keeps the replica's variables), and fails over."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from serving import ServingGroup
from test_failover import check_exactly_once, finish_and_check, run_clients

NOBODY = 65534


def uid_of(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[2])       # effective
    raise AssertionError(f"no Uid line for {pid}")


LAUNCHERS = {
    "setpriv": lambda examples: [shutil.which("setpriv") or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                 "--clear-groups"],
    "setuid-and-scrubbed-env": lambda examples: [examples / "drop_privileges", str(NOBODY), str(NOBODY)],
}


@pytest.fixture
def public_examples(examples):
    """The example programs where the unprivileged user can reach them
    (a checkout may sit in a directory only root can enter)."""
    where = Path(tempfile.mkdtemp(prefix="llft-privileges-"))
    where.chmod(0o755)
    for name in ("epoll_server", "drop_privileges"):
        shutil.copy2(examples / name, where / name)
    yield where
    shutil.rmtree(where)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_privilege_dropping_server_replicates_and_fails_over(launcher, public_examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [*LAUNCHERS[launcher](public_examples), public_examples / "epoll_server",
                                           7000])
    replicas = json.loads((group.run_dir / "llft-run.json").read_text())["replicas"]
    assert [uid_of(r["pid"]) for r in replicas] == [NOBODY] * 3, "the program does not run as the user it chose"
    results = run_clients(group, nclients=3, nlines=200, kills=1)
    check_exactly_once(results, 3, 200)
    state = finish_and_check(group)
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
