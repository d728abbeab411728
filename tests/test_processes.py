"""Programs that make processes: shells that fork before they exec (and
their vfork), command substitutions whose output the replicated shell
reads, and servers that fork workers to serve clients, which llft does not
replicate yet and must refuse in one line rather than serve unreplicated."""
from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time

import psutil
import pytest

from conftest import tool
from serving import ServingGroup
from test_failover import check_exactly_once, finish_and_check, run_clients

SH = shutil.which("sh") or "/bin/sh"
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def llft_run(tmp_path, *argv, replicas=3, timeout=60, extra=()):
    return subprocess.run([tool("llft-run"), "--replicas", str(replicas), "--run-dir", str(tmp_path / "rd"), *extra,
                           "--", *map(str, argv)], capture_output=True, text=True, timeout=timeout)


def test_a_shell_that_forks_then_execs_runs_to_its_end(tmp_path):
    """dash runs /bin/true in a vfork child: the child must not record
    (or, at a backup, replay) its exec as the shell's own call."""
    p = llft_run(tmp_path, SH, "-c", "/bin/true; exec sleep 0.2", replicas=2, timeout=30)
    assert p.returncode == 0, p.stderr


def test_a_command_substitution_reads_the_same_at_every_replica(tmp_path):
    """The shell reads its child's output through a pipe: every replica's
    shell reads the primary's bytes, though each replica's child printed
    its own clock (llft-run exits 86 when the replicas' stdout differ)."""
    p = llft_run(tmp_path, SH, "-c", 'now=$(date +%s%N); sleep 0.01; echo "at $now"; /bin/true', timeout=30)
    assert p.returncode == 0, p.stderr
    outs = {(tmp_path / "rd" / f"replica-{k}" / "stdout").read_text() for k in range(3)}
    assert len(outs) == 1 and outs.pop().startswith("at "), outs


def test_a_server_started_by_a_forking_shell_script_fails_over(examples, tmp_path):
    script = tmp_path / "start.sh"
    script.write_text(f"#!/bin/sh\n/bin/true\necho starting >&2\nexec {examples / 'echo_server'} \"$1\"\n")
    script.chmod(0o755)
    group = ServingGroup(tmp_path / "rd", [script, 7000])
    results = run_clients(group, nclients=3, nlines=200, kills=1)
    check_exactly_once(results, 3, 200)
    state = finish_and_check(group)
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]


@pytest.mark.parametrize("how", [["exit"], ["_exit", "twice"], ["_exit", "twice", "nosid"], ["daemon"], ["wait"],
                                 ["wait", "-", "nosid"]])
def test_a_server_that_daemonizes_is_followed_and_fails_over(how, examples, tmp_path):
    """daemon_server forks and its parent exits (with exit, with _exit and
    a second fork after setsid, or without setsid, or inside glibc's
    daemon(3)), as redis's daemonize and memcached -d do, or its parent
    waits for a child that forks the daemon and exits (with and without
    setsid): each replica goes on as the daemon (nothing left behind),
    and a primary killed under load loses and repeats nothing."""
    import json
    group = ServingGroup(tmp_path / "rd", [examples / "daemon_server", 7000, *how])
    started = json.loads((group.run_dir / "llft-run.json").read_text())["replicas"]
    for r in started:
        assert psutil.Process(r["pid"]).children() == [], "a forked child was left running beside the replica"
    results = run_clients(group, nclients=3, nlines=200, kills=1)
    check_exactly_once(results, 3, 200)
    state = finish_and_check(group)
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
    assert [r["pid"] for r in state["replicas"]] == [r["pid"] for r in started]


