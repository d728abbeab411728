"""Outgoing connections across hosts: a replicated program's connect() made
by the gateway on the group's behalf (examples/proxy_server on three hosts,
a recording backend in the gateway's namespace, outside the group).  The
backend sees one connection per client and each request once; every
replica's output is the same; when the primary's host fails mid-workload
the backend connections survive and nothing is duplicated or lost."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import PROGRAMS_DIR
from netns import deaf_to, in_ns
from serving import concurrently
from test_multihost import PROGRAM_PORT, cluster, cluster_of, outputs_of  # noqa: F401 (fixtures)

BACKEND_PORT = 7100

# A line server: answers each line with "<n> <line>" (n: lines served so far)
# and logs "<connection>\t<line>" to a file, so that a request that reached
# it once per replica, or twice after a failover, would show.  Given a pid and
# "accept", it SIGKILLs it as it accepts its first connection: the primary's
# replica dies while its connect is answered but not yet recorded; given
# "line", as the first line arrives: it dies right after its first write.
BACKEND = """
import os, signal, socket, sys, threading
log = open(sys.argv[2], 'a', buffering=1)
lock = threading.Lock()
served = [0]
conns = [0]
def serve(k, c):
    f = c.makefile('rwb')
    for raw in f:
        line = raw.decode().rstrip('\\n')
        if sys.argv[4:] == ['line'] and served[0] == 0:
            os.kill(int(sys.argv[3]), signal.SIGKILL)
        with lock:
            served[0] += 1
            n = served[0]
            log.write(f'{k}\\t{line}\\n')
        f.write(f'{n} {line}\\n'.encode()); f.flush()
s = socket.create_server(('127.0.0.1', int(sys.argv[1])))
print('ready', flush=True)
while True:
    c, _ = s.accept()
    if sys.argv[4:] == ['accept'] and conns[0] == 0:
        os.kill(int(sys.argv[3]), signal.SIGKILL)
    with lock:
        conns[0] += 1
        k = conns[0]
    threading.Thread(target=serve, args=(k, c), daemon=True).start()
"""


AT_EOF_PORT = BACKEND_PORT + 1   # tests/programs/answer_at_eof.py


def start_backend(cluster, host: int, log_path, kill_pid=None, kill_on=None):
    p = subprocess.Popen(in_ns(cluster.hosts[host][0], sys.executable, "-c", BACKEND, BACKEND_PORT, log_path,
                               *([kill_pid, kill_on] if kill_pid else [])),
                         stdout=subprocess.PIPE, text=True)
    cluster.procs.append(p)
    assert p.stdout.readline().strip() == "ready"
    return p


def backend_conns(log_path) -> list[list[str]]:
    conns: dict[str, list[str]] = {}
    for row in log_path.read_text().splitlines():
        k, line = row.split("\t", 1)
        conns.setdefault(k, []).append(line)
    return sorted(conns.values())


def proxy_cluster(cluster, examples, tmp_path, extra=(), kill_on=None):
    first = cluster.start_members(3, [examples / "proxy_server", PROGRAM_PORT, BACKEND_PORT], extra=extra)
    cluster.start_gateway(3, extra=["--outgoing", "--log-level", "info"])
    log_path = tmp_path / "backend.log"
    start_backend(cluster, 3, log_path, cluster.status(first)["replicas"][0]["pid"] if kill_on else None, kill_on)
    return first, log_path


def client_lines(i: int, n: int) -> list[str]:
    return [f"c{i}-{j}" for j in range(n)]


def run_clients(cluster, nclients: int, nlines: int, at=None) -> dict:
    """Each client sends its lines one by one; at(i, j) runs before line j."""
    results = {}

    def client(i):
        c = cluster.client()
        got = []
        for j, line in enumerate(client_lines(i, nlines)):
            if at is not None:
                at(i, j)
            got.append(c.lines([line])[0][0])
        c.close()
        results[i] = got
    concurrently(client, nclients)
    return results


def check_each_line_once(log_path, results: dict, nclients: int, nlines: int):
    """One backend connection per client, each with exactly that client's
    lines in order; the clients' replies number every line served, 1..n."""
    assert backend_conns(log_path) == sorted(client_lines(i, nlines) for i in range(nclients))
    numbers = sorted(int(r.split()[0]) for got in results.values() for r in got)
    assert numbers == list(range(1, nclients * nlines + 1))
    for i, got in results.items():
        assert [r.split(" ", 1)[1] for r in got] == client_lines(i, nlines)


