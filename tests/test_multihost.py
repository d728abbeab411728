"""A group whose replicas are on several hosts (network namespaces on one
bridge): `llft-run --join` on three hosts, `llft-gateway` on a fourth, real
clients, everything over the messaging protocol on UDP multicast."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import tool
from llft.nemesis import hosts
from llft.serving.stream_digest import StreamDigest
from netns import bridged_hosts, drop_randomly, in_ns
from serving import Progress, concurrently, cpu_share

PROGRAM_PORT = 7000


class Cluster:
    """Members and a gateway, each a real process in its namespace."""

    def __init__(self, hosts, tmp: Path):
        self.hosts, self.tmp = hosts, tmp
        self.key = tmp / "group.key"
        subprocess.run([tool("llft-gateway"), "--make-key", str(self.key)], check=True, capture_output=True)
        self.procs: list[subprocess.Popen] = []
        self.labels: dict[subprocess.Popen, str] = {}
        self.members: list[tuple[subprocess.Popen, Path]] = []

    def _start(self, host: int, argv: list, env: dict | None = None) -> subprocess.Popen:
        p = subprocess.Popen(in_ns(self.hosts[host][0], *argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ, **env) if env else None)
        self.procs.append(p)
        self.labels[p] = f"host {host}: {Path(argv[0]).name}"
        return p

    def start_member(self, host: int, program: list, group: str = "kv", extra=(), env: dict | None = None,
                     prefix=()):
        """llft-run --join on host (prefix: a command that runs it)."""
        run_dir = self.tmp / f"member-{host}"
        p = self._start(host, [*prefix, tool("llft-run"), "--join", "--group", group, "--key-file", self.key,
                               "--run-dir", run_dir, "--log-level", "info", *extra, "--", *program], env)
        self.members.append((p, run_dir))
        return run_dir

    def start_members(self, n: int, program: list, extra=(), env: dict | None = None) -> Path:
        """Members on hosts 0..n-1: the first founds the group, the others
        join it; returns the first's run dir."""
        first = self.start_member(0, program, extra=extra, env=env)
        self.wait(lambda: (s := self.status(first)) and s["members"], "the first member")
        for host in range(1, n):
            self.start_member(host, program, extra=extra, env=env)
        self.wait_members(n)
        return first

    def start_gateway(self, host: int, group: str = "kv", port: int = PROGRAM_PORT, extra=(), name="gateway"):
        """A gateway; the first (name "gateway") is the one clients use by default.  Returns its run dir."""
        run_dir = self.tmp / name
        p = self._start(host, [tool("llft-gateway"), "--group", group, "--port", port, "--log-level", "info",
                               "--key-file", self.key, "--run-dir", run_dir, *extra])
        if name == "gateway":
            self.gateway, self.gateway_dir, self.gateway_host = p, run_dir, host
        self.wait(lambda: self.status(run_dir) is not None, f"the {name} to start")
        return run_dir

    def status(self, run_dir: Path) -> dict | None:
        r = subprocess.run([tool("llft-status"), "--run-dir", str(run_dir), "--json"], capture_output=True,
                           text=True, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def wait(self, cond, what: str, timeout: float = 30, watch: bool = True):
        """Polls cond; with watch, any of our processes ending fails the wait."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for p in self.procs if watch else ():
                if p.poll() is not None:
                    raise AssertionError(f"a process ended early ({p.returncode}) waiting for {what}: "
                                         f"{p.args} {p.stderr.read()[-3000:]}")
            if cond():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_members(self, n: int):
        def all_see_n():
            views = [self.status(d) for _, d in self.members]
            return all(v and len(v["members"]) == n for v in views)
        self.wait(all_see_n, f"every member to see {n} members")

    def kill(self, *args) -> str:
        """llft-kill with every member's run dir; returns what it printed."""
        dirs = [x for _, d in self.members for x in ("--run-dir", str(d))]
        r = subprocess.run([tool("llft-kill"), *dirs, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def client(self) -> "ClientConn":
        """A client connection from the gateway's host (a shell in its namespace)."""
        return ClientConn(self.hosts[self.gateway_host][0])

    def stop(self):
        hosts.stop_processes(self.procs)

    def states(self) -> str:
        """Every member's and gateway's llft-status --json, one per line."""
        dirs = sorted({d for _, d in self.members} | set(self.tmp.glob("gateway*")))
        return "\n".join(f"--- {d.name}: {json.dumps(self.status(d))}" for d in dirs)

    def logs(self, tail: int = 6000) -> str:
        """What each process logged (the end of it), once all have ended; a
        test that read a process's log itself leaves it empty here."""
        def end_of(p):
            try:
                return p.stderr.read()[-tail:] if p.stderr else ""
            except ValueError:   # (closed by the test)
                return ""
        return "\n".join(f"--- {self.labels.get(p, p.args[4:])} (exit {p.returncode}) ---\n{end_of(p)}"
                         for p in self.procs)


class ClientConn:
    """A line client inside a namespace: a tiny Python process relaying lines
    (the test process itself lives in the root namespace)."""

    SCRIPT = ("import socket,sys\n"
              "s=socket.create_connection(('127.0.0.1',%d),timeout=60);f=s.makefile('rwb')\n"
              "for line in sys.stdin.buffer:\n"
              " f.write(line);f.flush();r=f.readline();sys.stdout.buffer.write(r);sys.stdout.flush()\n"
              " if not r: break\n")

    def __init__(self, ns: str, port: int = PROGRAM_PORT):
        import sys
        self.port = port
        self.p = subprocess.Popen(in_ns(ns, sys.executable, "-c", self.SCRIPT % port), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)

    def lines(self, lines: list[str]) -> tuple[list[str], bytes]:
        raw = b""
        replies = []
        for line in lines:
            self.p.stdin.write(line.encode() + b"\n")
            self.p.stdin.flush()
            r = self.p.stdout.readline()
            raw += r
            replies.append(r.decode().rstrip("\n"))
        return replies, raw

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


class DatagramClient(ClientConn):
    """A UDP client inside a namespace: each line goes out as one datagram to
    the gateway's UDP port, and its one reply comes back as a line."""

    SCRIPT = ("import socket,sys\n"
              "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(60);s.connect(('127.0.0.1',%d))\n"
              "for line in sys.stdin.buffer:\n"
              " s.send(line.rstrip(b'\\n'))\n"
              " try: r=s.recv(70000)\n"
              " except OSError: break\n"
              " sys.stdout.buffer.write(r+b'\\n');sys.stdout.flush()\n")


@pytest.fixture
def cluster_of(tmp_path, request):
    """cluster_of(n): a Cluster on n hosts, torn down after the test; if the
    test failed, every process's log is printed (it shows in the report)."""
    from contextlib import ExitStack
    clusters = []
    with ExitStack() as stack:
        def make(n: int) -> Cluster:
            c = Cluster(stack.enter_context(bridged_hosts(n)), tmp_path)
            stack.callback(c.stop)
            clusters.append(c)
            return c
        yield make
        failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
        for c in clusters if failed else ():
            print(c.states())            # while the processes still run
    for c in clusters if failed else ():
        print(c.logs())


@pytest.fixture
def cluster(cluster_of):
    return cluster_of(4)


def stream_digest(data: bytes) -> str:
    """What a member's relay says of a connection's output (llft/serving/stream_digest.py)."""
    d = StreamDigest()
    d.update(data)
    return d.hexdigest()


def outputs_of(status: dict) -> dict:
    return status["replicas"][0]["outputs"]


def test_three_hosts_and_a_gateway(cluster, examples):
    program = [examples / "kv_server", PROGRAM_PORT]
    first = cluster.start_member(0, program)
    cluster.wait(lambda: (s := cluster.status(first)) and s["members"]
                 and s["members"][0]["role"] == "primary", "the first member to found the group")
    for host in (1, 2):
        cluster.start_member(host, program)
    cluster.wait_members(3)
    views = [cluster.status(d) for _, d in cluster.members]
    assert len({json.dumps(v["members"], sort_keys=True) for v in
                ({**s, "members": [{k: m[k] for k in ("member", "role", "precedence", "rank")}
                                   for m in s["members"]]} for s in views)}) == 1, "one view everywhere"
    assert [m["rank"] for m in views[0]["members"]] == [1, 2, 3]
    assert [s["replicas"][0]["role"] for s in views] == ["primary", "backup", "backup"]

    cluster.start_gateway(3)
    results = {}

    def client(i):
        c = cluster.client()
        results[i] = c.lines([f"SET k{i}-{j} v{j}" if j % 3 else f"GET k{i}-{j - 1}" for j in range(60)])
        c.close()

    concurrently(client, 4)
    c = cluster.client()
    final, final_raw = c.lines(["DIGEST", "SHUTDOWN"])
    c.close()
    for i, (replies, _) in results.items():
        assert len(replies) == 60 and all(r in ("OK", "NONE") or r.startswith("VALUE") for r in replies), replies
    assert final[0].startswith("DIGEST ") and final[0].split()[2] == str(4 * 40) and final[1] == "BYE"

    # The program ended at the primary; every member ends with its status.
    for p, _ in cluster.members:
        assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
    # Every replica generated, byte for byte, what the primary sent the clients.
    outs = [outputs_of(cluster.status(d)) for _, d in cluster.members]
    assert len(outs[0]) == 5 and outs[1] == outs[0] and outs[2] == outs[0]
    sent = sorted(v["sha256"] for v in outs[0].values())
    assert sent == sorted(stream_digest(raw) for raw in [r for _, r in results.values()] + [final_raw])

    cluster.wait(lambda: cluster.status(cluster.gateway_dir)["gateway"]["connections"] == 5,
                 "the gateway's state", watch=False)
    assert cluster.status(cluster.gateway_dir)["drops"] == {}


FORGER = """
import os, socket, sys
from llft.auth import Keyring
from llft.cluster.naming import group_id
from llft.ordering.llmp.messaging.fragments import split
from llft.transport import group_multicast_address
from llft.ordering.llmp import wire
gid = group_id("kv")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dest = (group_multicast_address(gid), 17400)
wrong = Keyring(os.urandom(32))
forged = [wire.make(wire.MsgType.PROPOSE_PRIMARY, src_group=gid, dst_group=gid, role=2, sender=7, pvn=99,
                    precedence=99, body={"primary": 7}),
          wire.make(wire.MsgType.ACCEPT_BACKUP, src_group=gid, dst_group=gid, role=2, sender=7, pvn=1,
                    precedence=99, body={"member": 7, "view": {"primary": 7, "pvn": 1, "prec": [[7, 1]]}}),
          wire.make(wire.MsgType.REMOVE_BACKUP, src_group=gid, dst_group=gid, role=2, sender=7, pvn=1,
                    precedence=1, body={"round": 1, "removed": [], "view": {"primary": 7, "pvn": 1, "prec": [[7, 1]]}}),
          wire.make(wire.MsgType.REQUEST, src_group=4242, dst_group=gid, conn_seq=1, role=0, sender=1, msn=1,
                    payload=b"SET stolen 1\\n")]
for i in range(50):
    for m in forged:
        for d in split(wrong, gid, wire.encode_message(m), 1472):
            s.sendto(d, dest)              # well-formed, but not MACed with the group's key
    s.sendto(os.urandom(i * 7 % 1400 + 1), dest)       # garbage
    s.sendto(b"LL" + os.urandom(40), dest)             # our magic, then garbage
"""


def test_two_gateways_serve_one_group_at_once(cluster, examples):
    """Clients through two gateways at once, each opening connection after
    connection: the two gateways' connections reach each member in the
    order messaging delivered them there, which differs between members; a
    backup's program accepts the very connections the primary's accepted,
    in the primary's order (the shim keeps a connection that came early
    until the accept the primary made of it), and every replica agrees.
    A quarter of what one backup's host receives is lost, so that it gets
    the two gateways' connections in another order than the primary."""
    start_three(cluster, examples, extra=["--fault-timeout", "300"])
    drop_randomly(cluster.hosts[2][0], [17400], 25)
    cluster.start_gateway(3, port=PROGRAM_PORT + 1, extra=["--program-port", PROGRAM_PORT], name="gateway2")
    results = {}

    def client(i):
        got = []
        for n in range(8):
            c = ClientConn(cluster.hosts[3][0], PROGRAM_PORT + i % 2)
            got += c.lines([f"SET g{i}-{n} v{n}", f"GET g{i}-{n}"])[0]
            c.close()
        results[i] = got

    concurrently(client, 6)
    assert all(got == [r for n in range(8) for r in ("OK", f"VALUE v{n}")] for got in results.values()), results
    survivors_agree_and_end(cluster, [0, 1, 2], 48)


def start_two(cluster, examples) -> Path:
    """kv_server members on hosts 0 (the first, primary) and 1, and the
    gateway on host 3; returns the first's run dir."""
    first = cluster.start_members(2, [examples / "kv_server", PROGRAM_PORT])
    cluster.start_gateway(3)
    return first


def test_forged_and_garbage_datagrams_are_counted_and_change_nothing(cluster, examples):
    start_two(cluster, examples)
    c = cluster.client()
    assert c.lines(["SET a 1"])[0] == ["OK"]
    import sys
    subprocess.run(in_ns(cluster.hosts[3][0], sys.executable, "-c", FORGER), check=True, timeout=60)
    assert c.lines(["GET a", "GET stolen"])[0] == ["VALUE 1", "NONE"], "the group still serves, unforged"

    # A member joining once clients are served gets the group's log as its state and catches up.
    cluster.start_member(2, [examples / "kv_server", PROGRAM_PORT])
    cluster.wait_members(3)
    assert c.lines(["SET b 2", "GET a", "GET b"])[0] == ["OK", "VALUE 1", "VALUE 2"]

    def all_counted(drops: dict) -> bool:
        return drops.get("bad-mac", 0) >= 50 * 4 and \
            drops.get("malformed", 0) + drops.get("truncated", 0) + drops.get("bad-version", 0) >= 50

    for _, run_dir in cluster.members[:2]:
        # llft-status is rewritten once a second: it may first show only some of the drops.
        cluster.wait(lambda: all_counted(cluster.status(run_dir)["drops"]), "llft-status to show the drops")
        st = cluster.status(run_dir)
        assert [m["precedence"] for m in st["members"]] == [1, 2, 3], "forged messages changed the membership"
        assert st["view"]["pvn"] == 1
        text = subprocess.run([tool("llft-status"), "--run-dir", str(run_dir)], capture_output=True,
                              text=True).stdout
        assert "dropped: " in text and "bad-mac" in text, text
        assert "dropped datagrams" in (run_dir / "llft.log").read_text()
    c.close()
    survivors_agree_and_end(cluster, [0, 1, 2], 2)


def kill_primary_mid_workload(cluster, examples, members: int, extra=(), clients: int = 3, requests: int = 150,
                              allow_excluded: bool = False, after_kill=None):
    """members replicas on hosts 0..members-1, the gateway on the next host;
    the primary's replica is SIGKILLed while clients write.  Checks that
    every acknowledged write survives exactly once, that no client
    connection drops, that the survivors agree on one new view and one
    primary, and that they produce the same output.  Returns the survivors'
    states."""
    first = cluster.start_members(members, [examples / "kv_server", PROGRAM_PORT], extra)
    cluster.start_gateway(members)
    old = cluster.status(first)
    old_primary = old["members"][0]["member"]
    replica_pid = old["replicas"][0]["pid"]
    results = {}

    def client(i):
        c = cluster.client()
        out = []
        for j in range(requests):
            if i == 0 and j == requests // 3:
                os.kill(replica_pid, signal.SIGKILL)    # the primary fails mid-stream
                if after_kill:
                    after_kill()
            out.append(c.lines([f"SET k{i}-{j} v{j}"])[0][0])
        results[i] = out + c.lines([f"GET k{i}-{j}" for j in range(requests)])[0]
        c.close()

    concurrently(client, clients)
    for i, replies in results.items():
        assert replies[:requests] == ["OK"] * requests, f"client {i}: {replies[:requests]}"
        assert replies[requests:] == [f"VALUE v{j}" for j in range(requests)], "an acknowledged write was lost"
    if "--no-rejoin" in extra:
        assert cluster.members[0][0].wait(timeout=30) == 128 + 9

    survivors = [d for p, d in cluster.members[1:] if p.poll() is None]
    for p, d in cluster.members[1:]:
        if p.poll() is not None:   # left the group: only if the protocol excluded it, and it said so
            assert allow_excluded and p.returncode == 3, (p.returncode, p.stderr.read()[-2000:])
    assert survivors, "nobody survived"
    views = [cluster.status(d) for d in survivors]
    assert len({json.dumps(v["view"]) for v in views}) == 1, [v["view"] for v in views]
    view = views[0]["view"]
    assert view["pvn"] >= 2 and view["primary"] != old_primary
    assert [s["replicas"][0]["role"] for s in views].count("primary") == 1, "one primary"
    for v in views:
        assert [m["member"] for m in v["members"]][0] == view["primary"]
        assert old_primary not in [m["member"] for m in v["members"]]
    # Idle now.  The new primary's controller, at real-time priority, once
    # spun on its ring (left closed by PROMOTE) and starved the host.
    new_primary = next(v for v in views if v["replicas"][0]["role"] == "primary")
    assert cpu_share(new_primary["controller_pid"]) < 0.5, "the new primary's controller is busy while idle"
    c = cluster.client()
    digest = c.lines(["DIGEST", "SHUTDOWN"])[0]
    c.close()
    assert digest[0].split()[2] == str(clients * requests) and digest[1] == "BYE"
    for p, d in cluster.members[1:]:
        if d in survivors:
            assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
    outs = [outputs_of(cluster.status(d)) for d in survivors]
    assert all(o == outs[0] for o in outs), "a backup left did not produce what the new primary did"
    cluster.wait(lambda: cluster.status(cluster.gateway_dir)["gateway"]["connections"] == clients + 1,
                 "the gateway to count every client connection, none dropped", watch=False)
    return views


def test_primary_host_fails_and_a_backup_takes_over(cluster, examples):
    views = kill_primary_mid_workload(cluster, examples, members=3, extra=["--no-rejoin"])
    assert views[0]["view"]["pvn"] == 2
    assert views[0]["view"]["primary"] == views[0]["members"][0]["member"]


def test_a_new_primary_waits_for_a_slow_gateway(cluster, examples):
    """The gateway is stopped for a second as the primary dies: the new
    primary must have its answer to NewPrimaryView (the old primary's
    ordering information it alone may hold, for replies its clients saw)
    before it takes over.  It took over without it after half a second,
    and a loaded machine left a group with answers repeated and lost."""
    def freeze_gateway():
        os.kill(cluster.gateway.pid, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(cluster.gateway.pid, signal.SIGCONT)
    kill_primary_mid_workload(cluster, examples, members=3, extra=["--no-rejoin"], after_kill=freeze_gateway)
    logs = "".join((d / "llft.log").read_text() for _, d in cluster.members[1:])
    assert "did not answer NewPrimaryView" not in logs
    assert "took over as primary" in logs


def test_competing_proposals_end_with_one_primary(cluster_of, examples):
    """Both backups suspect the primary at the same moment (no step between
    ranks): their ProposePrimary messages compete; one view, one primary."""
    kill_primary_mid_workload(cluster_of(4), examples, members=3, extra=["--fault-timeout-step", "0", "--no-rejoin"])


def test_failover_with_20_percent_loss_on_every_link(cluster_of, examples):
    cluster = cluster_of(4)
    for ns, _ in cluster.hosts:
        drop_randomly(ns, [17400], 20)
    # A longer fault timeout: with 20% loss, three Heartbeats in a row go missing now and then.
    # A backup whose acknowledgments keep getting lost may be excluded (MAX_COUNT): it must leave, and the
    # rest must go on with nothing lost.
    kill_primary_mid_workload(cluster, examples, members=3, extra=["--fault-timeout", "300", "--no-rejoin"],
                              requests=60, allow_excluded=True)


def start_three(cluster, examples, extra=()):
    program = [examples / "kv_server", PROGRAM_PORT]
    first = cluster.start_member(0, program, extra=extra)
    cluster.wait(lambda: (s := cluster.status(first)) and s["members"], "the first member")
    for host in (1, 2):
        cluster.start_member(host, program, extra=extra)
    cluster.wait_members(3)
    cluster.start_gateway(3)
    return cluster.status(first)


def new_view_at(cluster, indices, old_primary):
    """Waits until the members at these indices agree on a newer view without old_primary."""
    def agreed():
        views = [cluster.status(cluster.members[k][1])["view"] for k in indices]
        return all(v["pvn"] >= 2 and v["primary"] != old_primary for v in views) and \
            len({json.dumps(v) for v in views}) == 1
    cluster.wait(agreed, "a new view", watch=False)


# What a woken or healed old primary may log on learning of the newer view: the
# new primary's Heartbeat, or a proposal of the election it slept through
# (still in its socket buffer), whichever it reads first.
SUPERSEDED = ("which replaces ours", "without this member")


def rejoined(cluster, k: int, old_member: int, why: tuple[str, ...] = SUPERSEDED, who: str = "the old primary"):
    """Member k reset (it logged one of the reasons in why) and joined again as a backup under a new identity."""
    cluster.wait(lambda: (st := cluster.status(cluster.members[k][1])) and st["member"] != old_member
                 and st["replicas"] and st["replicas"][0]["role"] == "backup" and len(st["members"]) == 3,
                 f"{who} to reset and rejoin", timeout=60)
    cluster.wait_members(3)
    text = (cluster.members[k][1] / "llft.log").read_text()
    left = [line for line in text.splitlines() if "leaves the group" in line]
    assert any(w in line for line in left for w in why) and "resetting and rejoining" in text, left


def writes_then_reads(cluster, tag: str, n: int) -> None:
    c = cluster.client()
    assert c.lines([f"SET {tag}{j} v{j}" for j in range(n)])[0] == ["OK"] * n
    assert c.lines([f"GET {tag}{j}" for j in range(n)])[0] == [f"VALUE v{j}" for j in range(n)]
    c.close()


def numbering_agrees(cluster, indices):
    """Every member generates the very messages its primary does, under the
    same msgSeqNums (a member that joined late, too: it cuts its replica's
    output where the primary cut it before the join)."""
    def generated():
        return [cluster.status(cluster.members[k][1])["generated"] for k in indices]

    def same():
        gs = generated()
        return all(g == gs[0] for g in gs)
    try:
        cluster.wait(same, "the same msgSeqCounts everywhere", timeout=20, watch=False)
    except AssertionError:
        raise AssertionError(f"messages generated per connection, by member: {generated()}") from None


def survivors_agree_and_end(cluster, indices, expected_keys: int):
    numbering_agrees(cluster, indices)
    c = cluster.client()
    digest = c.lines(["DIGEST", "SHUTDOWN"])[0]
    c.close()
    assert digest[0].split()[2] == str(expected_keys) and digest[1] == "BYE"
    for k in indices:
        p, _ = cluster.members[k]
        assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
    outs = [outputs_of(cluster.status(cluster.members[k][1])) for k in indices]
    assert all(o == outs[0] for o in outs), "the survivors did not produce the same output"


# Short client connections, one after another, from one process in the gateway's host.
SHORT_CONNECTIONS = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"SET short%d v%d\n" % (i, i))
        f = s.makefile("rb")
        assert f.readline() == b"OK\n", i
"""


def test_many_short_connections_are_retired_and_the_group_stays_calm(cluster, examples):
    """A connection both sides ended leaves messaging (llft/ordering/llmp/messaging/retire.py).
    Before, every connection ever made stayed, visited on every tick and kept
    alive with a KeepAlive every 50 ms: after ~400 short connections the
    primary missed its Heartbeats and the group failed over again and again."""
    old = start_three(cluster, examples)["members"][0]["member"]
    n = 600
    r = subprocess.run(in_ns(cluster.hosts[cluster.gateway_host][0], "python3", "-c", SHORT_CONNECTIONS,
                             PROGRAM_PORT, n), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    views = [cluster.status(d)["view"] for _, d in cluster.members]
    assert all(v == {"pvn": 1, "primary": old} for v in views), f"the group failed over: {views}"

    def retired():
        states = [cluster.status(d) for d in [*(d for _, d in cluster.members), cluster.gateway_dir]]
        return all(st["messaging"]["connections"] <= 3 for st in states)
    cluster.wait(retired, "the finished connections to be retired", timeout=30)
    c = cluster.client()
    assert c.lines(["DIGEST"])[0][0].split()[2] == str(n)
    c.close()
    numbering_agrees(cluster, [0, 1, 2])

    def outputs_agree():   # (each replica closes the last connection in its own time)
        outs = [outputs_of(cluster.status(d)) for _, d in cluster.members]
        return outs[0].get("closed", {}).get("connections") == n + 1 and all(o == outs[0] for o in outs)
    try:
        cluster.wait(outputs_agree, "the replicas' outputs to agree", timeout=20, watch=False)
    except AssertionError:
        raise AssertionError(f"outputs by member: {[outputs_of(cluster.status(d)) for _, d in cluster.members]}") \
            from None
    # Past 256 connections a member keeps the open ones' output logs only.
    assert all(cluster.status(d)["replicas"][0]["outputs_kept"] == 0 for _, d in cluster.members)


def test_partition_then_heal_one_branch_survives(cluster, examples):
    old = start_three(cluster, examples)["members"][0]["member"]
    writes_then_reads(cluster, "before", 30)
    assert "partitioned replicas [0] from [1, 2]" in cluster.kill("--partition", "0 / 1,2")
    new_view_at(cluster, [1, 2], old)
    writes_then_reads(cluster, "during", 30)      # served by the branch the gateway follows: the new view
    assert "healed" in cluster.kill("--heal")
    # The old primary hears a primary of a newer view and higher precedence: it resets and rejoins.
    rejoined(cluster, 0, old)
    writes_then_reads(cluster, "after", 30)
    survivors_agree_and_end(cluster, [0, 1, 2], 90)


def test_a_primary_steps_down_for_a_membership_it_never_knew(cluster, examples):
    """Two memberships, the older never told of the newer's members: A
    (primary) is cut off from B, B takes over, D joins B's group (A never
    hears of D), then A can hear D but not B.  D's messages name a primary
    of higher precedence in a newer view: A must step down and rejoin,
    though it never knew D (the soak across hosts had two primaries serve
    side by side when a backup missed a newcomer's admission)."""
    first = start_two(cluster, examples)
    program = [examples / "kv_server", PROGRAM_PORT]
    a = cluster.status(first)
    old = a["members"][0]["member"]
    assert "partitioned replicas [0] from [1]" in cluster.kill("--partition", "0 / 1")
    cluster.wait(lambda: (st := cluster.status(cluster.members[1][1])) and st["view"]["pvn"] >= 2
                 and st["view"]["primary"] != old, "B to take over")
    os.kill(a["controller_pid"], signal.SIGSTOP)   # A hears nothing while D joins: D can join B's group only
    try:
        cluster.start_member(2, program)
        cluster.wait(lambda: (st := cluster.status(cluster.members[1][1])) and len(st["members"]) == 2
                     and (d := cluster.status(cluster.members[2][1])) and len(d["members"]) == 2,
                     "D to join B's group")
    finally:
        os.kill(a["controller_pid"], signal.SIGCONT)
    # A still cannot hear B; it hears D, a member it never knew, in view 2 of primary B.
    cluster.wait(lambda: "which replaces ours" in (cluster.members[0][1] / "llft.log").read_text(),
                 "A to step down for D's membership", timeout=60)


def test_a_backup_left_out_of_a_new_view_does_not_take_over_beside_it(cluster, examples):
    """B, the backup of lowest rank, misses the new view: cut off and
    stopped while A replaces the dead primary (A's proposal, which named
    B, went unanswered, so A took over without it).  Woken, B hears A as
    primary of view 2 before its own detector gives up on the old primary:
    it must leave, not propose itself for view 2 (a proposal that needs no
    one else's acknowledgment: only members ranked after it are asked) and
    serve beside A.  In the soak across hosts two primaries of one view
    served a gateway one after the other: answers repeated and lost."""
    # A fault timeout longer than llft-kill takes to install the partition:
    # with the default 30 ms the primary removed the stopped B before the
    # rules reached B's namespace, its RemoveBackup waited in B's socket
    # buffer, and A's proposal no longer named B (a loaded host took 90 ms
    # or more between namespaces).
    st = start_three(cluster, examples, extra=["--no-rejoin", "--fault-timeout", "300"])
    writes_then_reads(cluster, "before", 20)
    backups = [(cluster.status(d), p, d) for p, d in cluster.members[1:]]
    (_, _, a_dir), (b_st, b_proc, b_dir) = sorted(backups, key=lambda x: x[0]["replicas"][0]["index"])
    b_index = b_st["replicas"][0]["index"]
    others = ",".join(str(i) for i in range(3) if i != b_index)
    # Stopped first: cut off while running, B would give the primary up
    # after its own fault timeout and, asking nobody (ranked last), be the
    # primary of view 2 before the stop reached it (a slow host took longer
    # than that between the two); then healed, the two views' primaries
    # meet and the lower precedence leaves, as LLFT has it.
    os.kill(b_st["controller_pid"], signal.SIGSTOP)
    try:
        assert f"partitioned replicas [{b_index}]" in cluster.kill("--partition", f"{b_index} / {others}")
        os.kill(st["replicas"][0]["pid"], signal.SIGKILL)        # the primary's replica dies
        cluster.wait(lambda: (a := cluster.status(a_dir)) and a["view"]["pvn"] == 2
                     and a["replicas"][0]["role"] == "primary", "A to take over without B", watch=False)
        assert "healed" in cluster.kill("--heal")
        time.sleep(0.5)                                           # A's Heartbeats of view 2 wait at B
    finally:
        os.kill(b_st["controller_pid"], signal.SIGCONT)
    assert b_proc.wait(timeout=60) == 3, "B did not leave the group"
    log = (b_dir / "llft.log").read_text()
    assert "took over as primary" not in log, "B took over beside the primary of the new view"
    assert "which left this member out" in log or "without this member" in log, log[-2000:]
    writes_then_reads(cluster, "after", 20)


def test_frozen_primary_is_replaced_and_never_serves_again(cluster, examples):
    old = start_three(cluster, examples)["members"][0]["member"]
    writes_then_reads(cluster, "before", 30)
    assert "sent SIGSTOP" in cluster.kill("--primary", "--signal", "STOP")
    new_view_at(cluster, [1, 2], old)
    writes_then_reads(cluster, "during", 30)
    # Woken, it finds a newer primary view: what it sends in its old view is dropped, and it resets.
    cluster.kill("--replica", "0", "--signal", "CONT")
    rejoined(cluster, 0, old)
    writes_then_reads(cluster, "after", 30)
    survivors_agree_and_end(cluster, [0, 1, 2], 90)


def test_primary_whose_replica_alone_is_frozen_steps_down(cluster, examples):
    """SIGSTOP to the primary's replica only: its controller would go on
    heartbeating for a program that serves nobody.  It steps down once the
    replica has been stopped longer than the fault timeout, a backup takes
    over, and it resets and rejoins (its stopped replica killed)."""
    state = start_three(cluster, examples)
    old = state["members"][0]["member"]
    writes_then_reads(cluster, "before", 30)
    os.kill(state["replicas"][0]["pid"], signal.SIGSTOP)    # the replica this test's member started
    new_view_at(cluster, [1, 2], old)
    writes_then_reads(cluster, "during", 30)
    rejoined(cluster, 0, old, why=("its replica has been stopped for",))
    writes_then_reads(cluster, "after", 30)
    survivors_agree_and_end(cluster, [0, 1, 2], 90)


def primary_index(cluster) -> int:
    """The member whose replica is the primary, once exactly one state file
    says so of a live replica (they are rewritten every second)."""
    found = []

    def one():
        states = [cluster.status(d) for _, d in cluster.members]
        found[:] = [k for k, s in enumerate(states) if s and s["replicas"] and s["replicas"][0]["role"] == "primary"
                    and os.path.exists(f"/proc/{s['replicas'][0]['pid']}")]
        return len(found) == 1
    cluster.wait(one, "one live primary", watch=False)
    return found[0]


def kill_primary_replica(cluster) -> int:
    """SIGKILLs the primary's replica (its member lives on); returns the member's index."""
    k = primary_index(cluster)
    os.kill(cluster.status(cluster.members[k][1])["replicas"][0]["pid"], signal.SIGKILL)
    return k


def test_a_member_that_joined_after_a_takeover_settles_like_the_others(cluster, examples):
    """The primary dies; a backup takes over; the killed member rejoins (now
    of rank 3); the young primary dies too.  The older backup (rank 2) must
    take over, and the newcomer follow: for the first seconds after a
    takeover every backup waits the longer settling timeout, the newcomer
    too (AcceptBackup says how long), or with its rank's short timeout it
    would propose itself first and leave the rank-2 backup out."""
    start_three(cluster, examples)
    writes_then_reads(cluster, "before", 20)
    before = {k: cluster.status(d)["member"] for k, (_, d) in enumerate(cluster.members)}
    first = kill_primary_replica(cluster)
    rejoined(cluster, first, before[first], why=("was killed",))
    young = primary_index(cluster)
    older = next(k for k in range(3) if k not in (first, young))
    ids = {k: cluster.status(cluster.members[k][1])["member"] for k in range(3)}
    assert kill_primary_replica(cluster) == young
    cluster.wait(lambda: (st := cluster.status(cluster.members[older][1]))["replicas"]
                 and st["replicas"][0]["role"] == "primary", "the older backup to take over")
    for k in (first, older):   # neither left the group: the same identities
        assert cluster.status(cluster.members[k][1])["member"] == ids[k], f"member {k} was left out"
    rejoined(cluster, young, ids[young], why=("was killed",), who="the young primary")
    writes_then_reads(cluster, "after", 20)
    survivors_agree_and_end(cluster, [0, 1, 2], 40)


def test_a_newcomer_alone_takes_over_from_a_primary_that_served_nobody(cluster, examples):
    """The primary dies; the backup takes over and, before it has served a
    reply, the killed member rejoins in its view; then the young primary
    dies too.  The newcomer, alone, must take over: the gateway took its
    last replies in the first view, and the newcomer's lineage, inherited
    from the primary that admitted it, includes that view.  With only the
    views it was a member of, the gateway would refuse it (its view would
    not descend from the one whose replies the gateway took) and the group
    would be lost."""
    start_two(cluster, examples)
    writes_then_reads(cluster, "before", 20)
    ids = [cluster.status(d)["member"] for _, d in cluster.members]
    first = kill_primary_replica(cluster)
    young = 1 - first
    cluster.wait(lambda: (st := cluster.status(cluster.members[first][1])) and st["member"] != ids[first]
                 and st["replicas"] and st["replicas"][0]["role"] == "backup" and len(st["members"]) == 2,
                 "the killed member to rejoin", timeout=60)
    assert kill_primary_replica(cluster) == young
    cluster.wait(lambda: (st := cluster.status(cluster.members[first][1]))["replicas"]
                 and st["replicas"][0]["role"] == "primary", "the newcomer to take over")
    assert cluster.status(cluster.gateway_dir)["drops"].get("competing-view", 0) == 0
    writes_then_reads(cluster, "after", 20)
    cluster.wait_members(2)
    survivors_agree_and_end(cluster, [0, 1], 40)


def test_history_past_its_limit_is_dropped_and_newcomers_are_refused_clearly(cluster, examples):
    """State transfer replays the group's whole history, which every member
    keeps in memory: past --history-limit a member keeps no more of it
    (bounded memory under any traffic).  A newcomer then gets a checkpoint
    instead (the next test); where none can be taken (here: the primary's
    host has no CRIU), it is refused with a clear reason, and the group
    serves on."""
    extra = ["--history-limit", "0.05"]          # 52 KB
    program = [examples / "kv_server", PROGRAM_PORT]
    no_criu = {"LLFT_CRIU_PREFIX": str(cluster.tmp / "no-criu"), "PATH": "/usr/bin:/bin"}
    first = cluster.start_members(2, program, extra=extra, env=no_criu)
    cluster.start_gateway(3)
    value = "v" * 500
    c = cluster.client()
    assert c.lines([f"SET big{j} {value}" for j in range(200)])[0] == ["OK"] * 200   # 100 KB of requests
    c.close()
    for _, d in cluster.members:
        cluster.wait(lambda d=d: not cluster.status(d)["history"]["complete"], "the history to pass its limit")
        assert cluster.status(d)["history"]["bytes"] <= 52429
    late = cluster.start_member(2, program, extra=extra)
    p, _ = cluster.members[-1]
    assert p.wait(timeout=60) == 1
    err = p.stderr.read()
    assert "could not join group kv" in err and "history passed the limit of" in err, err
    assert "no checkpoint can stand for it: CRIU is not installed" in err, err
    assert "no new member can join" in subprocess.run([tool("llft-status"), "--run-dir", first], capture_output=True,
                                                      text=True).stdout
    cluster.members.remove((p, late))
    cluster.procs.remove(p)
    writes_then_reads(cluster, "after", 20)
    survivors_agree_and_end(cluster, [0, 1], 220)


def test_a_newcomers_state_goes_to_it_alone(cluster, examples):
    """The state a newcomer is admitted with (here 4 MB of history) goes
    to the newcomer alone, over TCP: a backup already in the group gets
    the small AcceptBackup, not the state (multicast, the state's
    fragments kept every member's loop busy past its fault timeout).  The
    newcomer replays it and agrees with the others."""
    program = [examples / "kv_server", PROGRAM_PORT]
    cluster.start_members(2, program)
    cluster.start_gateway(3)
    value = "v" * 1000
    c = cluster.client()
    for batch in range(20):
        assert c.lines([f"SET big{batch}-{j} {value}" for j in range(200)])[0] == ["OK"] * 200
    c.close()
    backup = cluster.members[1][1]

    def received():
        return cluster.status(backup)["messaging"]["counters"]["rx_bytes"]

    numbering_agrees(cluster, [0, 1])
    before = received()
    while True:   # until only Heartbeats arrive
        time.sleep(0.5)
        now = received()
        if now - before < 50_000:
            break
        before = now
    cluster.start_member(2, program)
    cluster.wait_members(3)
    numbering_agrees(cluster, [0, 1, 2])
    during = received() - before
    assert during < 1_000_000, f"the backup received {during} bytes while a 4 MB state was handed over"
    writes_then_reads(cluster, "after", 20)
    survivors_agree_and_end(cluster, [0, 1, 2], 4020)


KILLS_IN_A_ROW = 20


def write_until(cluster, i: int, stop, acked: dict, pause: float = 0.0, progress: Progress | None = None):
    """Writer i sets keys w{i}-0, w{i}-1, ... until stop is set, `pause`
    seconds apart; acked[i] gets how many were acknowledged (every one must be);
    each acknowledgement ticks `progress`."""
    c, n = cluster.client(), 0
    while not stop.is_set():
        assert c.lines([f"SET w{i}-{n} v{n}"])[0] == ["OK"], f"writer {i} request {n}"
        n += 1
        if progress:
            progress.tick()
        time.sleep(pause)
    acked[i] = n
    c.close()


def test_killed_primary_rejoins_under_writers_across_hosts(cluster, examples):
    """The primary is killed KILLS_IN_A_ROW times in a row; each time the
    killed member resets and rejoins with a fresh replica (state transfer by
    log) before the next kill; writers never stop; nothing acknowledged is
    lost and no writer's connection drops."""
    start_three(cluster, examples)
    import threading
    stop, acked = threading.Event(), {}

    def writer(i):
        # Paced: the group's history (requests and records, replayed by each
        # member that rejoins) must stay under --history-limit for the whole
        # test, the final reads included, or the last killed could not rejoin.
        write_until(cluster, i, stop, acked, pause=0.01)

    def kill_primaries():
        pvn = 1
        for _ in range(KILLS_IN_A_ROW):
            kill_primary_replica(cluster)

            def whole_again():
                sts = [cluster.status(d) for _, d in cluster.members]
                return all(s["view"]["pvn"] > pvn and len(s["members"]) == 3 and s["replicas"] for s in sts) and \
                    len({s["view"]["pvn"] for s in sts}) == 1
            cluster.wait(whole_again, "the group to be whole again after a kill", timeout=60)
            pvn = cluster.status(cluster.members[0][1])["view"]["pvn"]
        stop.set()

    concurrently(writer, 3, kill_primaries, timeout=600)
    assert len(acked) == 3 and all(n > 0 for n in acked.values()), acked
    c = cluster.client()
    for i, n in acked.items():
        assert c.lines([f"GET w{i}-{j}" for j in range(n)])[0] == [f"VALUE v{j}" for j in range(n)]
    c.close()
    survivors_agree_and_end(cluster, [0, 1, 2], sum(acked.values()))


UDP_MEMBER_OPTIONS = ["--no-rejoin"]


def start_udp_members(cluster, examples, n: int) -> Path:
    """udp_server members on hosts 0..n-1 (the first founds the group)."""
    return cluster.start_members(n, [examples / "udp_server", PROGRAM_PORT], UDP_MEMBER_OPTIONS)


def udp_clients(cluster, clients: int, sends: int, kill_pid: int | None = None, ports=(PROGRAM_PORT,)) -> list[int]:
    """UDP clients on the gateway's host, concurrently, client i to port
    ports[i % len(ports)]; client 0 SIGKILLs kill_pid a third of the way
    in.  Checks that each datagram got its own reply; returns the server's
    counts from the replies."""
    results = {}

    def client(i):
        c = DatagramClient(cluster.hosts[cluster.gateway_host][0], ports[i % len(ports)])
        got = []
        for j in range(sends):
            if kill_pid is not None and i == 0 and j == sends // 3:
                os.kill(kill_pid, signal.SIGKILL)    # the primary fails mid-stream
            got.append(c.lines([f"client{i}-dgram{j}"])[0][0])
            assert got[-1], f"client {i} (port {c.port}): no reply within 60 s to client{i}-dgram{j}"
        results[i] = got
        c.close()

    concurrently(client, clients)
    counts = []
    for i, got in results.items():
        assert len(got) == sends
        for j, r in enumerate(got):
            count, rest = r.split(" ", 1)
            assert rest.startswith(f"client{i}-dgram{j} from 127.0.0.1:"), r
            counts.append(int(count))
    return sorted(counts)


def udp_survivors_agree(cluster, survivors: list[int], expected: int, gateways=None):
    """DIGEST and SHUTDOWN; the survivors end with status 0, after one
    primary change, having sent the very same datagrams, as many as the
    gateways (run dirs; the first by default) sent their clients."""
    numbering_agrees(cluster, survivors)
    c = DatagramClient(cluster.hosts[cluster.gateway_host][0])
    digest, bye = c.lines(["DIGEST", "SHUTDOWN"])[0]
    c.close()
    assert digest.startswith("DIGEST ") and bye == "BYE"
    for k in survivors:
        p, _ = cluster.members[k]
        assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
    states = [cluster.status(cluster.members[k][1]) for k in survivors]
    assert {s["view"]["pvn"] for s in states} == {2}, "one primary change"
    assert sorted(s["replicas"][0]["role"] for s in states) == ["backup"] * (len(states) - 1) + ["primary"]
    sent = [s["replicas"][0]["datagrams"] for s in states]
    assert all(x == sent[0] for x in sent), "the survivors did not send the same datagrams"
    assert sent[0][str(PROGRAM_PORT)]["datagrams"] == expected + 2
    gateways = gateways or [cluster.gateway_dir]

    def udp_total(key):
        return sum(cluster.status(d)["gateway"]["udp"][key] for d in gateways)
    cluster.wait(lambda: udp_total("datagrams_out") == expected + 2, "the gateways' state", watch=False)
    assert udp_total("datagrams_in") == expected + 2 and udp_total("dropped") == 0


def test_udp_server_across_hosts_survives_the_primarys_death(cluster, examples):
    """udp_server on three hosts behind llft-gateway --udp-port: every client
    datagram reaches every replica in one order, the primary's replies come
    back from the gateway's UDP port, and when the primary's replica is
    SIGKILLed mid-stream the new primary answers what is left: each
    datagram answered exactly once, in the group's one order, and the
    survivors sent the very same datagrams."""
    first = start_udp_members(cluster, examples, 3)
    cluster.start_gateway(3, extra=["--udp-port", str(PROGRAM_PORT)])
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    assert udp_clients(cluster, 3, 60, kill_pid=replica_pid) == list(range(1, 181)), \
        "each datagram served once, none lost"
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    udp_survivors_agree(cluster, [1, 2], 180)


def test_udp_port_served_by_two_gateways_at_once(cluster, examples):
    """Two gateways serve the program's UDP port, each with its own virtual
    connection, and a quarter of what one backup's host receives is lost, so
    the two streams of datagrams reach the members interleaved differently,
    while the program reads them from one socket.  Every replica reads them
    in the primary's order (its ordering information names them), each
    reply goes back through the gateway its client used, and after the
    primary's death the survivors agree on every datagram sent."""
    first = cluster.start_members(3, [examples / "udp_server", PROGRAM_PORT],
                                  UDP_MEMBER_OPTIONS + ["--fault-timeout", "300"])
    drop_randomly(cluster.hosts[2][0], [17400], 25)
    cluster.start_gateway(3, extra=["--udp-port", str(PROGRAM_PORT)])
    second = cluster.start_gateway(3, port=PROGRAM_PORT + 1, extra=["--udp-port", f"{PROGRAM_PORT}:{PROGRAM_PORT + 1}"],
                                   name="gateway2")
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    assert udp_clients(cluster, 4, 60, kill_pid=replica_pid, ports=(PROGRAM_PORT, PROGRAM_PORT + 1)) == \
        list(range(1, 241)), "each datagram served once, none lost"
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    udp_survivors_agree(cluster, [1, 2], 240, gateways=[cluster.gateway_dir, second])


def test_udp_member_joining_late_replays_the_ports_datagrams(cluster, examples):
    """A member joining after datagrams were served gets them by state
    transfer, replays them, and can serve as a backup: after the primary's
    death it agrees with the other survivor on every datagram sent."""
    first = start_udp_members(cluster, examples, 2)
    cluster.start_gateway(3, extra=["--udp-port", str(PROGRAM_PORT)])
    assert udp_clients(cluster, 2, 20) == list(range(1, 41))
    cluster.start_member(2, [examples / "udp_server", PROGRAM_PORT], extra=UDP_MEMBER_OPTIONS)
    cluster.wait_members(3)
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    assert udp_clients(cluster, 2, 30, kill_pid=replica_pid) == list(range(41, 101))
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    udp_survivors_agree(cluster, [1, 2], 100)


def removed_from_view(cluster, indices, gone: int):
    """Waits until the members at these indices agree on a view without
    member `gone`, in the same primary view (removing a backup is no
    primary change), with consecutive ranks; returns their states."""
    def agreed():
        sts = [cluster.status(cluster.members[k][1]) for k in indices]
        return all(st and gone not in [m["member"] for m in st["members"]] for st in sts) and \
            len({json.dumps([(m["member"], m["rank"]) for m in st["members"]]) for st in sts}) == 1
    cluster.wait(agreed, f"member {gone} to be removed", watch=False)
    sts = [cluster.status(cluster.members[k][1]) for k in indices]
    assert [st["view"]["pvn"] for st in sts] == [1] * len(indices)
    assert [m["rank"] for m in sts[0]["members"]] == list(range(1, len(indices) + 1))
    return sts


def host_of_replica(cluster, index: int) -> int:
    """Which host runs replica `index` (the order of joining decides)."""
    return next(k for k, (_, d) in enumerate(cluster.members) if cluster.status(d)["replicas"][0]["index"] == index)


def test_killed_backup_is_removed_and_the_group_serves_on(cluster, examples):
    """A backup dies under writers: the primary's fault detector removes it
    (RemoveBackup), the other backup's rank closes up, writes go on (the dead
    backup no longer holds back watermarks and flow control), nothing
    acknowledged is lost."""
    start_three(cluster, examples, extra=["--no-rejoin"])
    host = host_of_replica(cluster, 1)
    victim = cluster.status(cluster.members[host][1])["member"]
    others = [0, 3 - host]
    import threading
    stop, acked, removed, progress = threading.Event(), {}, {}, Progress()

    def writer(i):
        write_until(cluster, i, stop, acked, progress=progress)

    def kill_backup():
        progress.wait(100)
        assert "sent SIGKILL to replica 1 (backup" in cluster.kill("--backup", "1")
        removed["states"] = removed_from_view(cluster, others, victim)
        progress.wait(progress.replies + 300)   # the writers go on with one backup
        stop.set()

    concurrently(writer, 3, kill_backup, timeout=120)
    # It leaves on its replica's death, or on its removal if that comes first.
    assert cluster.members[host][0].wait(timeout=30) in (128 + 9, 3)
    primary, backup = removed["states"]
    assert [m["role"] for m in primary["members"]] == ["primary", "backup"]
    assert primary["members"][1]["member"] == backup["member"]
    assert "removed from the group" in (cluster.members[0][1] / "llft.log").read_text()
    text = subprocess.run([tool("llft-status"), "--run-dir", str(cluster.members[others[1]][1])], capture_output=True,
                          text=True).stdout
    assert "view 1" in text and str(victim) not in text, text
    assert all(n > 0 for n in acked.values()), acked
    c = cluster.client()
    for i, n in acked.items():
        assert c.lines([f"GET w{i}-{j}" for j in range(n)])[0] == [f"VALUE v{j}" for j in range(n)]
    c.close()
    survivors_agree_and_end(cluster, others, sum(acked.values()))


def test_frozen_backup_is_removed_then_resets_and_rejoins(cluster, examples):
    start_three(cluster, examples)
    host = host_of_replica(cluster, 1)
    st = cluster.status(cluster.members[host][1])
    frozen, pids = st["member"], [st["controller_pid"], st["replicas"][0]["pid"]]
    writes_then_reads(cluster, "before", 30)
    assert "sent SIGSTOP" in cluster.kill("--backup", "1", "--signal", "STOP")
    try:
        removed_from_view(cluster, [0, 3 - host], frozen)
        writes_then_reads(cluster, "during", 30)
    finally:
        for pid in pids:                    # woken whatever happened: no frozen process left behind
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    # Woken, it learns it is no longer a member: it resets and applies again.
    rejoined(cluster, host, frozen, why=("removed this member",), who="the removed backup")
    writes_then_reads(cluster, "after", 30)
    survivors_agree_and_end(cluster, [0, 1, 2], 90)