@pytest.mark.skipif(not shutil.which("memcached"), reason="memcached not installed (scripts/setup.sh installs it)")
def test_memcached_daemonized_is_followed_and_fails_over(tmp_path):
    """memcached -d forks and its parent _exits: each replica goes on as
    the child (daemon_fork.c), and INCRs come exactly once across a primary
    kill."""
    from serving import Progress, concurrently, kill_after
    group = ServingGroup(tmp_path / "rd", [shutil.which("memcached"), "-d", "-A", "-p", "11211", "-U", "0",
                                           "-l", "127.0.0.1", "-u", "root", "-o", "no_lru_crawler,no_lru_maintainer"])
    with group.connect() as s:
        f = s.makefile("rwb")
        f.write(b"set counter 0 0 1\r\n0\r\n")
        f.flush()
        assert f.readline() == b"STORED\r\n"
    progress, got = Progress(), []

    def client(i):
        with group.connect() as s:
            f = s.makefile("rwb")
            for _ in range(300):
                f.write(b"incr counter 1\r\n")
                f.flush()
                got.append(int(f.readline()))
                progress.tick()

    concurrently(client, 3, kill_after(group, progress, 250))
    assert sorted(got) == list(range(1, 901)), "an incr was lost or applied twice"
    with group.connect() as s:
        s.sendall(b"shutdown\r\n")
    state = group.finish()
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"], group.stderr


def no_process_left(marker: str):
    """No process whose command line holds marker (the test's own port)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"left running: {[p.pid for p in left]}")


def test_a_server_that_forks_workers_is_refused_with_fork_unrecorded(examples, tmp_path):
    """prefork_server (nginx's and apache prefork's process model): its
    workers accept on the inherited listener.  With --fork unrecorded
    (they are replicated otherwise: test_forked_processes.py) refused,
    with what it did, and nothing of it left running."""
    port = "7417"
    p = llft_run(tmp_path, examples / "prefork_server", port, 2, extra=["--fork", "unrecorded"])
    assert p.returncode == 1, p.stderr
    line = [ln for ln in p.stderr.splitlines() if "cannot replicate" in ln]
    assert line and "forked" in line[0] and "accepted a client connection" in line[0], p.stderr
    no_process_left(f"prefork_server {port}")


@pytest.mark.skipif(not NGINX, reason="nginx not installed (scripts/setup.sh installs nginx-light)")
def test_nginx_with_its_default_master_and_workers_is_refused_with_fork_unrecorded(tmp_path):
    from test_forked_processes import nginx_conf
    conf = nginx_conf(tmp_path, 7418, "daemon off;")
    p = llft_run(tmp_path, NGINX, "-c", conf, "-p", tmp_path, extra=["--fork", "unrecorded"])
    assert p.returncode == 1, p.stderr
    assert "cannot replicate the program: a process the program forked" in p.stderr, p.stderr
    no_process_left(str(conf))


def processes_running(marker: str) -> int:
    return sum(1 for p in psutil.process_iter(["cmdline", "status"])
               if " ".join(p.info["cmdline"] or []) == marker and p.info["status"] != psutil.STATUS_ZOMBIE)


def test_what_a_replica_forked_goes_with_it_and_with_the_group(examples, tmp_path):
    """A background child goes when its replica is killed (its process
    group); one that made a session of its own (setsid, as daemons do)
    goes when the group ends, and so does that one's own child, whose
    parent is still alive then: llft-run is their subreaper."""
    a, b, c = "sleep 3601", "sleep 3602", "sleep 3603"
    group = ServingGroup(tmp_path / "rd", [SH, "-c", f"{a} & setsid {b} & setsid {SH} -c '{c} & wait' & "
                                           f"exec {examples / 'echo_server'} 7000"])
    wait_until = time.monotonic() + 10
    while (processes_running(a), processes_running(b), processes_running(c)) != (3, 3, 3):
        assert time.monotonic() < wait_until, (processes_running(a), processes_running(b), processes_running(c))
        time.sleep(0.05)
    from serving import kill_primary
    kill_primary(group.run_dir)
    wait_until = time.monotonic() + 10
    while processes_running(a) != 2:
        assert time.monotonic() < wait_until, "the killed replica's child outlived it"
        time.sleep(0.05)
    with group.connect() as s:           # the group serves on, failed over
        s.sendall(b"hello\n")
        assert s.makefile().readline().endswith("hello\n")
    group.stop()
    assert [processes_running(x) for x in (a, b, c)] == [0, 0, 0], "a replica's child outlived the group"


APACHE = shutil.which("apache2") or shutil.which("apache2", path="/usr/sbin")


@pytest.mark.skipif(not APACHE, reason="apache2 not installed (scripts/setup.sh installs it)")
def test_apache_prefork_is_refused_in_one_line_with_fork_unrecorded(tmp_path):
    """apache's prefork children accept on the listener their parent bound
    (and share a scoreboard in shared memory): with --fork unrecorded,
    refused, never served (replicated otherwise: test_forked_processes.py)."""
    from test_forked_processes import apache_conf
    (tmp_path / "www").mkdir()
    conf = apache_conf(tmp_path, 7419, tmp_path / "www")
    p = llft_run(tmp_path, APACHE, "-f", conf, "-DFOREGROUND", extra=["--fork", "unrecorded"])
    assert p.returncode == 1, p.stderr
    assert "cannot replicate the program: a process the program forked" in p.stderr, p.stderr
    assert "sharing with it an anonymous shared mapping" in p.stderr, "the scoreboard is not named"
    no_process_left(str(conf))


DNSMASQ = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin")


def dns_query(name: str, qid: int = 0x1234) -> bytes:
    header = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return header + labels + b"\0" + struct.pack(">HH", 1, 1)


def dnsmasq_argv(tmp_path, port: int, *mode: str) -> list:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.1.2.3 box.test\n")
    return [DNSMASQ, *mode, f"--port={port}", "--listen-address=127.0.0.1", "--bind-interfaces", "--no-resolv",
            "--no-hosts", f"--addn-hosts={hosts}", "--pid-file=", "--user=root"]


def tcp_dns(port: int, name: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        q = dns_query(name)
        s.sendall(struct.pack(">H", len(q)) + q)
        return s.recv(512)


def udp_dns(port: int, name: str, within: float = 20.0) -> bytes:
    """The answer to one UDP query, asked again until the server is up."""
    end = time.monotonic() + within
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.settimeout(0.5)
            u.sendto(dns_query(name), ("127.0.0.1", port))
            try:
                return u.recvfrom(512)[0]
            except socket.timeout:
                assert time.monotonic() < end, "no UDP answer"


def run_dnsmasq(tmp_path, port: int, *mode: str, extra=()) -> subprocess.Popen:
    return subprocess.Popen([tool("llft-run"), "--replicas", "3", "--run-dir", str(tmp_path / "rd"), *extra, "--",
                             *map(str, dnsmasq_argv(tmp_path, port, *mode))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def end(proc: subprocess.Popen, timeout: float = 30) -> str:
    """Stops llft-run if it still runs; returns what it said on stderr."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


