"""llft-nemesis --fuzz: bad datagrams (fuzz.py) against a live group
across hosts while checkable clients go on; then what must hold: no
member, replica or gateway crashed, the view is the one before, every
client's answers are right, and the forged "SET stolen" was never
applied.  The drops the members and the gateway counted, and the
datagrams their kernels dropped unread, are reported beside what was
sent."""
from __future__ import annotations

import random
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from llft import rundir
from llft.nemesis import fuzz, hosts
from llft.nemesis.cluster import MEMBERS, PORT, Cluster
from llft.nemesis.faults import GroupLost
from llft.nemesis.history import Verdict, check
from llft.nemesis.protocols import Connection
from llft.nemesis.shapes import SHAPES
from llft.nemesis.workload import Workload

CAPTURE_S = 2.0
# What a bad datagram is counted as (llft/ordering/llmp/wire.py DropReason): not the
# drops a busy group counts on its own (reassembly timeouts, stale views).
DROP_REASONS = ("bad-mac", "bad-version", "foreign-group", "malformed", "truncated", "unknown-type")


@dataclass
class FuzzResult:
    seed: int
    run_dir: Path
    sent: dict[str, int] = field(default_factory=dict)
    bad_receptions: int = 0    # bad (not replayed) datagrams times the receivers each reached
    counted: dict[str, int] = field(default_factory=dict)   # drops by reason, members and gateway together
    kernel_drops: int = 0
    crashed: list[str] = field(default_factory=list)
    view_changed: str | None = None
    stolen: bool = False
    verdict: Verdict = field(default_factory=Verdict)
    group_lost: str | None = None

    @property
    def uncounted(self) -> int:
        """Receptions of bad datagrams (all but the replayed, which are the
        group's own) neither counted as dropped nor dropped unread by a
        kernel: what a receiver may have taken in."""
        return max(0, self.bad_receptions - sum(self.counted.get(k, 0) for k in DROP_REASONS) - self.kernel_drops)

    @property
    def ok(self) -> bool:
        return not (self.crashed or self.view_changed or self.stolen or self.group_lost or self.uncounted) \
            and self.verdict.ok


def drops(c: Cluster) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in [d for _, d in c.members.values()] + [c.gateway_dir]:
        for reason, n in (rundir.read_state(d).get("messaging", {}).get("drops") or {}).items():
            total[reason] = total.get(reason, 0) + n
    return total


def settled_drops(c: Cluster, timeout: float = 60.0) -> dict[str, int]:
    """The drops once the receivers have read what was sent: the same in
    two state files in a row (each is rewritten every second)."""
    last, end = drops(c), time.monotonic() + timeout
    while time.monotonic() < end:
        time.sleep(2.2)
        now = drops(c)
        if now == last:
            break
        last = now
    return last


def kernel_drops(ns_list: list[str]) -> int:
    """Datagrams the kernels of these hosts dropped before any program read
    them: full socket buffers (UDP RcvbufErrors, InErrors) and interface
    queues (receive and transmit drops in /proc/net/dev)."""
    import subprocess
    n = 0
    for ns in ns_list:
        snmp = subprocess.run(hosts.in_ns(ns, "cat", "/proc/net/snmp"), capture_output=True, text=True).stdout
        lines = [line.split() for line in snmp.splitlines() if line.startswith("Udp:")]
        if len(lines) == 2:
            row = dict(zip(lines[0][1:], lines[1][1:]))
            n += int(row.get("InErrors", 0))
        dev = subprocess.run(hosts.in_ns(ns, "cat", "/proc/net/dev"), capture_output=True, text=True).stdout
        for line in dev.splitlines()[2:]:
            fields = line.split(":", 1)[1].split()
            n += int(fields[3]) + int(fields[11])   # receive drop, transmit drop
    return n


def run(count: int, seed: int, work_dir: Path, examples: Path, rate: float = 15000.0, clients: int = 4,
        keep: bool = False) -> FuzzResult:
    rng = random.Random(seed)
    r = FuzzResult(seed, work_dir / f"fuzz-{seed}")
    if r.run_dir.exists():
        shutil.rmtree(r.run_dir)
    shape = SHAPES["kv"]
    try:
        with ExitStack() as stack:
            c = Cluster(stack, r.run_dir, shape, examples, spare=1)
            c.start()
            gw_ns, fuzz_ns = c.hosts[MEMBERS][0], c.hosts[MEMBERS + 1][0]
            before = {h: rundir.read_state(d) for h, (_, d) in c.members.items()}
            view = {h: (s["view"]["pvn"], sorted(m["member"] for m in s["members"])) for h, s in before.items()}
            gid = before[0]["group_id"]
            gw_gid = rundir.read_state(c.gateway_dir)["group_id"]
            workload = Workload(shape.protocol, clients, "127.0.0.1", PORT, 0.001, setup=lambda: hosts.enter(gw_ns))
            if not workload.wait_replies(100, 60):
                raise GroupLost("the clients made no progress")
            captured = fuzz.capture(fuzz_ns, [gid, gw_gid], 2000, CAPTURE_S)
            if not all(captured.values()):
                raise GroupLost("heard none of a group's traffic to replay")
            every_ns = [ns for ns, _ in c.hosts] + [hosts.switch_of(c.hosts)]
            counted_before, kernel_before = drops(c), kernel_drops(every_ns)
            sent: dict[tuple[str, int], int] = {}
            fuzz.send(fuzz_ns, fuzz.bad_datagrams(rng, captured), count, rate, sent)
            receivers = {gid: MEMBERS, gw_gid: 1}   # every member hears the group's address; the gateway its own
            for (category, g), n in sent.items():
                r.sent[category] = r.sent.get(category, 0) + n
                if category != "replayed":
                    r.bad_receptions += n * receivers[g]
            after = settled_drops(c)
            r.counted = {k: after.get(k, 0) - counted_before.get(k, 0) for k in after
                         if after.get(k, 0) != counted_before.get(k, 0)}
            r.kernel_drops = kernel_drops(every_ns) - kernel_before
            r.verdict = check(workload.stop(), shape.protocol.global_count)
            for h, (p, d) in c.members.items():
                s = rundir.read_state(d)
                if p.poll() is not None:
                    r.crashed.append(f"host {h}'s member exited {p.returncode}")
                elif not s["replicas"] or s["replicas"][0].get("status") is not None:
                    r.crashed.append(f"host {h}'s replica ended")
                elif (s["view"]["pvn"], sorted(m["member"] for m in s["members"])) != view[h]:
                    r.view_changed = f"host {h}: view {view[h]} became {s['view']['pvn']}"
            if c.gateway.poll() is not None:
                r.crashed.append(f"the gateway exited {c.gateway.returncode}")
            r.stolen = asked_stolen(gw_ns)
    except (GroupLost, hosts.HostsError) as e:
        r.group_lost = str(e)
    if r.ok and not keep:
        shutil.rmtree(r.run_dir, ignore_errors=True)
    return r


def asked_stolen(gw_ns: str) -> bool:
    """Whether the forged requests' key exists in the group's program."""
    import threading
    answer: list[bytes] = []

    def ask():
        hosts.enter(gw_ns)
        conn = Connection("127.0.0.1", PORT, 30)
        try:
            answer.append(conn.ask(b"GET stolen\n"))
        finally:
            conn.close()
    t = threading.Thread(target=ask)
    t.start()
    t.join()
    return not answer or answer[0] != b"NONE\n"