def shutdown_and_compare(cluster, members: list):
    """SHUTDOWN; every member ends with status 0 and the replicas sent the
    clients the same bytes."""
    c = cluster.client()
    assert c.lines(["SHUTDOWN"])[0] == ["BYE"]
    c.close()
    for p, _ in members:
        assert p.wait(timeout=60) == 0, p.stderr.read()[-3000:]
    states = [cluster.status(d) for _, d in members]
    outs = [outputs_of(s) for s in states]
    assert all(o == outs[0] for o in outs), "replicas sent the clients different bytes"
    for s in states:
        assert s["replicas"][0]["outgoing"]["dropped"] == 0, s["replicas"][0]["outgoing"]
        # Once its replica has attached, a member no longer keeps what the remote sent.
        assert s["replicas"][0]["outgoing"]["kept_bytes"] == 0, s["replicas"][0]["outgoing"]
    return states


def gateway_counted(cluster, n: int):
    """The gateway (its state file, written every second) made n remote
    connections and dropped nothing."""
    cluster.wait(lambda: cluster.status(cluster.gateway_dir)["gateway"]["outgoing"]["connections"] == n,
                 f"the gateway to count {n} outgoing connections", watch=False)
    assert cluster.status(cluster.gateway_dir)["gateway"]["outgoing"]["dropped"] == 0


def test_gateway_makes_the_groups_outgoing_connections(cluster, examples, tmp_path):
    _, log_path = proxy_cluster(cluster, examples, tmp_path)
    results = run_clients(cluster, nclients=3, nlines=40)
    check_each_line_once(log_path, results, 3, 40)
    # Refused connects, blocking and non-blocking, replay as refused; a
    # non-blocking connect reports the backend as its peer.
    c = cluster.client()
    assert c.lines(["CONNECT 7199", "PROBE 7199", f"PROBE {BACKEND_PORT}"])[0] == [
        "CONNECT Connection refused", "PROBE Connection refused", f"PROBE connected {BACKEND_PORT}"]
    # Half-close: the program shuts down its writing side and reads the answer.
    at_eof = subprocess.Popen(in_ns(cluster.hosts[3][0], sys.executable, PROGRAMS_DIR / "answer_at_eof.py",
                                    AT_EOF_PORT), stdout=subprocess.PIPE, text=True)
    cluster.procs.append(at_eof)
    assert at_eof.stdout.readline().strip() == "ready"
    assert c.lines([f"ASK {AT_EOF_PORT} hello there"])[0] == ["ASK heard 12 bytes: hello there"]
    c.close()
    states = shutdown_and_compare(cluster, cluster.members)
    assert all(s["replicas"][0]["outgoing"]["connections"] == 5 for s in states)
    assert all(s["replicas"][0]["outgoing"]["failed"] == 2 for s in states)
    gateway_counted(cluster, 5)


@pytest.mark.parametrize("kill_at", [
    pytest.param(20, id="mid-workload"),
    pytest.param(0, id="while-connecting"),
    pytest.param("accept", id="at-first-connect"),
    pytest.param("line", id="at-first-write"),
])
def test_primary_host_fails_and_the_backend_connections_survive(cluster, examples, tmp_path, kill_at):
    """kill_at 0: the primary fails as the clients' first lines arrive, while
    the program's connects are under way; "accept": the backend kills it as
    it accepts the first connection, which the gateway has made but the
    primary not recorded: the new primary asks for it again and gets the same
    one; "line": the primary's first write on connection k reached the
    backend: the new primary makes connect k in the same thread (it has the
    record, which went to the gateway with the write), so that thread's
    client's lines go on on that connection."""
    first, log_path = proxy_cluster(cluster, examples, tmp_path, extra=["--no-rejoin"],
                                    kill_on=kill_at if isinstance(kill_at, str) else None)
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    nclients, nlines = 3, 60

    def kill_midway(i, j):
        if i == 0 and j == kill_at:
            os.kill(replica_pid, signal.SIGKILL)   # the primary fails mid-stream
    results = run_clients(cluster, nclients, nlines, at=kill_midway)
    check_each_line_once(log_path, results, nclients, nlines)
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    # The new primary's own connect (the next k) gets a connection of its own.
    c = cluster.client()
    assert c.lines(["after"])[0] == [f"{nclients * nlines + 1} after"]
    c.close()
    assert len(backend_conns(log_path)) == nclients + 1
    shutdown_and_compare(cluster, cluster.members[1:])
    gateway_counted(cluster, nclients + 1)