HOST_ANSWER = bytes([10, 1, 2, 3])


@pytest.mark.skipif(not DNSMASQ, reason="dnsmasq not installed (scripts/setup.sh installs it)")
def test_dnsmasq_in_the_foreground_answers_udp_and_tcp_across_a_failover(tmp_path):
    """dnsmasq -d answers TCP queries itself (no child): served over UDP
    and TCP, before and after the primary is killed."""
    port = 7422
    proc = run_dnsmasq(tmp_path, port, "-d")
    try:
        answers = [udp_dns(port, "box.test"), tcp_dns(port, "box.test")]
        from serving import kill_primary
        kill_primary(tmp_path / "rd")
        answers += [udp_dns(port, "box.test"), tcp_dns(port, "box.test")]
        assert all(a.endswith(HOST_ANSWER) for a in answers), answers
    finally:
        err = end(proc)
    assert "cannot replicate" not in err, err


@pytest.mark.skipif(not DNSMASQ, reason="dnsmasq not installed (scripts/setup.sh installs it)")
def test_dnsmasq_forking_a_child_per_tcp_query_is_refused_with_fork_unrecorded(tmp_path):
    """dnsmasq without -d (here -k, in the foreground) forks a child for
    each TCP query, which with --fork unrecorded would answer it
    unreplicated: refused at the first TCP query, the UDP service before it
    intact (replicated otherwise: test_forked_processes.py)."""
    port = 7421
    proc = run_dnsmasq(tmp_path, port, "-k", extra=["--fork", "unrecorded"])
    try:
        assert udp_dns(port, "box.test").endswith(HOST_ANSWER)
        assert tcp_dns(port, "box.test") == b"", "a forked child answered a client unreplicated"
        proc.wait(timeout=30)
    finally:
        err = end(proc)
    assert proc.returncode == 1, err
    assert "a process the program forked" in err and "used a client connection" in err, err
