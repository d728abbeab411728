"""A nemesis run of one server shape across hosts: network namespaces on
one bridge (hosts.py), `llft-run --join` on each of MEMBERS hosts,
`llft-gateway` on one more, the clients in the gateway's namespace.  Its
faults are those of a group across hosts: a replica killed (its member
resets and joins again with a fresh replica), a whole host crashed (its
member and replica killed; the nemesis starts a new member there), a
host frozen past the fault timeout, the primary's host partitioned from
the others, and 20% loss on every link, each healed after a while."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

from llft.nemesis import hosts
from llft.nemesis.faults import GroupLost
from llft.nemesis.history import check
from llft.nemesis.protocols import Connection
from llft.nemesis.run import PROGRESS_TIMEOUT_S, ShapeResult, run_in_groups, tool
from llft.nemesis.shapes import Shape
from llft.nemesis.workload import Workload

MEMBERS = 3
PORT = 7000
RECOVERY_TIMEOUT_S = 60.0
NETWORK_FAULT_S = 1.0     # how long a partition or the loss lasts before it is healed
FAULTS_PER_GROUP = 4
FREEZE_S = 0.3
CLONE_HISTORY_LIMIT_MIB = "0.01"   # --clone: a history limit the group passes at once
KINDS = {
    "kill-primary": "SIGKILL of the primary's replica (its member resets and joins again)",
    "kill-backup": "SIGKILL of a backup's replica",
    "crash-primary-host": "SIGKILL of the primary's member and replica; a new member starts on that host",
    "crash-backup-host": "SIGKILL of a backup's member and replica; a new member starts on that host",
    "freeze-primary-host": "SIGSTOP of the primary's member and replica past the fault timeout, then SIGCONT",
    "partition-primary": "the primary's host cut off from the others, then healed",
    "loss": "20% of the group traffic lost at every member, then healed",
}


def _log_lines(run_dir: Path) -> list[str]:
    try:
        return (run_dir / "llft.log").read_text(errors="replace").splitlines()
    except OSError:
        return []


class Cluster:
    def __init__(self, stack: ExitStack, run_dir: Path, shape: Shape, examples: Path, spare: int = 0,
                 member_options=()):
        """Hosts 0..MEMBERS-1 for the members (llft-run --join with
        member_options), MEMBERS for the gateway, then `spare` more."""
        self.run_dir, self.shape, self.examples = run_dir, shape, examples
        self.member_options = list(member_options)
        self.hosts = stack.enter_context(hosts.bridged_hosts(MEMBERS + 1 + spare))
        self.key = run_dir / "group.key"
        run_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([tool("llft-gateway"), "--make-key", str(self.key)], check=True, capture_output=True)
        self.procs: list[subprocess.Popen] = []
        self.members: dict[int, tuple[subprocess.Popen, Path]] = {}   # host -> its member and run dir
        self.starts = 0
        stack.callback(self.stop)

    def _start(self, host: int, argv: list) -> subprocess.Popen:
        p = subprocess.Popen(hosts.in_ns(self.hosts[host][0], *argv), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def start_member(self, host: int):
        self.starts += 1
        run_dir = self.run_dir / f"member-{host}-{self.starts}"
        p = self._start(host, [tool("llft-run"), "--join", "--group", "nemesis", "--key-file", self.key,
                               "--run-dir", run_dir, "--log-level", "info", *self.member_options, "--",
                               *self.shape.argv(PORT, self.examples)])
        self.members[host] = (p, run_dir)

    def start(self):
        self.start_member(0)
        self.wait(lambda: (s := self.status(self.members[0][1])) and s.get("members"), "the first member")
        for host in range(1, MEMBERS):
            self.start_member(host)
        self.wait_whole("the members to join")
        gw_host = MEMBERS
        self.gateway_dir = self.run_dir / "gateway"
        self.gateway = self._start(gw_host, [tool("llft-gateway"), "--group", "nemesis", "--port", PORT,
                                             "--key-file", self.key, "--run-dir", self.gateway_dir])
        self.wait(lambda: self.status(self.gateway_dir) is not None, "the gateway")

    @staticmethod
    def status(run_dir: Path) -> dict | None:
        r = subprocess.run([tool("llft-status"), "--run-dir", str(run_dir), "--json"], capture_output=True,
                           text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def wait(self, cond, what: str, timeout: float = RECOVERY_TIMEOUT_S):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.05)
        raise GroupLost(f"not within {timeout:g} s: {what}")

    def whole(self) -> bool:
        """Every member in one view of MEMBERS members, each with a replica running."""
        sts = [self.status(d) for p, d in self.members.values()]
        if any(s is None or p.poll() is not None for s, (p, _) in zip(sts, self.members.values())):
            return False
        views = {s["view"]["pvn"] for s in sts}
        return len(views) == 1 and all(len(s["members"]) == MEMBERS and s["replicas"] and
                                       s["replicas"][0]["state"] == "running" for s in sts)

    def wait_whole(self, what: str):
        try:
            self.wait(self.whole, what)
        except GroupLost as e:
            raise GroupLost(f"{e}{self._why_nobody_joins()}") from None

    def _why_nobody_joins(self) -> str:
        """A group that cannot regain strength says why, when its members know."""
        for _, d in self.members.values():
            h = (self.status(d) or {}).get("history") or {}
            if h and not h.get("complete", True):
                refusals = [line for _, m in self.members.values() for line in _log_lines(m)
                            if "asked to join: refused" in line]
                return (f"; no member can join: the group's history passed --history-limit "
                        f"({h['limit'] >> 20} MiB), so a newcomer needs a checkpoint"
                        + (f", and the last one asked for was refused: {refusals[-1]}" if refusals else ""))
        return ""

    def primary_host(self) -> int:
        for host, (_, d) in self.members.items():
            s = self.status(d)
            if s and s["replicas"] and s["replicas"][0]["role"] == "primary":
                return host
        raise GroupLost("no member's replica is the primary")

    def kill(self, *args) -> str:
        dirs = [x for _, d in self.members.values() for x in ("--run-dir", str(d))]
        r = subprocess.run([tool("llft-kill"), *dirs, *map(str, args)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise GroupLost(f"llft-kill {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r.stdout.strip()

    def crash(self, host: int):
        """The host's member and replica both killed, as a host's power cut."""
        p, d = self.members[host]
        s = self.status(d)
        for pid in ([s["controller_pid"]] + [r["pid"] for r in s["replicas"]]) if s else [p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
        p.wait()

    def stop(self):
        hosts.stop_processes(self.procs)


def inject(c: Cluster, kind: str, rng) -> str:
    prim = c.primary_host()
    backups = [h for h in c.members if h != prim]
    if kind == "kill-primary":
        return c.kill("--primary")
    if kind == "kill-backup":
        _, d = c.members[rng.choice(backups)]
        return c.kill("--backup", c.status(d)["replicas"][0]["index"])
    if kind in ("crash-primary-host", "crash-backup-host"):
        host = prim if kind == "crash-primary-host" else rng.choice(backups)
        c.crash(host)
        c.start_member(host)
        return f"host {host}'s member and replica killed; a new member started there"
    if kind == "freeze-primary-host":
        c.kill("--primary", "--signal", "STOP")
        time.sleep(FREEZE_S)   # well past the fault timeout: the others elect a new primary
        index = c.status(c.members[prim][1])["replicas"][0]["index"]
        c.kill("--replica", index, "--signal", "CONT")
        return f"host {prim} (replica {index}, the primary) stopped for {FREEZE_S * 1000:.0f} ms, then woken"
    if kind == "partition-primary":
        idx = {h: c.status(d)["replicas"][0]["index"] for h, (_, d) in c.members.items()}
        what = c.kill("--partition", f"{idx[prim]} / {','.join(str(idx[h]) for h in backups)}")
        time.sleep(NETWORK_FAULT_S)
        c.kill("--heal")
        return what + ", then healed"
    if kind == "loss":
        what = c.kill("--loss", "20%")
        time.sleep(NETWORK_FAULT_S)
        c.kill("--heal")
        return what + ", then healed"
    raise ValueError(f"unknown fault {kind}")


class ClusterRun:
    """ShapeRun's counterpart across hosts (one group per run)."""

    def __init__(self, shape: Shape, seed: int, faults: int, work_dir: Path, examples: Path, *, clients: int = 4,
                 progress: int = 150, pace_ms: float = 1.0, keep: bool = False, clone: bool = False, log=None):
        self.shape, self.seed, self.faults, self.examples = shape, seed, faults, examples
        # With clone, the group's history is past its limit from the start:
        # every member that joins again is restored from a checkpoint of the
        # primary (llft/cluster/checkpoint_join.py).
        self.member_options = ["--history-limit", CLONE_HISTORY_LIMIT_MIB] if clone else []
        self.clients, self.progress, self.pace_s, self.keep = clients, progress, pace_ms / 1000, keep
        self.work_dir = work_dir
        self.rng = random.Random(seed)
        self.result = ShapeResult(shape.name, seed, work_dir)
        self.log = log or (lambda record: None)

    def run(self) -> ShapeResult:
        """The faults, FAULTS_PER_GROUP to a group: a member that rejoins
        gets its group's whole history by state transfer (which grows with
        every operation), or with clone a checkpoint of the primary."""
        return run_in_groups(self.result, self.faults, FAULTS_PER_GROUP, self.keep,
                             lambda g: self.work_dir / f"{self.shape.name}-hosts-{self.seed}-{g}", self._run_group)

    def _run_group(self, faults: int):
        r = self.result
        if r.run_dir.exists():
            shutil.rmtree(r.run_dir)
        workload = None
        try:
            with ExitStack() as stack:
                c = Cluster(stack, r.run_dir, self.shape, self.examples, member_options=self.member_options)
                c.start()
                gw_ns = c.hosts[MEMBERS][0]
                workload = Workload(self.shape.protocol, self.clients, "127.0.0.1", PORT, self.pace_s,
                                    setup=lambda: hosts.enter(gw_ns))
                for _ in range(faults):
                    n = r.injected
                    kind = self.rng.choice(sorted(KINDS))
                    if not workload.wait_replies(self.progress, PROGRESS_TIMEOUT_S):
                        raise GroupLost(f"the clients made no progress before fault {n + 1} ({kind})")
                    start = time.monotonic()
                    what = inject(c, kind, self.rng)
                    r.injected += 1
                    c.wait_whole(f"the group to be whole again after fault {n + 1} ({kind})")
                    r.survived += 1
                    self.log({"shape": f"{self.shape.name}@hosts", "seed": self.seed, "fault": n + 1, "kind": kind,
                              "what": what, "recovered_ms": round((time.monotonic() - start) * 1000, 1),
                              "replies": workload.replies})
                r.verdict.add(check(workload.stop(), self.shape.protocol.global_count))
                workload = None
                self._shut_down(c, gw_ns)
        except (GroupLost, hosts.HostsError) as e:
            r.group_lost = str(e)
        finally:
            if workload is not None:
                r.verdict.add(check(workload.stop(timeout=5), self.shape.protocol.global_count))

    def _shut_down(self, c: Cluster, gw_ns: str):
        import threading
        done = threading.Event()

        def shut():
            hosts.enter(gw_ns)
            conn = Connection("127.0.0.1", PORT, 30)
            try:
                self.shape.protocol(10_000).shutdown(conn)
                try:
                    conn.f.read()
                except OSError:
                    pass
            finally:
                conn.close()
                done.set()
        threading.Thread(target=shut, daemon=True).start()
        done.wait(60)
        for host, (p, d) in c.members.items():
            try:
                if p.wait(60) != 0:
                    self.result.problems.append(f"host {host}'s member exited {p.returncode}")
            except subprocess.TimeoutExpired:
                self.result.problems.append(f"host {host}'s member did not end after the program's shutdown")
        outs = [(c.status(d) or {}).get("replicas", [{}])[0].get("outputs") for _, d in c.members.values()]
        if any(o != outs[0] for o in outs[1:]):
            self.result.problems.append("the members' replicas sent different bytes")
