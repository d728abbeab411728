"""Each replica writes into its own view of the files (llft/private_files.py):
servers with a data directory or logs, as they are deployed.  The machine's
files stay as they were; a backup's files follow the primary's writes, so a
backup that takes over continues the data files where the group left them;
and programs see the fd numbers the kernel gave the primary (lighttpd sizes
its connection budget by them)."""
from __future__ import annotations

import hashlib
import http.client
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import tool
from llft.private_files import plan, where
from serving import Progress, ServingGroup, concurrently, free_port, kill_after, kill_primary
from test_serving import read_resp, resp

REDIS = shutil.which("redis-server")
LIGHTTPD = shutil.which("lighttpd") or shutil.which("lighttpd", path="/usr/sbin")


def tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def replica_copy(state: dict, k: int, path: Path) -> Path:
    """Where replica k's writes under path went."""
    files = state["replicas"][k]["files"]
    assert files, f"replica {k} ran without private files"
    found = where(Path(files), str(path))
    assert found is not None, f"{path} is on no overlaid filesystem"
    return found


def test_the_plan_overlays_writable_trees_and_binds_back_what_they_hide(tmp_path):
    from llft.private_files import Mount
    table = [Mount("/", "ext4", False), Mount("/proc", "proc", False), Mount("/dev", "devtmpfs", False),
             Mount("/dev/shm", "tmpfs", False), Mount("/run/netns", "ext4", False),
             Mount("/run/netns/h1", "nsfs", False), Mount("/srv/ro", "ext4", True)]
    steps = plan(tmp_path, table)
    overlaid = [s[1] for s in steps if s[0] == "overlay"]
    bound = [s[1] for s in steps if s[0] == "bind"]
    assert "/dev/shm" in overlaid and "/run/netns" in overlaid and "/tmp" in overlaid
    assert not any(p in ("/proc", "/dev", "/sys") for p in overlaid), "kernel trees stay the kernel's"
    assert bound == ["/srv/ro", "/run/netns/h1"] or sorted(bound) == ["/run/netns/h1", "/srv/ro"]
    order = [s[1] for s in steps]
    assert order.index("/run") < order.index("/run/netns") < order.index("/run/netns/h1"), \
        "a mount is made after the overlay that would hide it"
    layers = {s[2] for s in steps if s[0] == "overlay"}
    assert len(layers) == len(overlaid), "two overlays share an upper layer"


def test_a_mount_gone_since_the_plan_does_not_stop_a_replica(tmp_path):
    """A mount the plan binds back above an overlay (a network namespace's
    file under /run/netns, say) may be removed before the replica starts:
    the replica starts all the same, without it."""
    import os
    from llft.private_files import enter, prepare
    point = Path(f"/run/llft-test-vanishing-{os.getpid()}")
    source = tmp_path / "source"
    source.write_text("x")
    point.write_text("")
    subprocess.run(["mount", "--bind", str(source), str(point)], check=True)
    try:
        text = prepare(tmp_path / "files")
        assert f"bind\t{point}\n".encode() in text
    finally:
        subprocess.run(["umount", str(point)], check=True)
        point.unlink()
    started = subprocess.run(["/bin/true"], preexec_fn=lambda: enter(text), capture_output=True, text=True)
    assert started.returncode == 0, started.stderr


def test_a_scratch_mount_gone_since_the_plan_does_not_stop_a_replica(tmp_path):
    """A writable mount the plan overlays (a tool's scratch tmpfs under
    /tmp, as criu mounts one for a moment) may be gone before the replica
    starts: the replica starts all the same, the mount above covering its
    path."""
    import os
    from llft.private_files import enter, prepare
    point = Path(f"/tmp/llft-test-scratch-{os.getpid()}")
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "scratch", str(point)], check=True)
    try:
        text = prepare(tmp_path / "files")
        assert str(point).encode() in text, "the plan overlays the scratch mount"
    finally:
        subprocess.run(["umount", str(point)], check=True)
        point.rmdir()
    started = subprocess.run(["/bin/true"], preexec_fn=lambda: enter(text), capture_output=True, text=True)
    assert started.returncode == 0, started.stderr


def incr_clients(group: ServingGroup, nclients: int, each: int, kill_at: int) -> list[int]:
    seen: dict[int, list[int]] = {}
    progress = Progress()

    def client(i):
        with group.connect() as s:
            f = s.makefile("rwb")
            seen[i] = []
            for _ in range(each):
                f.write(resp("INCR", "counter"))
                f.flush()
                seen[i].append(int(read_resp(f)))
                progress.tick()

    concurrently(client, nclients, kill_after(group, progress, kill_at))
    return sorted(v for vs in seen.values() for v in vs)


def redis_command(group: ServingGroup, *args: str):
    with group.connect() as s:
        f = s.makefile("rwb")
        f.write(resp(*args))
        f.flush()
        return read_resp(f)


def redis_shutdown(group: ServingGroup):
    """SHUTDOWN answers nothing: redis closes the connection and exits."""
    with group.connect() as s:
        s.sendall(resp("SHUTDOWN"))
        assert s.recv(100) == b""


