"""Processes a replicated program forks, replicated with it (llft-run
--fork replicate; native/fork_stream.c, llft/determinizer/forked.py): each
on a record stream of its own, its pid the primary's child's at every
replica, its exit and its parent's waits in the primary's order, and
failing over with the program."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import psutil
import pytest

import serving
from conftest import tool

SH = shutil.which("sh") or "/bin/sh"


def start(tmp_path, argv, replicas=3, extra=("--fork", "replicate")):
    rd = tmp_path / "rd"
    proc = subprocess.Popen([tool("llft-run"), "--replicas", str(replicas), "--run-dir", str(rd), *extra, "--",
                             *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, rd


def outputs(rd, replicas) -> list[str]:
    return [(rd / f"replica-{k}" / "stdout").read_text() for k in replicas]


def check_fork_wait_output(out: str, n: int):
    """fork_wait's lines say the same thing about each child from both
    sides: the pid its parent got from fork() is its getpid() (and its
    exec'd shell's $$), its getppid() is its parent's getpid(), and its
    parent reaped it with the status it ended with."""
    parent = int(re.search(r"^parent pid (\d+)", out, re.M).group(1))
    pids = {int(i): int(p) for i, p in re.findall(r"^parent: child (\d+) is pid (\d+)$", out, re.M)}
    assert sorted(pids) == list(range(n)), out
    for i, pid, ppid in re.findall(r"^child (\d+) pid (\d+) ppid (\d+)", out, re.M):
        assert (pids[int(i)], parent) == (int(pid), int(ppid)), out
    shell = re.search(rf"^child {n - 1} exec'd a shell, pid (\d+) of (\d+), clock \d+$", out, re.M)
    assert shell and (int(shell.group(1)), int(shell.group(2))) == (pids[n - 1], parent), out
    assert "grandchild reaped exit" in out
    reaped = dict((int(p), how) for p, how in re.findall(r"^parent: reaped (\d+), (.*)$", out, re.M))
    assert reaped == {pids[i]: "killed by signal 15" if i == 1 else f"exit {10 + i}" for i in range(n - 1)}, out
    assert f"parent: child {n - 1} exited 5" in out
    assert out.endswith("parent: then wait() = -1 (No child processes)\n"), out


def test_forked_processes_replay_on_streams_of_their_own(examples, tmp_path):
    """fork_wait's children read the clock and the random device, share a
    lock with a thread of their own, fork a grandchild and exec a shell
    that forks `date`; each replica's stdout carries what its own children
    printed, so the backups' equal the primary's only if every child was
    replayed from its primary counterpart's stream."""
    proc, rd = start(tmp_path, [examples / "fork_wait", 4])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    outs = outputs(rd, range(3))
    assert outs[1] == outs[0] and outs[2] == outs[0], err
    check_fork_wait_output(outs[0], 4)
    state = json.loads((rd / "llft-run.json").read_text())
    assert state["forked"]["drops"] == 0
    assert state["forked"]["shared_memory"] is None, "the shim's own mappings are not the program's to name"


def test_unrecorded_children_differ_at_the_backups(examples, tmp_path):
    """The check above can fail: without --fork replicate the children run
    on their own at each replica, and the backups print other clocks and
    random numbers (llft-run exits 86, the stdouts differing)."""
    proc, rd = start(tmp_path, [examples / "fork_wait", 3], replicas=2, extra=("--fork", "unrecorded"))
    proc.communicate(timeout=120)
    assert proc.returncode == 86
    a, b = outputs(rd, range(2))
    assert a != b and a.count("\n") == b.count("\n")


def test_a_shell_pipeline_of_forked_commands_is_the_same_everywhere(tmp_path):
    """A shell forks a loop, a command substitution per line and `sort`,
    which write to stdout themselves."""
    script = 'for i in 1 2 3; do echo "$i $(date +%N) $(od -An -N4 -tu4 /dev/urandom)"; done | sort -r; exit 3'
    proc, rd = start(tmp_path, [SH, "-c", script])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    outs = outputs(rd, range(3))
    assert len(set(outs)) == 1 and [line.split()[0] for line in outs[0].splitlines()] == ["3", "2", "1"], outs