def test_two_gateways_offer_outgoing_connections_and_the_primary_picks_one(cluster_of, examples, tmp_path):
    """Two gateways with --outgoing, each with the backend at its own
    127.0.0.1.  The backup's host hears the second's offer first (it is
    deaf to the first gateway's host meanwhile), the primary the first's:
    the backup still uses the gateway the primary picked, so that when the
    primary fails mid-workload and the backup takes over, the backend
    there still sees each line once, and the other backend nothing.
    (Following the first offer it heard, the backup logged its requests on
    the other gateway's connection, and as primary sent them there.)"""
    cluster = cluster_of(5)
    first = cluster.start_members(2, [examples / "proxy_server", PROGRAM_PORT, BACKEND_PORT], extra=["--no-rejoin"])
    logs = [tmp_path / "backend-3.log", tmp_path / "backend-4.log"]
    for host, log_path in zip((3, 4), logs):
        log_path.touch()
        start_backend(cluster, host, log_path)
    with deaf_to(cluster.hosts[1][0], cluster.hosts[3][1]):
        cluster.start_gateway(3, extra=["--outgoing"])
        cluster.start_gateway(4, extra=["--outgoing"], name="gateway-b")
        time.sleep(0.5)
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    nclients, nlines = 3, 40

    def kill_midway(i, j):
        if i == 0 and j == nlines // 2:
            os.kill(replica_pid, signal.SIGKILL)   # the primary fails mid-stream
    results = run_clients(cluster, nclients, nlines, at=kill_midway)
    assert logs[1].read_text() == "", "the gateway the primary did not pick made connections"
    check_each_line_once(logs[0], results, nclients, nlines)
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    shutdown_and_compare(cluster, cluster.members[1:])


def test_killed_primary_rejoins_and_replays_the_remote_bytes(cluster, examples, tmp_path):
    """The killed primary's member rejoins with a fresh replica (state
    transfer by log): its program replays every outgoing connection from
    the transferred results and remote bytes, sends the backend nothing,
    and ends with the same output as the others."""
    first, log_path = proxy_cluster(cluster, examples, tmp_path)
    nclients, nlines = 3, 20
    before = run_clients(cluster, nclients, nlines)
    old = cluster.status(first)
    os.kill(old["replicas"][0]["pid"], signal.SIGKILL)

    def whole_again():
        sts = [cluster.status(d) for _, d in cluster.members]
        return all(s["view"]["pvn"] > old["view"]["pvn"] and len(s["members"]) == 3 and s["replicas"]
                   for s in sts) and len({s["view"]["pvn"] for s in sts}) == 1
    cluster.wait(whole_again, "the killed member to rejoin", timeout=60)
    # New connections after the rejoin: the clients' lines count on from
    # where the first ones stopped, each line reaches the backend once.
    c = cluster.client()
    assert c.lines(["after"])[0] == [f"{nclients * nlines + 1} after"]
    c.close()
    assert backend_conns(log_path) == sorted([*(client_lines(i, nlines) for i in range(nclients)), ["after"]])
    assert sorted(int(r.split()[0]) for got in before.values() for r in got) == list(range(1, nclients * nlines + 1))
    shutdown_and_compare(cluster, cluster.members)
    gateway_counted(cluster, nclients + 1)


# A UDP service in the gateway's namespace: answers each datagram with
# "<n> <text>" and logs the text, so that a datagram sent once per replica,
# or twice after a failover, would show.
UDP_BACKEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('127.0.0.1', int(sys.argv[1])))
log = open(sys.argv[2], 'a', buffering=1)
print('ready', flush=True)
n = 0
while True:
    data, addr = s.recvfrom(2048)
    n += 1
    log.write(data.decode() + '\\n')
    s.sendto(f'{n} {data.decode()}'.encode(), addr)