def aof_incrs(d: Path) -> int:
    return sum(p.read_bytes().count(b"$4\r\nINCR\r\n") for p in d.glob("*.aof"))


@pytest.mark.skipif(not REDIS, reason="redis-server not installed (scripts/setup.sh installs it)")
def test_redis_with_appendonly_fails_over_and_its_data_continues(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    group = ServingGroup(tmp_path / "rd", [REDIS, "--port", str(free_port()), "--dir", data, "--save", "",
                                           "--appendonly", "yes", "--appendfsync", "everysec"])
    values = incr_clients(group, 3, 1000, kill_at=250)
    assert values == list(range(1, 3001)), "an INCR was lost or applied twice"
    assert redis_command(group, "GET", "counter") == "3000"
    redis_shutdown(group)
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
    assert list(data.iterdir()) == [], "a replica wrote the machine's data directory"

    aof = {k: replica_copy(state, k, data) / "appendonlydir" for k in range(3)}
    assert aof_incrs(aof[1]) == 3000, "the new primary's AOF does not hold every acknowledged INCR"
    assert tree_digest(aof[1]) == tree_digest(aof[2]), "the backup's data files differ from its primary's"
    assert aof_incrs(aof[0]) >= 250, "the killed primary's AOF lacks INCRs it acknowledged"


@pytest.mark.skipif(not REDIS, reason="redis-server not installed (scripts/setup.sh installs it)")
def test_redis_daemonized_is_followed_and_fails_over(tmp_path):
    """redis with daemonize yes forks and its parent exits: each replica
    goes on as the child (daemon_fork.c), and INCRs come exactly once
    across a primary kill."""
    group = ServingGroup(tmp_path / "rd", [REDIS, "--port", str(free_port()), "--dir", tmp_path, "--save", "",
                                           "--appendonly", "no", "--daemonize", "yes"])
    assert incr_clients(group, 3, 300, kill_at=250) == list(range(1, 901)), "an INCR was lost or applied twice"
    redis_shutdown(group)
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]


