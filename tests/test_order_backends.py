"""The ordering seam: groups on one host over each backend, copies of the
mailbox failing under load, the choice refused where a backend cannot
go, and the replication core kept free of any backend's internals."""
from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, tool
import serving
from serving import Progress, ServingGroup, line_client, line_clients
from test_failover import check_exactly_once, finish_and_check

BACKEND_PACKAGES = ("llft.ordering.mailbox", "llft.ordering.llmp")


def status(group) -> dict:
    out = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir), "--json"], capture_output=True,
                         text=True, timeout=30)
    return json.loads(out.stdout)


def llft_kill(group, *args) -> subprocess.CompletedProcess:
    return subprocess.run([tool("llft-kill"), "--run-dir", str(group.run_dir), *args], capture_output=True,
                          text=True, timeout=30)


def copies_then_kill(group, progress: Progress, copies: list[tuple[int, int]], kill_at: int):
    """meanwhile() for line_clients: fails mailbox copy I after the k-th
    reply for each (k, I), then kills the primary after the kill_at-th;
    and the list that gets what llft-kill said at each, "killed" last."""
    said: list[str] = []

    def faults():
        for k, copy in copies:
            progress.wait(k)
            said.append(llft_kill(group, "--mailbox-copy", str(copy)).stdout)
        progress.wait(kill_at)
        serving.kill_primary(group.run_dir)
        said.append("killed")
    return faults, said


@pytest.mark.parametrize("protocol", ["1", "2"])
def test_mailbox_copies_fail_under_load_and_the_group_fails_over(protocol, examples, tmp_path):
    """Two of the three copies fail, one after the 200th reply, one after
    the 400th; then the primary is killed after the 600th.  Every request
    is answered exactly once and the survivors agree."""
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000],
                         extra=["--order", "mailbox", "--mailbox-protocol", protocol])
    progress = Progress()
    faults, said = copies_then_kill(group, progress, [(200, 0), (400, 1)], 600)
    results = line_clients(group, 4, lambda i: [f"c{i}-{j}" for j in range(250)], faults, pause=0.001,
                           progress=progress)
    assert said[-1:] == ["killed"], "the workload ended before every fault"
    assert said[:2] == [f"llft-kill: copy {k} of group echo_server's mailbox has failed\n" for k in (0, 1)]
    check_exactly_once(results, 4, 250)
    order = status(group)["order"]
    assert order["backend"] == "mailbox" and order["copies_failed"] == 2 and order["protocol"] == int(protocol)
    state = finish_and_check(group)
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]


def test_a_forking_server_over_mailboxes_loses_a_copy_and_fails_over(examples, tmp_path):
    """prefork_server's master and its two workers (--fork replicate, the
    default) each have a mailbox of their own.  Copy 1 fails after the
    150th reply, in the one memory module that holds copy 1 of all three;
    the primary is killed after the 300th: every count is given once, the
    survivors agree, and no mailbox outlives the group."""
    from test_forked_processes import check_worker_counts, finish_survivors, shut_down_workers
    group = ServingGroup(tmp_path / "rd", [examples / "prefork_server", 7000, 2], extra=["--order", "mailbox"])
    progress = Progress()
    faults, said = copies_then_kill(group, progress, [(150, 1)], 300)
    results = line_clients(group, 4, lambda i: [f"c{i}-{j}" for j in range(120)], faults, pause=0.001,
                           progress=progress)
    assert said[-1:] == ["killed"], "the workload ended before every fault"
    assert said[0] == ("llft-kill: copy 1 of group prefork_server's mailbox has failed (and of its 2 forked "
                       "processes' mailboxes)\n"), said
    check_worker_counts(results, 120)
    assert status(group)["forked"]["streams"] == 2
    shut_down_workers(group, 2)
    finish_survivors(group, 1)
    assert not list(Path("/dev/shm").glob(f"llft-mbx-{group.proc.pid}-*")), "a mailbox outlived its group"


def test_status_names_the_backend(examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], extra=["--order", "mailbox"])
    with group.connect() as s:
        line_client(s, [f"SET k{i} v{i}" for i in range(20)])
    text = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir)], capture_output=True, text=True,
                          timeout=30).stdout
    assert "order mailbox (protocol 1, 3 of 3 copies intact;" in text
    with group.connect() as s:
        line_client(s, ["SHUTDOWN"])
    group.finish()
    assert not list(Path("/dev/shm").glob(f"llft-mbx-*-{group.proc.pid}.*")), "the mailbox outlived its group"


