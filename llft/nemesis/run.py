"""One nemesis run of one server shape: the group started under llft-run
(with --respawn, so that it stays at strength), checkable clients, faults
picked at random from a seeded generator, each after the clients' k-th
reply since the last; then the clients' histories checked, the program
shut down, and the replicas' outputs compared."""
from __future__ import annotations

import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llft.nemesis.faults import IDLE_KINDS, KINDS, RECONNECT_KINDS, REPLICAS_NEEDED, Group, GroupLost, inject
from llft.nemesis.history import Verdict, check
from llft.nemesis.protocols import Connection
from llft.nemesis.shapes import Shape
from llft.nemesis.workload import Workload

START_TIMEOUT_S = 30.0
PROGRESS_TIMEOUT_S = 60.0
FAULTS_PER_GROUP = 10


@dataclass
class ShapeResult:
    shape: str
    seed: int
    run_dir: Path
    injected: int = 0
    survived: int = 0
    group_lost: str | None = None
    verdict: Verdict = field(default_factory=Verdict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.group_lost is None and self.verdict.ok and not self.problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def wait_served(port: int, proc: subprocess.Popen):
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise GroupLost(f"llft-run exited at start with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise GroupLost("the group never served its port")


def run_in_groups(result: ShapeResult, faults: int, per_group: int, keep: bool, run_dir_of, run_group):
    """The faults, per_group to a group, each group in run_dir_of(g) and run
    by run_group(n), until they are all injected or a group fails.  A group
    that passed leaves nothing behind unless keep."""
    left, g = faults, 0
    while result.ok and (left > 0 or g == 0):
        n = min(left, per_group)
        result.run_dir = run_dir_of(g)
        run_group(n)
        if result.ok and not keep:
            shutil.rmtree(result.run_dir, ignore_errors=True)
            (result.run_dir.parent / f"{result.run_dir.name}.stderr").unlink(missing_ok=True)
        left -= n
        g += 1
    return result


class ShapeRun:
    def __init__(self, shape: Shape, seed: int, faults: int, work_dir: Path, examples: Path, *, replicas: int = 3,
                 clients: int = 4, progress: int = 150, pace_ms: float = 1.0, fault_timeout_ms: float = 30.0,
                 keep: bool = False, clone: bool = False, checkpoint_every: float | None = None, log=None):
        self.shape, self.seed, self.faults = shape, seed, faults
        self.replace = ["--keep", str(replicas)] if clone or checkpoint_every else ["--respawn"]
        if checkpoint_every:
            self.replace += ["--checkpoint-every", f"{checkpoint_every:g}"]
        self.replicas, self.clients, self.progress, self.pace_s = replicas, clients, progress, pace_ms / 1000
        self.fault_timeout_s = fault_timeout_ms / 1000
        self.examples, self.work_dir, self.keep = examples, work_dir, keep
        self.rng = random.Random(seed)
        self.result = ShapeResult(shape.name, seed, work_dir)
        self.log = log or (lambda record: None)

    def run(self) -> ShapeResult:
        """The faults, FAULTS_PER_GROUP to a group: a replacement replays
        its group's whole history (no checkpoints yet), so a group that
        lived through hundreds of faults would make each recovery longer."""
        return run_in_groups(self.result, self.faults, FAULTS_PER_GROUP, self.keep,
                             lambda g: self.work_dir / f"{self.shape.name}-{self.seed}-{g}", self._run_group)

    def _run_group(self, faults: int):
        r = self.result
        if r.run_dir.exists():
            shutil.rmtree(r.run_dir)
        port = free_port()   # the program's port, served by the gateway on this host
        cmd = [tool("llft-run"), "--replicas", str(self.replicas), *self.replace, "--run-dir", str(r.run_dir),
               "--fault-timeout", str(self.fault_timeout_s * 1000), "--", *self.shape.argv(port, self.examples)]
        r.run_dir.parent.mkdir(parents=True, exist_ok=True)
        stderr = open(r.run_dir.parent / f"{r.run_dir.name}.stderr", "w")   # what llft-run said, kept with its run
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
        stderr.close()
        group = Group(r.run_dir)
        workload = None
        try:
            wait_served(port, proc)
            workload = Workload(self.shape.protocol, self.clients, "127.0.0.1", port, self.pace_s)
            for _ in range(faults):
                self._one_fault(r.injected, group, workload, proc)
            histories = workload.stop()
            workload = None
            r.verdict.add(check(histories, self.shape.protocol.global_count))
            self._shut_down(port, proc)
        except GroupLost as e:
            r.group_lost = str(e)
        finally:
            if workload is not None:
                r.verdict.add(check(workload.stop(timeout=5), self.shape.protocol.global_count))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _one_fault(self, n: int, group: Group, workload: Workload, proc: subprocess.Popen):
        r = self.result
        kind = self.rng.choice(sorted(k for k in KINDS if self.replicas >= REPLICAS_NEEDED.get(k, 2)))
        if not workload.wait_replies(self.progress, PROGRESS_TIMEOUT_S):
            raise GroupLost(f"the clients made no progress before fault {n + 1} ({kind})"
                            if not workload.failed() else "a client failed")
        if (kind in IDLE_KINDS or kind in RECONNECT_KINDS) and \
                not workload.pause(kind in RECONNECT_KINDS, PROGRESS_TIMEOUT_S):
            raise GroupLost(f"the clients did not go idle before fault {n + 1}")
        if kind not in IDLE_KINDS:
            workload.resume()   # (kill-while-connecting: they open new connections as the fault strikes)
        start = time.monotonic()
        what, struck = inject(group, kind, self.fault_timeout_s, self.rng)
        r.injected += 1
        group.wait_recovered(self.replicas, struck)
        if proc.poll() is not None:
            raise GroupLost(f"llft-run exited with status {proc.returncode} after fault {n + 1}")
        workload.resume()
        r.survived += 1
        self.log({"shape": self.shape.name, "seed": self.seed, "fault": n + 1, "kind": kind, "what": what,
                  "recovered_ms": round((time.monotonic() - start) * 1000, 1), "replies": workload.replies})

    def _shut_down(self, port: int, proc: subprocess.Popen):
        """The program's own shutdown; every survivor ends as the primary
        did, having sent the same bytes."""
        r = self.result
        try:
            conn = Connection("127.0.0.1", port, 30)
        except OSError as e:
            raise GroupLost(f"the group took no connection for its shutdown: {e}") from None
        try:
            self.shape.protocol(10_000).shutdown(conn)
            try:
                conn.f.read()   # until the program closes it
            except OSError:
                pass
        except OSError as e:   # ConnectionError too
            raise GroupLost(f"the group did not answer its shutdown: {e}") from None
        finally:
            conn.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            r.problems.append("llft-run did not end after the program's shutdown")
            return
        if proc.returncode != 0:
            said = (r.run_dir.parent / f"{r.run_dir.name}.stderr").read_text().strip()[-2000:]
            r.problems.append(f"llft-run exited {proc.returncode}: {said}")
        state = json.loads((r.run_dir / "llft-run.json").read_text())
        live = [x for x in state["replicas"] if x["role"] in ("primary", "backup")]
        if any(x["outputs"] != live[0]["outputs"] for x in live[1:]):
            r.problems.append("the surviving replicas sent different bytes")
