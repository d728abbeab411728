"""Outgoing connections: a replicated program's connect() to a server
outside the group (examples/proxy_server.c in front of a backend the test
starts unreplicated).  The backend sees each connection and each request
once, not once per replica; every replica computes the same output; a
refused connect is replayed as refused; when the primary is killed the
remote TCP connection survives and the backend gets nothing twice and
misses nothing."""
from __future__ import annotations

import http.client
import http.server
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import PROGRAMS_DIR, tool
from serving import (Progress, ServingGroup, concurrently, free_port, kill_after, line_client, line_clients,
                     start_script)
from test_rejoin import full_and_caught_up, wait_for


class RecordingBackend:
    """A line server outside the group: answers each line with "<n> <line>"
    (n: lines it has served so far) and keeps every connection's lines, so
    that a request that reached it once per replica would show.  HANGUP:
    it closes the connection without an answer."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.served = 0
        self.conns: list[list[str]] = []     # each connection's lines, in arrival order
        self.ended: set[int] = set()          # connections the proxy closed
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append([])
                k = len(self.conns) - 1
            threading.Thread(target=self._serve, args=(k, conn), daemon=True).start()

    def _serve(self, k: int, conn: socket.socket):
        with conn, conn.makefile("rwb") as f:
            for raw in f:
                line = raw.decode().rstrip("\n")
                with self.lock:
                    self.conns[k].append(line)
                    if line == "HANGUP":
                        break
                    self.served += 1
                    n = self.served
                f.write(f"{n} {line}\n".encode())
                f.flush()
        with self.lock:
            self.ended.add(k)

    def wait_ended(self, n: int, timeout: float = 30):
        end = time.monotonic() + timeout
        while len(self.ended) < n and time.monotonic() < end:
            time.sleep(0.02)

    def close(self):
        self.server.close()


@pytest.fixture
def backend():
    b = RecordingBackend()
    yield b
    b.close()


def proxy_group(tmp_path, examples, backend_port: int, replicas=3, extra=(), script=False) -> ServingGroup:
    """script: the proxy runs as the child of a start script (no exec),
    a process the program forked, replicated with it."""
    argv = [examples / "proxy_server", 7000, backend_port]
    if script:
        argv, extra = [start_script(tmp_path, *argv)], [*extra, "--fork", "replicate"]
    return ServingGroup(tmp_path / "rd", argv, replicas=replicas, extra=extra)


def finish(group: ServingGroup, dropped: int = 0) -> dict:
    """SHUTDOWN, then the run's state: the live replicas agree byte for byte
    on what they sent the clients and what they sent the remote servers."""
    with group.connect() as s:
        assert line_client(s, ["SHUTDOWN"])[0] == ["BYE"]
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    live = [r for r in state["replicas"] if r["role"] != "failed"]
    assert all(r["status"] == 0 for r in live)
    for r in live[1:]:
        assert r["outputs"] == live[0]["outputs"], "replicas sent the clients different bytes"
        assert r["outgoing"] == live[0]["outgoing"], "replicas wrote different bytes to the remote servers"
    assert state["outgoing"]["dropped"] == dropped, state["outgoing"]["errors"]
    return state


def client_lines(i: int, n: int) -> list[str]:
    return [f"c{i}-{j}" for j in range(n)]


def check_backend_got_each_line_once(backend: RecordingBackend, results: dict, nclients: int, nlines: int):
    """One backend connection per client, with exactly that client's lines,
    in order; the replies number every line the backend served, 1..n."""
    assert sorted(backend.conns) == sorted(client_lines(i, nlines) for i in range(nclients))
    numbers = sorted(int(r.split()[0]) for got in results.values() for r in got)
    assert numbers == list(range(1, nclients * nlines + 1))
    for i, got in results.items():
        assert [r.split(" ", 1)[1] for r in got] == client_lines(i, nlines)


def run_clients(group, nclients, nlines, meanwhile=None, pause=0.0, progress=None) -> dict:
    return line_clients(group, nclients, lambda i: client_lines(i, nlines), meanwhile, pause, progress)


def test_backend_sees_each_request_once_and_replicas_agree(examples, tmp_path, backend):
    group = proxy_group(tmp_path, examples, backend.port)
    results = run_clients(group, nclients=4, nlines=60)
    check_backend_got_each_line_once(backend, results, 4, 60)
    backend.wait_ended(4)
    assert backend.ended == {0, 1, 2, 3}, "the program's close reaches the backend"
    state = finish(group)
    assert state["outgoing"]["connections"] == 4
    assert [len(r["outgoing"]) for r in state["replicas"]] == [4, 4, 4]


def test_kv_server_backend_applies_each_increment_once(examples, tmp_path):
    port = free_port()
    kv = subprocess.Popen([examples / "kv_server", str(port)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "kv_server did not start"
                time.sleep(0.02)
        group = proxy_group(tmp_path, examples, port)
        counts: dict[int, list[int]] = {}

        def client(i):
            with group.connect() as s:
                replies, _ = line_client(s, ["INCR shared"] * 25)
                counts[i] = [int(r.split()[1]) for r in replies]
        concurrently(client, 3)
        assert sorted(n for c in counts.values() for n in c) == list(range(1, 76))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            assert line_client(s, ["GET shared"])[0] == ["VALUE 75"], "each INCR applied once, not per replica"
        finish(group)
    finally:
        kv.kill()
        kv.wait()


def test_refused_and_accepted_connects_replay_alike(examples, tmp_path, backend):
    closed = free_port()   # nothing listens there
    group = proxy_group(tmp_path, examples, backend.port)
    with group.connect() as s:
        replies, _ = line_client(s, [f"PROBE {closed}", f"CONNECT {closed}", f"PROBE {backend.port}",
                                     f"CONNECT {backend.port}", "hello"])
    assert replies == ["PROBE Connection refused", "CONNECT Connection refused",
                       f"PROBE connected {backend.port}", f"CONNECT connected {backend.port}", "1 hello"]
    backend.wait_ended(2)
    assert backend.conns == [[], [], ["hello"]], "two probes and the forwarding connection, once each"
    wait_for(lambda st: (st.get("outgoing") or {}).get("failed") == 2, "the state file counts the connects", group)
    status = subprocess.run([tool("llft-status"), "--run-dir", str(group.run_dir)], capture_output=True, text=True,
                            timeout=30)
    assert "outgoing: 3 connections (2 connects failed)" in status.stdout, status.stdout
    state = finish(group)
    assert state["outgoing"]["connections"] == 3 and state["outgoing"]["failed"] == 2


def test_remote_close_reaches_every_replica(examples, tmp_path, backend):
    group = proxy_group(tmp_path, examples, backend.port)
    with group.connect() as s:
        replies, _ = line_client(s, ["a", "HANGUP", "b"])
    assert replies == ["1 a", "ERROR backend closed", "2 b"], "the program saw the backend's close, then reconnected"
    assert backend.conns == [["a", "HANGUP"], ["b"]]
    state = finish(group)
    assert [sorted(r["outgoing"]) for r in state["replicas"]] == [["1", "2"]] * 3


@pytest.mark.parametrize("kills, script", [(1, False), (2, False), (2, True)])
def test_primary_killed_mid_workload_keeps_the_remote_connection(kills, script, examples, tmp_path, backend):
    """(script: the proxy is a start script's child, whose connections are
    numbered apart from its parent's.)"""
    group = proxy_group(tmp_path, examples, backend.port, script=script)
    progress = Progress()
    results = run_clients(group, nclients=3, nlines=300, meanwhile=kill_after(group, progress, *[300, 600][:kills]),
                          pause=0.002, progress=progress)
    check_backend_got_each_line_once(backend, results, 3, 300)
    state = finish(group)
    assert state["gateway"]["failovers"] == kills
    assert [r["role"] for r in state["replicas"]].count("failed") == kills
    assert state["outgoing"]["connections"] == 3, "the remote connections outlived the primary"


def test_replacement_replays_the_remote_bytes_and_sends_nothing(examples, tmp_path, backend):
    """--respawn: the replacement of a killed primary replays every connect
    and gets every remote connection's bytes from the first; the backend
    sees nothing more."""
    group = proxy_group(tmp_path, examples, backend.port, extra=["--respawn"])
    progress = Progress()
    results = run_clients(group, nclients=3, nlines=200, meanwhile=kill_after(group, progress, 250), pause=0.002,
                          progress=progress)
    wait_for(full_and_caught_up(3), "three live replicas, the replacement caught up", group)
    check_backend_got_each_line_once(backend, results, 3, 200)
    state = finish(group)
    replacement = next(r for r in state["replicas"] if r["replaces"] is not None)
    assert len(replacement["outgoing"]) == 3, "the replacement replayed the three backend connections"
    assert state["outgoing"]["connections"] == 3


def test_python_http_client_behind_a_replicated_http_server(real_python, tmp_path):
    """CPython's http.client connects with a timeout: a non-blocking
    connect, poll for writability, SO_ERROR.  The backend HTTP server
    answers each request it gets with its count."""
    got: list[str] = []
    lock = threading.Lock()

    class Backend(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with lock:
                got.append(self.path)
                body = f"{len(got)} {self.path}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    try:
        group = ServingGroup(tmp_path / "rd", [real_python, PROGRAMS_DIR / "http_gateway.py", 8080,
                                               backend.server_address[1]])
        bodies = {}

        def client(i):
            c = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
            bodies[i] = []
            for j in range(5):
                c.request("GET", f"/fetch/c{i}/{j}")
                r = c.getresponse()
                bodies[i].append((r.status, r.read().decode()))
            c.close()
        concurrently(client, 3)
        assert sorted(got) == sorted(f"/c{i}/{j}" for i in range(3) for j in range(5)), "each fetch reached it once"
        numbers = sorted(int(b.split()[2]) for got_i in bodies.values() for _, b in got_i)
        assert numbers == list(range(1, 16))
        assert all(status == 200 for got_i in bodies.values() for status, _ in got_i)
        c = http.client.HTTPConnection("127.0.0.1", group.port, timeout=30)
        c.request("GET", "/shutdown")
        assert c.getresponse().read() == b"bye\n"
        state = group.finish()
        assert group.proc.returncode == 0, group.stderr
        for r in state["replicas"][1:]:
            assert r["outputs"] == state["replicas"][0]["outputs"]
            assert r["outgoing"] == state["replicas"][0]["outgoing"]
        assert state["outgoing"]["connections"] == 15
    finally:
        backend.shutdown()
        backend.server_close()


class RecordingUdpServer:
    """A UDP service outside the group: answers each datagram with "<n> <text>"
    and keeps every datagram it got."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                data, addr = self.sock.recvfrom(2048)
            except OSError:
                return
            self.got.append(data.decode())
            self.sock.sendto(f"{len(self.got)} {data.decode()}".encode(), addr)

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("script", [False, True])
def test_outgoing_udp_from_unbound_sockets(script, examples, tmp_path, backend):
    """A UDP socket that sends (sendto, or connect and send) before any bind,
    as a resolver does, in three threads at once: each datagram reaches the
    server once, its answer reaches every replica, the ports are closed
    after.  (The port a send binds is recorded: a backup's threads bound in
    their own order and took each other's ports, and answers.)  script:
    the proxy is a start script's child, whose ports the controller gives."""
    udp = RecordingUdpServer()
    try:
        group = proxy_group(tmp_path, examples, backend.port, script=script)

        def lines(i):
            return [f"UDP {udp.port} c{i}q{j}" if j % 2 else f"UDPTO {udp.port} c{i}q{j}" for j in range(10)]
        results = line_clients(group, 3, lines)
        for i, replies in results.items():
            for line, reply in zip(lines(i), replies):
                cmd, _n, text, *rest = reply.split()
                assert [cmd, text] == line.split()[::2] and rest == ([] if cmd == "UDP" else ["from", str(udp.port)])
        assert sorted(int(r.split()[1]) for replies in results.values() for r in replies) == list(range(1, 31))
        assert sorted(udp.got) == sorted(f"c{i}q{j}" for i in range(3) for j in range(10)), \
            "each datagram sent once, not once per replica"
        state = finish(group)
        ports = [k for k in state["replicas"][0]["outgoing"] if k.startswith("udp-")]
        assert len(ports) == 30, "a port of its own for each socket"
        assert state["outgoing"]["udp"]["datagrams_in"] == 30 and state["outgoing"]["udp"]["datagrams_out"] == 30
    finally:
        udp.close()


def test_a_half_closed_connection_still_gets_its_answer(examples, tmp_path):
    """The program sends a request, shuts down its writing side and reads the
    answer of a server that answers once its input ends (proxy_server's ASK)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, PROGRAMS_DIR / "answer_at_eof.py", str(port)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        group = proxy_group(tmp_path, examples, free_port())
        with group.connect() as s:
            assert line_client(s, [f"ASK {port} hello there"])[0] == ["ASK heard 12 bytes: hello there"]
        finish(group)
    finally:
        server.kill()
        server.wait()


FORKING_CLIENT = """
import os, socket, sys
def ask(text):
    with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as s:
        s.sendall(text.encode() + b"\\n")
        return s.makefile().readline().strip()
print("parent", ask("parent-1"), flush=True)
pid = os.fork()
if pid == 0:
    print("child", ask("child-1"), ask("child-2"), flush=True)
    os._exit(0)
mine = ask("parent-2"), ask("parent-3")
os.waitpid(pid, 0)
print("parent", *mine, flush=True)
"""


def test_a_forked_process_connects_apart_from_its_parent(real_python, tmp_path, backend):
    """--fork replicate: a child connects as its parent goes on connecting.
    The child counts its connections on from its parent's count, and each
    of its connections is its own at the backend (not its parent's of the
    same count), once, whichever replica's process made it; each
    replica's stdout tells the same story."""
    rd = tmp_path / "rd"
    p = subprocess.run([tool("llft-run"), "--replicas", "3", "--fork", "replicate", "--run-dir", str(rd), "--",
                        real_python, "-c", FORKING_CLIENT, str(backend.port)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    backend.wait_ended(5)
    assert sorted(backend.conns) == [[f"child-{k}"] for k in (1, 2)] + [[f"parent-{k}"] for k in (1, 2, 3)]
    outs = [(rd / f"replica-{k}" / "stdout").read_text() for k in range(3)]
    assert outs[1] == outs[0] and outs[2] == outs[0] and outs[0].count("\n") == 3, outs