def wait_for_line(path, text, proc, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and text in path.read_text():
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.parametrize("when", ["children running", "children gone"])
def test_a_primary_killed_with_its_children_fails_over_with_them(when, examples, tmp_path):
    """The primary is killed (with every process it forked) while its
    children run, or once the last is reaped and the parent idles: the
    successor's processes take over each on its own stream, and the group
    ends as it would have, every survivor printing the same whole story."""
    proc, rd = start(tmp_path, [examples / "fork_wait", 4, 300])
    wait_for_line(rd / "llft-run.json", '"phase": "running"', proc)
    primary = json.loads((rd / "llft-run.json").read_text())["replicas"][0]["pid"]
    mark = "parent: child 0 is pid" if when == "children running" else "parent: reaped"
    wait_for_line(rd / "replica-0" / "stdout", mark, proc)
    os.kill(primary, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    a, b = outputs(rd, (1, 2))
    assert a == b, err
    check_fork_wait_output(a, 4)
    state = json.loads((rd / "llft-run.json").read_text())
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]


def test_fork_replicate_refuses_what_it_does_not_go_with_yet(tmp_path):
    """--keep clones replicas with CRIU, one process at a time."""
    p = subprocess.run([tool("llft-run"), "--fork", "replicate", "--keep", "2", "--", SH, "-c", "true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--fork replicate does not go with --keep" in p.stderr, p.stderr


def check_worker_counts(results: dict, nlines: int):
    """prefork_server's workers each count the lines they served, one
    connection at a time: a connection's replies count on by one from
    where its worker was (a request applied twice skips one, a lost one
    never comes), and over all replies, each count is had by no more
    workers than the one before it."""
    every = []
    for i, got in results.items():
        assert [r.split(" ", 1)[1] for r in got] == [f"c{i}-{j}" for j in range(nlines)]
        counts = [int(r.split()[0]) for r in got]
        assert counts == list(range(counts[0], counts[0] + nlines)), f"client {i}: a request applied twice: {counts}"
        every += counts
    had = [every.count(v) for v in range(1, max(every) + 1)]
    assert had == sorted(had, reverse=True), "some count was skipped by a worker"


def shut_down_workers(group, workers: int):
    """SHUTDOWN on one connection per worker: each that gets one exits, and
    the master, its waits done, exits too."""
    from serving import line_client
    for _ in range(workers):
        with group.connect() as s:
            assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]


def finish_survivors(group, kills: int) -> list[dict]:
    """Waits for the group's end: it exited 0 after `kills` failovers of
    three replicas, and the survivors sent the clients the same bytes;
    returns the survivors' states."""
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed"] * kills + ["primary"] + ["backup"] * (2 - kills)
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    for r in survivors[1:]:
        assert r["outputs"] == survivors[0]["outputs"], "surviving replicas disagree"
    return survivors


@pytest.mark.parametrize("kills", [0, 1, 2])
def test_a_server_that_forks_workers_serves_and_fails_over(kills, examples, tmp_path):
    """prefork_server: the master binds and forks two workers that accept
    on its listener (nginx's and apache prefork's model).  Each backup
    worker is handed the very connections its counterpart accepted; the
    primary is killed under load, after the k-th reply, and the
    successor's workers go on; nothing is lost or applied twice, and the
    survivors' outputs are equal."""
    from serving import Progress, ServingGroup, kill_after, line_clients
    group = ServingGroup(tmp_path / "rd", [examples / "prefork_server", 7000, 2], extra=["--fork", "replicate"])
    nclients, nlines = 4, 150
    progress = Progress()
    at = [nclients * nlines * (k + 1) // (kills + 2) for k in range(kills)]
    results = line_clients(group, nclients, lambda i: [f"c{i}-{j}" for j in range(nlines)],
                           kill_after(group, progress, *at), pause=0.001, progress=progress)
    check_worker_counts(results, nlines)
    shut_down_workers(group, 2)
    finish_survivors(group, kills)


EPHEMERAL_PORTS = """
import os, socket
def bound(kind):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        s.listen()
    return s
mine = [bound(socket.SOCK_DGRAM)]
r, w = os.pipe()
if os.fork() == 0:
    theirs = [bound(socket.SOCK_DGRAM), bound(socket.SOCK_STREAM), bound(socket.SOCK_DGRAM)]
    os.write(w, " ".join(str(s.getsockname()[1]) for s in theirs).encode())
    os._exit(0)
os.close(w)
child = os.read(r, 100).decode()
mine.append(bound(socket.SOCK_DGRAM))
os.wait()
print(" ".join(str(s.getsockname()[1]) for s in mine), "|", child, flush=True)
"""


def test_a_forked_process_and_its_parent_bind_ephemeral_ports_apart(real_python, tmp_path):
    """A child would count its ephemeral ports on from its parent's count
    and take its parent's next port: it gets its ports from the controller,
    apart from every port the replica's processes hold, the primary's
    recorded and replayed alike at every replica."""
    rd = tmp_path / "rd"
    p = subprocess.run([tool("llft-run"), "--replicas", "3", "--fork", "replicate", "--run-dir", str(rd), "--",
                        real_python, "-c", EPHEMERAL_PORTS], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    outs = outputs(rd, range(3))
    assert outs[1] == outs[0] and outs[2] == outs[0], outs
    ports = [int(x) for x in outs[0].replace("|", " ").split()]
    assert len(ports) == 5 and len(set(ports)) == 5, outs[0]
    assert all(49152 <= port < 65536 for port in ports), outs[0]


@pytest.mark.parametrize("kills", [0, 2])
def test_a_start_script_running_its_server_as_a_child_serves_and_fails_over(kills, examples, tmp_path):
    """The server a start script runs without exec is a forked process: the
    gateway serves the port it listens on, every replica's server gets the
    clients' bytes, and it fails over with the script, the primary killed
    under load after the k-th reply.  Each client's counter counts on by
    one across the kills (nothing lost, nothing applied twice), the
    survivors' states and outputs are equal, and each script goes on after
    its server's exit as the primary's did."""
    from serving import Progress, ServingGroup, kill_after, line_client, line_clients
    group = ServingGroup(tmp_path / "rd", [serving.start_script(tmp_path, examples / "kv_server", 7000)],
                         extra=["--fork", "replicate"])
    nclients, nlines = 4, 120
    progress = Progress()
    at = [nclients * nlines * (k + 1) // (kills + 2) for k in range(kills)]
    results = line_clients(group, nclients, lambda i: [f"INCR c{i}"] * nlines,
                           kill_after(group, progress, *at), pause=0.001, progress=progress)
    for i, got in results.items():
        assert got == [f"VALUE {j}" for j in range(1, nlines + 1)], f"client {i}: {got}"
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    survivors = finish_survivors(group, kills)
    outs = outputs(group.run_dir, [r["precedence"] for r in survivors])
    assert outs == ["server exited 0\n"] * len(survivors), outs


def test_a_start_script_running_a_udp_server_as_a_child_serves_it(examples, tmp_path):
    """The same for a UDP port the script's child binds: served, each
    datagram answered once across a primary's death after the 20th
    reply, the survivors agreeing."""
    from serving import ServingGroup, kill_primary, udp_exchange
    group = ServingGroup(tmp_path / "rd", [serving.start_script(tmp_path, examples / "udp_server", 7000)],
                         extra=["--fork", "replicate"], wait_tcp=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.5)
        me = "127.0.0.1:%d" % s.getsockname()[1]
        udp_exchange(s, group.port, b"warm-up")   # waits until the port is served
        s.settimeout(20)
        for j in range(40):
            s.sendto(f"dgram{j}".encode(), ("127.0.0.1", group.port))
            rest = b"warm-up"
            while rest.startswith(b"warm-up"):   # (the late replies to warm-ups sent again)
                _count, rest = s.recv(70000).split(b" ", 1)
            assert rest == f"dgram{j} from {me}".encode()
            if j == 19:
                kill_primary(group.run_dir)
        s.sendto(b"SHUTDOWN", ("127.0.0.1", group.port))
        while not s.recv(70000).startswith(b"BYE"):
            pass
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
    assert outputs(group.run_dir, (1, 2)) == ["server exited 0\n"] * 2
    sent = [r["datagrams"] for r in state["replicas"][1:]]
    assert sent[1] == sent[0] and sent[0], sent


NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def nginx_conf(tmp_path, port: int, *lines: str, www=None):
    """nginx in its default process model (a master, two workers); each
    replica writes its logs in its own files.  www: where its page is
    (default: tmp_path/www)."""
    www = www or tmp_path / "www"
    www.mkdir(exist_ok=True)
    (www / "index.html").write_text("hello from nginx\n")
    (www / "index.html").chmod(0o644)
    (tmp_path / "logs").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text("\n".join(lines) + f"""
master_process on;
worker_processes 2;
pid {tmp_path}/logs/nginx.pid;
error_log {tmp_path}/logs/error.log;
events {{ worker_connections 64; }}
http {{
  access_log {tmp_path}/logs/access.log;
  client_body_temp_path {tmp_path}/body;
  proxy_temp_path {tmp_path}/proxy;
  fastcgi_temp_path {tmp_path}/fastcgi;
  uwsgi_temp_path {tmp_path}/uwsgi;
  scgi_temp_path {tmp_path}/scgi;
  server {{ listen 127.0.0.1:{port}; root {www}; }}
}}
""")
    return conf


def http_clients(group, nclients: int, requests: int, progress):
    """Keep-alive clients, each GETting / on one connection; every answer
    must be the page (none may fail)."""
    import http.client
    from serving import concurrently
    kill = kill_after_progress(group, progress)

    def client(i):
        c = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
        for _ in range(requests):
            c.request("GET", "/")
            r = c.getresponse()
            assert (r.status, r.read()) == (200, b"hello from nginx\n")
            progress.tick()
        c.close()
    concurrently(client, nclients, kill)


def kill_after_progress(group, progress):
    from serving import kill_after
    return kill_after(group, progress, *getattr(progress, "kill_at", ()))


@pytest.mark.skipif(not NGINX, reason="nginx not installed (scripts/setup.sh installs nginx-light)")
@pytest.mark.parametrize("daemon, kills, user", [("off", 0, "root"), ("off", 1, "root"), ("on", 1, "root"),
                                                 ("off", 1, "www-data")])
def test_nginx_with_its_master_and_workers_serves_and_fails_over(daemon, kills, user, tmp_path):
    """nginx as it is deployed: a master that forks two workers, which
    accept on its listener, pass each other their channels (SCM_RIGHTS)
    and share memory with it (its accept mutex and counters: named in a
    warning).  Keep-alive clients, the primary killed after the k-th
    answer: no request fails, the survivors' outputs are equal, and the
    group stops cleanly, leaving nothing behind.  With `daemon on` its
    first process forks and exits at once: each replica goes on as the
    child (native/daemon_fork.c).  With `user www-data` its workers drop
    their privileges."""
    import tempfile
    from pathlib import Path
    www = Path(tempfile.mkdtemp(prefix="llft-nginx-"))   # a page its workers can read as www-data
    www.chmod(0o755)
    try:
        serve_nginx_under_kills(tmp_path, nginx_conf(tmp_path, 7418, f"daemon {daemon};", f"user {user};", www=www),
                                kills)
    finally:
        shutil.rmtree(www)


def serve_nginx_under_kills(tmp_path, conf, kills: int):
    from serving import Progress, ServingGroup
    group = ServingGroup(tmp_path / "rd", [NGINX, "-c", conf, "-p", tmp_path], extra=["--fork", "replicate"])
    progress = Progress()
    progress.kill_at = [4 * 150 * (k + 1) // (kills + 2) for k in range(kills)]
    http_clients(group, 4, 150, progress)
    time.sleep(1.2)   # the state file is written every second
    state = json.loads((group.run_dir / "llft-run.json").read_text())
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    assert [r["role"] for r in state["replicas"]] == ["failed"] * kills + ["primary"] + ["backup"] * (2 - kills)
    assert all(r["outputs"] == survivors[0]["outputs"] for r in survivors), "surviving replicas disagree"
    assert sum(o.get("connections", 1) for o in survivors[0]["outputs"].values()) >= 4
    assert "an anonymous shared mapping" in state["forked"]["shared_memory"], "nginx's shared memory is not named"
    group.stop()
    from test_processes import no_process_left
    no_process_left(str(conf))


DNSMASQ = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin")


@pytest.mark.skipif(not DNSMASQ, reason="dnsmasq not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("mode", [["-k"], []])
def test_dnsmasq_forking_a_child_per_tcp_query_fails_over(mode, tmp_path):
    """dnsmasq -k forks a child for each TCP query, which answers it and
    exits; its parent learns of that from a SIGCHLD handler that calls
    getpid(), wherever it interrupts the parent.  Each backup runs that
    handler where the primary's ran (its own SIGCHLD does nothing), so
    the replicas agree; answered over UDP and TCP before and after the
    primary is killed.  Without -k it daemonizes as well, its parent
    waiting for the child's word: each replica goes on as that child.
    Its default configuration, as it is deployed."""
    from serving import kill_primary
    from test_processes import HOST_ANSWER, dnsmasq_argv, end, tcp_dns, udp_dns
    port = 7423 + len(mode)
    proc = subprocess.Popen([tool("llft-run"), "--replicas", "3", "--run-dir",
                             str(tmp_path / "rd"), "--", *map(str, dnsmasq_argv(tmp_path, port, *mode))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = [udp_dns(port, "box.test")] + [tcp_dns(port, "box.test") for _ in range(5)]
        kill_primary(tmp_path / "rd")
        answers += [udp_dns(port, "box.test")] + [tcp_dns(port, "box.test") for _ in range(5)]
        assert all(a.endswith(HOST_ANSWER) for a in answers), answers
        time.sleep(1.2)   # the state file is written every second
        state = json.loads((tmp_path / "rd" / "llft-run.json").read_text())
    finally:
        err = end(proc)
    assert "cannot replicate" not in err and "diverged" not in err, err
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"], err
    assert state["replicas"][1]["outputs"] == state["replicas"][2]["outputs"]


APACHE = shutil.which("apache2") or shutil.which("apache2", path="/usr/sbin")
APACHE_MODULES = "/usr/lib/apache2/modules"


def apache_conf(tmp_path, port: int, docroot, *lines: str):
    """apache in its prefork model, two servers to start with, running as
    nobody; its logs in tmp_path/logs."""
    (tmp_path / "logs").mkdir()
    conf = tmp_path / "httpd.conf"
    conf.write_text("\n".join([f"ServerRoot {tmp_path}",
                               f"LoadModule mpm_prefork_module {APACHE_MODULES}/mod_mpm_prefork.so",
                               f"LoadModule authz_core_module {APACHE_MODULES}/mod_authz_core.so",
                               f"Listen 127.0.0.1:{port}", "ServerName localhost",
                               f"PidFile {tmp_path}/logs/httpd.pid", f"ErrorLog {tmp_path}/logs/error.log",
                               f"DocumentRoot {docroot}", "StartServers 2", "User nobody", "Group nogroup",
                               f"Mutex file:{tmp_path}/logs", *lines, ""]))
    return conf


@pytest.mark.skipif(not APACHE, reason="apache2 not installed (scripts/setup.sh installs it)")
def test_apache_prefork_serves_alike_or_is_refused_naming_its_shared_memory(tmp_path):
    """apache's prefork model: a master that forks servers, and forks more
    or ends some as bursts of clients come and go, deciding by the
    scoreboard its servers write in memory they share with it, which llft
    does not order.  A backup's master that read it otherwise than the
    primary's and forked elsewhere stops the group, in one line naming
    that memory; until then, and if it never happens, every answer is the
    page and the replicas' outputs are equal.  Never served unreplicated."""
    import tempfile
    from pathlib import Path
    www = Path(tempfile.mkdtemp(prefix="llft-apache-"))   # its servers run as nobody: a page they can read
    www.chmod(0o755)
    (www / "index.html").write_text("hello from apache\n")
    (www / "index.html").chmod(0o644)
    conf = apache_conf(tmp_path, 7432, www, "MinSpareServers 1", "MaxSpareServers 3")
    try:
        bursts_until_refused(tmp_path, conf)
    finally:
        shutil.rmtree(www)


def bursts_until_refused(tmp_path, conf):
    import http.client
    import threading
    from serving import ServingGroup
    group = ServingGroup(tmp_path / "rd", [APACHE, "-f", conf, "-DFOREGROUND"], extra=["--fork", "replicate"])
    answers, failures = [], []

    def client():
        try:
            for _ in range(10):
                c = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
                c.request("GET", "/index.html")
                r = c.getresponse()
                answers.append((r.status, r.read()))
                c.close()
        except OSError as e:       # the group stopped: its clients' connections end
            failures.append(e)
    for _ in range(8):
        threads = [threading.Thread(target=client) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if group.proc.poll() is not None:
            break
        time.sleep(1.5)            # the servers idle: the master ends some
    assert answers and all(a == (200, b"hello from apache\n") for a in answers), answers[:3]
    time.sleep(1.2)                # the state file is written every second
    state = json.loads((group.run_dir / "llft-run.json").read_text())
    group.stop()
    if group.proc.returncode == 1:   # refused: said in one line, the program's shared memory named
        err = group.proc.stderr.read()
        line = [ln for ln in err.splitlines() if "cannot replicate the program" in ln]
        assert line and "processes share memory (an anonymous shared mapping" in line[0], err
    else:                            # served alike all along
        assert not failures, failures[:3]
        assert [r["role"] for r in state["replicas"]] == ["primary", "backup", "backup"]
        assert state["replicas"][1]["outputs"] == state["replicas"][0]["outputs"]



@pytest.mark.parametrize("kills", [1, 2])
def test_a_server_forking_a_child_per_connection_counts_exactly_once(kills, examples, tmp_path):
    """fork_counter forks a child per client connection, and each child
    asks the parent over a pipe for the next count of each line: llft-run
    replicates it as it is (no option), the primary killed under load
    after the k-th reply; every count is given once, each client's lines
    answered in order, the survivors' outputs equal."""
    from serving import ServingGroup, line_client
    from test_failover import check_exactly_once, run_clients
    group = ServingGroup(tmp_path / "rd", [examples / "fork_counter", 7000])
    results = run_clients(group, nclients=4, nlines=150, kills=kills)
    check_exactly_once(results, 4, 150)
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    assert len(survivors) == 3 - kills and all(r["status"] == 0 for r in survivors)
    assert all(r["outputs"] == survivors[0]["outputs"] for r in survivors), "surviving replicas disagree"


@pytest.mark.parametrize("server", ["prefork_server", "fork_counter", "start script"])
def test_a_forking_server_with_respawn_survives_four_primary_kills(server, examples, tmp_path):
    """--respawn with every forked process replicated: the primary killed
    four times under load, each time once the group has recovered, so
    that replacements take over in turn.  A replacement replays the
    group's history, its processes forked as its replay reaches each fork,
    each fed its own stream's history and handed the connections its
    counterpart accepted; it has caught up only once every one of them
    has.  Nothing lost or applied twice, the survivors' outputs equal."""
    from serving import Progress, ServingGroup, kill_and_recover, line_client, line_clients
    from test_failover import check_exactly_once
    argv = {"prefork_server": [examples / "prefork_server", 7000, 2],
            "fork_counter": [examples / "fork_counter", 7000],
            "start script": [serving.start_script(tmp_path, examples / "kv_server", 7000)]}[server]
    group = ServingGroup(tmp_path / "rd", argv, extra=["--respawn"])
    progress = Progress()
    lines = (lambda i: [f"INCR c{i}"] * 150) if server == "start script" else (lambda i: [f"c{i}-{j}" for j in range(150)])
    results = line_clients(group, 4, lines, kill_and_recover(group, progress, 100, 4), pause=0.001,
                           progress=progress)
    if server == "prefork_server":
        check_worker_counts(results, 150)
        shut_down_workers(group, 2)
    else:
        if server == "fork_counter":
            check_exactly_once(results, 4, 150)
        else:
            for i, got in results.items():
                assert got == [f"VALUE {j}" for j in range(1, 151)], f"client {i}: {got}"
        with group.connect() as s:
            assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed"] * 4 + ["primary", "backup", "backup"]
    live = state["replicas"][4:]
    assert all(r["outputs"] == live[0]["outputs"] for r in live), "surviving replicas disagree"


@pytest.mark.parametrize("order", serving.ORDERS)
def test_a_replacement_replays_forked_processes_that_ended_long_before(order, examples, tmp_path):
    """fork_counter forks a child per connection, and each connection here
    closes at once: by the time a replacement starts, most children have
    ended at every replica.  Their streams' histories are kept (--respawn),
    so that the replacement's children, forked as its replay reaches each
    fork, replay theirs to their end; were they forgotten, it would wait
    for a child that never gets a record, and the group would be lost at
    the next kill.  Three kills, each after ten more connections.  Over mailboxes,
    an ended child's mailbox goes once every replica's child has ended: none
    is left at the end but the group's own."""
    from pathlib import Path
    from llft.nemesis.faults import Group
    from serving import ServingGroup, line_client, order_args
    group = ServingGroup(tmp_path / "rd", [examples / "fork_counter", 7000], extra=["--respawn", *order_args(order)])
    members, counts = Group(group.run_dir), []
    for k in range(3):
        for i in range(10):
            with group.connect() as s:
                counts += [int(r.split()[0]) for r in line_client(s, [f"a{k}{i}", f"b{k}{i}"])[0]]
        primary = members.primary()
        members.signal(primary, signal.SIGKILL)
        members.wait_recovered(3, {primary.index})
    assert counts == list(range(1, 61))
    forked_mailboxes = lambda: list(Path("/dev/shm").glob(f"llft-mbx-{group.proc.pid}-*-fork-*"))
    deadline = time.monotonic() + 10
    while forked_mailboxes() and time.monotonic() < deadline:   # (ended streams are closed each second)
        time.sleep(0.1)
    assert not forked_mailboxes(), "the mailboxes of children long ended are still there"
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    live = [r for r in state["replicas"] if r["role"] != "failed"]
    assert len(live) == 3 and all(r["outputs"] == live[0]["outputs"] for r in live)


@pytest.mark.parametrize("mode", [[], ["stay"]], ids=["session-of-its-own", "stays-in-its-parents"])
def test_a_daemons_parent_at_a_backup_waits_for_its_own_childs_word(mode, examples, tmp_path):
    """daemon_word's parent exits once its child closes the pipe between
    them, the word that the server is up (dnsmasq's shape).  A backup's
    parent leaves only once its own child has said so, not as soon as the
    primary's end of the pipe is on record: otherwise it leaves while its
    child is still setting up, before the daemon the backup goes on as
    exists, and the backup is lost.  Its child is held stopped here for a
    second past the primary's word; the backup then goes on as its daemon
    and takes over from a killed primary.  With "stay" the child serves in
    its parent's session, as it goes on unreplicated once the parent has
    left: each replica goes on as it all the same."""
    from serving import free_port, kill_primary, line_client
    from test_group_lifecycle import wait_for
    from test_processes import end

    def pids(what="pid"):
        return [r[what] for r in json.loads((rd / "llft-run.json").read_text())["replicas"]]

    port = free_port()
    proc, rd = start(tmp_path, [examples / "daemon_word", port, 1000, *mode])
    try:
        first = wait_for(lambda: (rd / "llft-run.json").exists() and pids(), "the replicas' first processes")
        setting_up = wait_for(lambda: psutil.Process(first[1]).children(), "the backup's child")[0]
        setting_up.suspend()
        assert setting_up.children() == [], "the backup's daemon was forked before its parent could be held"
        wait_for(lambda: pids()[0] != first[0], "the primary to go on as its daemon")
        time.sleep(1.0)
        assert setting_up.status() == psutil.STATUS_STOPPED, "the backup's child, held, did not outlive its parent"
        assert psutil.Process(first[1]).status() != psutil.STATUS_ZOMBIE, "the backup's parent left without the word"
        setting_up.resume()
        log = rd / "llft.log"
        wait_for(lambda: pids()[1] != first[1] or "diverged" in log.read_text(), "the backup to go on")
        assert pids()[1] != first[1], log.read_text()
        with socket.create_connection(("127.0.0.1", port)) as s:
            before = line_client(s, ["a", "b"])[0]
            kill_primary(rd)
            after = line_client(s, ["c", "d"])[0]
        assert before + after == ["1 a", "2 b", "3 c", "4 d"]
        wait_for(lambda: pids("role")[:2] == ["failed", "primary"], "replica 1 to take over")
    finally:
        err = end(proc)
    assert "diverged" not in err, err


def test_a_server_starting_detached_helpers_sees_each_helpers_parent_exit_at_once(examples, tmp_path):
    """spawn_detached starts a helper for each line: it forks, the child
    starts a session, forks the helper (which runs 30 s) and exits 3 at
    once, and the server reaps the child before it replies.  That wait
    sees the child's own exit, at once and with its status, as it does
    unreplicated: a forked process that forks and exits does exit (only the
    replica's first process goes on as its child, daemon_fork.c).  Five
    lines, the primary killed, five more on the same connection."""
    from serving import ServingGroup, kill_primary, line_client
    group = ServingGroup(tmp_path / "rd", [examples / "spawn_detached", 7000])
    with group.connect() as s:
        s.settimeout(10)   # (a helper's 30 s would be waited for)
        replies = line_client(s, [f"a{i}" for i in range(5)])[0]
        kill_primary(group.run_dir)
        replies += line_client(s, [f"b{i}" for i in range(5)])[0]
    lines = [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]
    assert replies == [f"{n} {w} helper started, its parent exited 3" for n, w in enumerate(lines, 1)]
    group.stop()
    state = group.finish()
    assert "diverged" not in group.stderr, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"], group.stderr


@pytest.mark.parametrize("started_by", ["fork", "fork and exec"])
def test_a_child_feeding_its_parent_keeps_feeding_across_failovers(started_by, examples, tmp_path):
    """child_feed's child writes into a pipe to its parent every
    millisecond and exits the moment a write fails.  Killing the primary
    kills its parent first, and its child sees the broken pipe at once,
    before the controller fences it: were that recorded, every backup's
    child would exit as well, and the server that takes over would answer
    FEED GONE.  The replica lease (native/replica_lease.c) stops the child
    recording first, a child that exec'd another image too: across two
    kills each new primary's feed goes on."""
    from serving import ServingGroup, kill_primary, line_client
    group = ServingGroup(tmp_path / "rd", [examples / "child_feed", 7000, *(["exec"] if "exec" in started_by else [])])

    def feed() -> int:
        with group.connect() as s:
            replies, _ = line_client(s, ["FEED"])
        assert replies[0] != "FEED GONE", "the failed primary's broken pipe reached the backups"
        return int(replies[0].split()[1])

    for _ in range(2):
        before = feed()
        kill_primary(group.run_dir)
        deadline = time.monotonic() + 30
        while feed() < before + 100:   # the new primary's child feeds it
            assert time.monotonic() < deadline, "the feed stopped after the failover"
            time.sleep(0.02)
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    assert [r["role"] for r in state["replicas"]] == ["failed", "failed", "primary"]
    assert all(r["status"] == 0 for r in survivors)


GRACEFUL_SERVER = """
import os, signal, socket, sys, time
if os.environ.get("LLFT_REPLICA") == "002":
    sum(range(40_000_000))   # a backup behind its primary: it has not installed its handler yet
def stop(*_):
    time.sleep(0.3)   # what a server does as it stops takes its time
    print("graceful stop", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hello\\n")
    c.close()
"""


@pytest.mark.parametrize("started_by", ["first process", "start script"])
def test_stopping_the_group_stops_its_server_as_a_service_manager_would(real_python, tmp_path, started_by):
    """llft-run stopped (SIGTERM) stops its group as a service manager
    stops a service: SIGTERM to the primary's processes (the server a
    start script runs included), and time to end by themselves.  The
    server's handler runs at the primary, sleeps there, and its backups
    replay it and the primary's end from its records, a backup still
    behind its primary too: replica 2 computes for a while before it
    installs its handler, and is stopped while it does.  A real SIGTERM
    there would end it at once, by the signal's default action, its
    handler never run."""
    from serving import ServingGroup
    server = tmp_path / "server.py"
    server.write_text(GRACEFUL_SERVER)
    argv = ([serving.start_script(tmp_path, real_python, server, 7000)] if started_by == "start script"
            else [real_python, server, 7000])
    group = ServingGroup(tmp_path / "rd", argv, extra=["--fork", "replicate"])
    with group.connect() as s:
        assert s.makefile().readline() == "hello\n"
    wait_for_line(group.run_dir / "replica-0" / "stdout", "ready", group.proc)
    assert "ready" not in (group.run_dir / "replica-2" / "stdout").read_text(), "replica 2 was not behind"
    group.proc.send_signal(signal.SIGTERM)
    group.finish()
    assert group.proc.returncode == 128 + signal.SIGTERM, group.stderr
    assert "diverge" not in group.stderr, group.stderr
    assert outputs(group.run_dir, range(3)) == ["ready\ngraceful stop\n"] * 3, group.stderr


DIVERGING_PARENT = """
import os, time
pid = os.fork()
if pid == 0:
    os.setsid()   # a session of its own, as a daemon's child makes
    time.sleep(2)
    os._exit(0)
time.sleep(0.2)
if os.environ.get("LLFT_REPLICA") == "001":
    time.time()   # a clock read the primary did not make: this backup diverges
os.waitpid(pid, 0)
print("parent done", flush=True)
"""


def test_a_backups_first_process_that_diverges_is_not_taken_for_a_daemons_parent(real_python, tmp_path):
    """A backup's first process exits only once its primary's has (its exit
    waits for the end of the primary's stream): one that exits before,
    here by diverging, leaving a child in a session of its own, diverged.
    It is reported so, not followed into its child as a daemon's parent
    would be (apache prefork's master, diverging on its shared scoreboard,
    was taken so and its backup stalled unreported)."""
    rd = tmp_path / "rd"
    p = subprocess.run([tool("llft-run"), "--replicas", "3", "--fork", "replicate", "--run-dir", str(rd), "--",
                        real_python, "-c", DIVERGING_PARENT], capture_output=True, text=True, timeout=90)
    assert p.returncode == 86, p.stderr
    assert "replica 1 (backup)" in p.stderr and "diverged" in p.stderr, p.stderr
    assert "goes on as process" not in (rd / "llft.log").read_text()
    assert outputs(rd, (0, 2)) == ["parent done\n"] * 2