"""
UDP_BACKEND_PORT = BACKEND_PORT + 2


def start_udp_backend(cluster, log_path):
    p = subprocess.Popen(in_ns(cluster.hosts[3][0], sys.executable, "-c", UDP_BACKEND, UDP_BACKEND_PORT, log_path),
                         stdout=subprocess.PIPE, text=True)
    cluster.procs.append(p)
    assert p.stdout.readline().strip() == "ready"


def udp_lines(i: int, n: int) -> list[str]:
    """Lookups through sockets never bound: odd ones connected, even ones sendto/recvfrom."""
    return [f"UDP {UDP_BACKEND_PORT} c{i}-{j}" if j % 2 else f"UDPTO {UDP_BACKEND_PORT} c{i}-{j}" for j in range(n)]


def check_each_datagram_once(log_path, results: dict, nclients: int, nlines: int):
    """Every lookup reached the UDP service once and its answer came back:
    the answers number every datagram served, 1..n."""
    sent = sorted(log_path.read_text().splitlines())
    assert sent == sorted(f"c{i}-{j}" for i in range(nclients) for j in range(nlines)), \
        "each datagram sent once, not once per replica nor again after a failover"
    numbers = []
    for i, got in results.items():
        for j, (line, reply) in enumerate(zip(udp_lines(i, nlines), got)):
            assert len(reply.split()) >= 3, f"client {i}'s lookup {j} ({line}) was answered {reply!r}"
            cmd, n, text, *rest = reply.split()
            assert (cmd, text) == (line.split()[0], f"c{i}-{j}"), reply
            assert rest == ([] if cmd == "UDP" else ["from", str(UDP_BACKEND_PORT)]), reply
            numbers.append(int(n))
    assert sorted(numbers) == list(range(1, nclients * nlines + 1))


@pytest.mark.parametrize("kill_at", [None, 10], ids=["no-failure", "primary-killed"])
def test_outgoing_udp_across_hosts(cluster, examples, tmp_path, kill_at):
    """A UDP socket that sends (sendto, or connect and send) before any bind,
    as a resolver does, on three hosts: the gateway sends each datagram once
    from a socket of its own, every replica gets the answer, each replica's
    port is closed after; with the primary's replica SIGKILLed mid-workload,
    nothing is sent twice and no lookup goes unanswered."""
    proxy_cluster(cluster, examples, tmp_path, extra=["--no-rejoin"] if kill_at else ())
    udp_log = tmp_path / "udp.log"
    start_udp_backend(cluster, udp_log)
    replica_pid = cluster.status(cluster.members[0][1])["replicas"][0]["pid"]
    nclients, nlines = 3, 20
    results = {}

    def client(i):
        c = cluster.client()
        got = []
        for j, line in enumerate(udp_lines(i, nlines)):
            if i == 0 and j == kill_at:
                os.kill(replica_pid, signal.SIGKILL)
            got.append(c.lines([line])[0][0])
        c.close()
        results[i] = got
    concurrently(client, nclients)
    check_each_datagram_once(udp_log, results, nclients, nlines)
    survivors = cluster.members[1:] if kill_at else cluster.members
    if kill_at:
        assert cluster.members[0][0].wait(timeout=30) == 128 + 9
    states = shutdown_and_compare(cluster, survivors)
    ports = [{k: v for k, v in s["replicas"][0]["outgoing"].items() if k.startswith("udp-")} for s in states]
    assert len(ports[0]) == nclients * nlines, "a port of its own for each socket"
    assert all(p == ports[0] for p in ports), "the replicas sent different datagrams"
    # (the gateway writes its state file every second)
    gateway_udp = lambda: cluster.status(cluster.gateway_dir)["gateway"]["outgoing"]["udp"]  # noqa: E731
    cluster.wait(lambda: gateway_udp()["datagrams_out"] == nclients * nlines and gateway_udp()["open_ports"] == 0,
                 "the gateway to count every datagram and close every port the program closed", watch=False)
    gw = gateway_udp()
    assert gw["ports"] == nclients * nlines and gw["bad_replies"] == 0 and gw["dropped"] == 0, gw


def test_killed_primary_rejoins_and_replays_the_outgoing_datagrams(cluster, examples, tmp_path):
    """The killed primary's member rejoins with a fresh replica: its program
    replays every outgoing UDP port from the transferred ordering entries
    and datagrams, sends the UDP service nothing, and ends with the same
    output and the same datagrams as the others."""
    proxy_cluster(cluster, examples, tmp_path)
    udp_log = tmp_path / "udp.log"
    start_udp_backend(cluster, udp_log)
    first = cluster.members[0][1]
    nclients, nlines = 2, 10
    before = {}

    def client(i):
        c = cluster.client()
        before[i] = [c.lines([line])[0][0] for line in udp_lines(i, nlines)]
        c.close()
    concurrently(client, nclients)
    check_each_datagram_once(udp_log, before, nclients, nlines)
    old = cluster.status(first)
    os.kill(old["replicas"][0]["pid"], signal.SIGKILL)

    def whole_again():
        sts = [cluster.status(d) for _, d in cluster.members]
        return all(s["view"]["pvn"] > old["view"]["pvn"] and len(s["members"]) == 3 and s["replicas"]
                   for s in sts) and len({s["view"]["pvn"] for s in sts}) == 1
    cluster.wait(whole_again, "the killed member to rejoin", timeout=60)
    c = cluster.client()
    after = c.lines([f"UDPTO {UDP_BACKEND_PORT} after"])[0][0]
    c.close()
    assert after == f"UDPTO {nclients * nlines + 1} after from {UDP_BACKEND_PORT}", after
    assert len(udp_log.read_text().splitlines()) == nclients * nlines + 1, "the rejoined replica sent again"
    states = shutdown_and_compare(cluster, cluster.members)
    ports = [{k: v for k, v in s["replicas"][0]["outgoing"].items() if k.startswith("udp-")} for s in states]
    assert len(ports[0]) == nclients * nlines + 1 and all(p == ports[0] for p in ports), ports