@pytest.mark.skipif(not REDIS, reason="redis-server not installed (scripts/setup.sh installs it)")
def test_redis_loads_an_existing_aof_alike_at_every_replica(tmp_path):
    """Files the program did not write read the same at every replica: an
    AOF made before the group started is loaded by all three, unchanged."""
    data = tmp_path / "data"
    data.mkdir()
    port = free_port()
    plain = subprocess.Popen([REDIS, "--port", str(port), "--dir", data, "--save", "", "--appendonly", "yes"],
                             stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                time.sleep(0.05)
        with s:
            f = s.makefile("rwb")
            for _ in range(7):
                f.write(resp("INCR", "counter"))
                f.flush()
                read_resp(f)
            f.write(resp("SHUTDOWN"))
            f.flush()
        plain.wait(timeout=30)
    finally:
        if plain.poll() is None:
            plain.kill()
    before = tree_digest(data)
    assert before, "redis wrote no AOF"

    group = ServingGroup(tmp_path / "rd", [REDIS, "--port", str(free_port()), "--dir", data, "--save", "",
                                           "--appendonly", "yes"])
    values = incr_clients(group, 3, 50, kill_at=40)
    assert values == list(range(8, 158)), "the replicas did not continue from the existing AOF"
    redis_shutdown(group)
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
    assert tree_digest(data) == before, "a replica changed the machine's AOF"


def pages_under_a_kill(group: ServingGroup, page: bytes, clients: int = 3, each: int = 100,
                       kill_at: int = 120, after: int = 10) -> dict[int, list[bool]]:
    """Each client GETs / each times on one keep-alive connection while the
    primary is killed after the kill_at-th answer; per client, whether each
    answer was 200 with the page.  Each client's last `after` requests wait
    for the kill, so that some come after it however slowly llft-kill runs
    (a loaded machine took longer to start it than the clients took to
    finish, and the group was stopped before it could fail over)."""
    import threading
    progress = Progress()
    served: dict[int, list[bool]] = {}
    killed = threading.Event()

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
        served[i] = []
        for j in range(each):
            if j == each - after:
                assert killed.wait(60), "the primary was not killed"
            conn.request("GET", "/")
            r = conn.getresponse()
            body = r.read()
            served[i].append(r.status == 200 and body == page)
            progress.tick()
        conn.close()

    def kill():
        kill_after(group, progress, kill_at)()
        killed.set()
    concurrently(client, clients, kill)
    return served


LIGHTTPD_CONF = """\
server.modules = ("mod_accesslog")
server.document-root = "{root}/www"
server.port = {port}
server.bind = "127.0.0.1"
server.errorlog = "{root}/logs/error.log"
accesslog.filename = "{root}/logs/access.log"
server.pid-file = "{root}/logs/lighttpd.pid"
server.username = ""
index-file.names = ("index.html")
"""


@pytest.mark.skipif(not LIGHTTPD, reason="lighttpd not installed (scripts/setup.sh installs it)")
def test_lighttpd_daemonizing_is_refused_with_the_foreground_advice_with_fork_unrecorded(tmp_path):
    """lighttpd without -D daemonizes, its parent waiting on a pipe for the
    child's word before it exits: with --fork unrecorded the child, not the
    replica, would serve.  Refused in one line that says to run it in the
    foreground (replicated otherwise: test_forked_processes.py)."""
    (tmp_path / "www").mkdir()
    (tmp_path / "logs").mkdir()
    conf = tmp_path / "lighttpd.conf"
    conf.write_text(LIGHTTPD_CONF.format(root=tmp_path, port=free_port()))
    p = subprocess.run([tool("llft-run"), "--replicas", "3", "--run-dir", str(tmp_path / "rd"), "--fork",
                        "unrecorded", "--", LIGHTTPD, "-f", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    line = [ln for ln in p.stderr.splitlines() if "cannot replicate" in ln]
    assert line and "run the server in the foreground (lighttpd -D" in line[0], p.stderr


@pytest.mark.skipif(not LIGHTTPD, reason="lighttpd not installed (scripts/setup.sh installs it)")
@pytest.mark.parametrize("mode", [["-D"], []])
def test_lighttpd_serves_across_failovers_with_its_own_logs(mode, tmp_path):
    """lighttpd derives its connection budget from the fd number
    open("/dev/null") returns and writes a pid file with O_EXCL: each
    backup must see the primary's numbers and its own files, or it stops
    accepting once it takes over.  Two kills: under keep-alive load, then
    with the group idle right after every connection closed.  In the
    foreground (-D), and daemonized as deployed: it forks, its child starts
    a session of its own and says on a pipe it is ready, and the parent
    exits; each replica goes on as that child (docs/forked-processes.md)."""
    (tmp_path / "www").mkdir()
    (tmp_path / "logs").mkdir()
    page = b"<h1>llft</h1>\n" * 50
    (tmp_path / "www" / "index.html").write_bytes(page)
    conf = tmp_path / "lighttpd.conf"
    conf.write_text(LIGHTTPD_CONF.format(root=tmp_path, port=free_port()))
    group = ServingGroup(tmp_path / "rd", [LIGHTTPD, *mode, "-f", conf])
    served = pages_under_a_kill(group, page)
    assert all(s == [True] * 100 for s in served.values()), served

    kill_primary(group.run_dir)             # idle: every connection has closed
    for _ in range(20):
        conn = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
        conn.request("GET", "/")
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, page)
        conn.close()
    group.stop()
    state = group.finish()
    assert [r["role"] for r in state["replicas"]] == ["failed", "failed", "primary"]
    assert not (tmp_path / "logs" / "access.log").exists(), "a replica wrote the machine's log"
    for k in range(3):
        logs = replica_copy(state, k, tmp_path / "logs")
        errors = (logs / "error.log").read_text()
        assert "out-of-fds" not in errors, f"replica {k}: {errors}"
    final = replica_copy(state, 2, tmp_path / "logs") / "access.log"
    assert len(final.read_text().splitlines()) == 320, "each request is logged once in the replica's own log"


NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


@pytest.mark.skipif(not NGINX, reason="nginx not installed (scripts/setup.sh installs nginx-light)")
@pytest.mark.parametrize("daemon", ["off", "on"])
def test_nginx_single_process_fails_over_and_logs_once_per_replica(daemon, tmp_path):
    """nginx with master_process off, in the foreground or daemonized (its
    parent writes the pid file and exits; each replica goes on as the
    child, daemon_fork.c): each replica's access.log in its own files has
    every request once, the machine's log directory stays empty, and a kill
    under keep-alive load loses no request."""
    (tmp_path / "www").mkdir()
    (tmp_path / "logs").mkdir()
    page = b"<p>llft</p>\n" * 40
    (tmp_path / "www" / "index.html").write_bytes(page)
    conf = tmp_path / "nginx.conf"
    temp = " ".join(f"{kind}_temp_path {tmp_path}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                         "scgi"))
    conf.write_text(f"""daemon {daemon};
master_process off;
pid {tmp_path}/logs/nginx.pid;
error_log {tmp_path}/logs/error.log;
events {{ worker_connections 64; }}
http {{
  access_log {tmp_path}/logs/access.log;
  {temp}
  server {{ listen 127.0.0.1:{free_port()}; root {tmp_path}/www; }}
}}
""")
    group = ServingGroup(tmp_path / "rd", [NGINX, "-c", conf, "-p", tmp_path])
    served = pages_under_a_kill(group, page)
    assert all(s == [True] * 100 for s in served.values()), served
    group.stop()
    state = group.finish()
    assert [r["role"] for r in state["replicas"]] == ["failed", "primary", "backup"]
    assert list((tmp_path / "logs").iterdir()) == [], "a replica wrote the machine's logs"
    logs = {k: (replica_copy(state, k, tmp_path / "logs") / "access.log").read_text().splitlines() for k in (1, 2)}
    assert len(logs[1]) == 300, "the new primary's log lacks requests, or has some twice"
    assert [ln.split('"')[1] for ln in logs[1]] == [ln.split('"')[1] for ln in logs[2]]