def test_mailbox_choices_that_cannot_work_are_refused(examples, tmp_path):
    run = [tool("llft-run"), "--run-dir", str(tmp_path / "rd")]
    cases = [
        (["--order", "mailbox", "--join", "--group", "g"], "--order mailbox reaches replicas on this host only"),
        (["--mailbox-copies", "2"], "--mailbox-copies and --mailbox-protocol go with --order mailbox"),
        (["--order", "mailbox", "--mailbox-copies", "0"], "--mailbox-copies must be from 1 to 16"),
        (["--order", "isis"], "invalid choice: 'isis'"),
    ]
    for extra, message in cases:
        out = subprocess.run(run + extra + ["--", str(examples / "echo_server"), "7000"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 2 and message in out.stderr, (extra, out.stderr)


def test_failing_a_mailbox_copy_of_a_group_without_one_is_an_error(examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "echo_server", 7000])
    out = llft_kill(group, "--mailbox-copy", "0")
    assert out.returncode == 2 and "is not running over --order mailbox" in out.stderr
    with group.connect() as s:
        line_client(s, ["SHUTDOWN"])
    group.finish()


def imports_of(path: Path) -> list[tuple[str, list[str]]]:
    """Each module a source file imports, with the names it takes from it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names]))
    return found


def test_the_replication_core_imports_no_backend_internals():
    """The seam (llft/ordering/*.py) names the backends only in the functions
    that pick one by name; nothing else reaches into a backend's package but
    llft-kill (which fails a mailbox copy) and the datagram fuzzer (which
    forges the llft backend's datagrams)."""
    seam = sorted((REPO / "llft/ordering").glob("*.py"))
    allowed = {REPO / "llft/cli/kill.py", REPO / "llft/nemesis/fuzz.py", *seam}
    offenders = []
    for path in (REPO / "llft").rglob("*.py"):
        if path in allowed or path.is_relative_to(REPO / "llft/ordering"):
            continue
        offenders += [f"{path.relative_to(REPO)}: {module}" for module, _names in imports_of(path)
                      if module.startswith(BACKEND_PACKAGES)]
    for path in seam:
        tree = ast.parse(path.read_text())
        offenders += [f"{path.relative_to(REPO)} at the top: {node.module}" for node in tree.body
                      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(BACKEND_PACKAGES)]
    assert not offenders, offenders
    assert {p.name for p in seam} >= {"backend.py", "group.py", "ids.py"}


def test_the_cross_host_core_reaches_the_llft_backend_through_the_seam():
    """What the core across hosts uses of a member's backend is GroupMember's
    (llft/ordering/group.py), implemented by the llft backend in full."""
    from llft.ordering.group import Connections, GroupMember, Membership, NewcomerAdmission
    from llft.ordering.llmp.gateway import GatewayEnd
    from llft.ordering.llmp.member import LlmpMember
    from llft.ordering.llmp.membership.membership import Admission
    from llft.ordering.llmp.membership.membership_protocol import MembershipProtocol
    for cls, seam in ((LlmpMember, GroupMember), (GatewayEnd, Connections), (MembershipProtocol, Membership),
                      (Admission, NewcomerAdmission)):
        assert issubclass(cls, seam) and not cls.__abstractmethods__, (cls, sorted(cls.__abstractmethods__))


def test_kill_while_idle_after_connections_closed_over_the_mailbox(examples, tmp_path):
    """The quiet moment: every connection closed, the group idle, then the
    primary dies; the new primary has every acknowledged write."""
    group = ServingGroup(tmp_path / "rd", [examples / "kv_server", 7000], extra=["--order", "mailbox"])
    for i in range(30):
        with group.connect() as s:
            line_client(s, [f"SET k{i} v{i}"])
    serving.kill_primary(group.run_dir)
    with group.connect() as s:
        replies, _ = line_client(s, [f"GET k{i}" for i in range(30)])
    assert replies == [f"VALUE v{i}" for i in range(30)]
    finish_and_check(group)
