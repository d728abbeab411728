"""Helpers for tests that serve real clients through llft-run's gateway."""
from __future__ import annotations

import hashlib
import http.client
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

from conftest import tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_when_open(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> socket.socket:
    """A connection to port, once llft-run's gateway opens it (once the
    program listens)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"llft-run exited early with {proc.returncode}: {proc.stderr.read()}")
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listens on port {port}")


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0):
    connect_when_open(port, proc, timeout).close()


LIVE: list["ServingGroup"] = []  # stopped after each test (conftest), pass or fail


# The ordering backends a group on one host can run over (llft-run --order).
ORDERS = ["llft", "mailbox"]


def order_args(order: str) -> list[str]:
    return [] if order == "llft" else ["--order", order]


class ServingGroup:
    """llft-run in the background, serving on a free public port."""

    def __init__(self, run_dir: Path, argv, replicas=3, extra=(), wait_tcp=True, env=None, prefix=()):
        """prefix: a command that runs llft-run's command line (exec'ing it,
        so that this object's process is llft-run's)."""
        import os
        LIVE.append(self)
        self.port = free_port()
        self.run_dir = run_dir
        cmd = [*prefix, tool("llft-run"), "--replicas", str(replicas), "--run-dir", str(run_dir),
               "--port", str(self.port), *extra, "--", *map(str, argv)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        if wait_tcp:
            wait_for_port(self.port, self.proc)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def finish(self, timeout=60) -> dict:
        """Waits for llft-run to end; returns the run's state."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        self.stderr = self.proc.stderr.read()
        return json.loads((self.run_dir / "llft-run.json").read_text())

    def stop(self):
        """Ends llft-run if it still runs: SIGTERM first, so that it stops
        its replicas; SIGKILL only if it does not."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def line_client(sock: socket.socket, lines: list[str]) -> tuple[list[str], bytes]:
    """Sends each line, reads its one-line reply; returns replies and all bytes received."""
    f = sock.makefile("rwb")
    replies, raw = [], b""
    for line in lines:
        f.write(line.encode() + b"\n")
        f.flush()
        r = f.readline()
        raw += r
        replies.append(r.decode().rstrip("\n"))
    return replies, raw


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def concurrently(client, n: int, meanwhile=None, timeout: float | None = None):
    """Runs client(0) .. client(n-1) each on its own thread, and meanwhile()
    (e.g. fault injection) on this one; returns when all have (or after
    timeout seconds per thread).  A client that raised fails the test with
    its own error, rather than with whatever its missing results make a
    later assertion say."""
    import threading
    import traceback
    failed = {}

    def run(i):
        try:
            client(i)
        except BaseException as e:   # noqa: BLE001 - reported below, with the client's number
            failed[i] = "".join(traceback.format_exception(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    if meanwhile is not None:
        meanwhile()
    for t in threads:
        t.join(timeout)
    assert not failed, "; ".join(f"client {i} failed: {tb}" for i, tb in sorted(failed.items()))


def cpu_share(pid: int, secs: float = 1.0) -> float:
    """The share of one CPU that process pid (all its threads) used over
    the next secs seconds."""
    import psutil
    p = psutil.Process(pid)
    before = sum(p.cpu_times()[:2])
    time.sleep(secs)
    return (sum(p.cpu_times()[:2]) - before) / secs


def kill_primary(run_dir: Path) -> str:
    """llft-kill --primary on the group in run_dir; what it said."""
    p = subprocess.run([tool("llft-kill"), "--run-dir", str(run_dir), "--primary"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "sent SIGKILL" in p.stdout
    return p.stdout.strip()


class Progress:
    """Replies the clients have had so far, for fault injection driven by the
    workload's progress (after the k-th reply) rather than by a sleep."""

    def __init__(self):
        import threading
        self.replies = 0
        self.cond = threading.Condition()

    def tick(self):
        with self.cond:
            self.replies += 1
            self.cond.notify_all()

    def wait(self, k: int, timeout: float = 60.0):
        with self.cond:
            if not self.cond.wait_for(lambda: self.replies >= k, timeout):
                raise AssertionError(f"the clients had {self.replies} replies after {timeout:g}s, not {k}")


def kill_after(group: ServingGroup, progress: Progress, *at: int):
    """meanwhile() for line_clients: kills the primary once the clients have
    had at[0] replies, again at at[1], and so on."""
    def meanwhile():
        for k in at:
            progress.wait(k)
            kill_primary(group.run_dir)
    return meanwhile


def kill_and_recover(group: ServingGroup, progress: Progress, every: int, times: int, replicas: int = 3):
    """meanwhile() for a --respawn group: SIGKILL the primary once the
    clients have had `every` more replies, `times` times, each time waiting
    until the group has recovered (replicas live, replacements caught up)."""
    def meanwhile():
        import signal
        from llft.nemesis.faults import Group
        members = Group(group.run_dir)
        for k in range(1, times + 1):
            progress.wait(every * k)
            primary = members.primary()
            members.signal(primary, signal.SIGKILL)
            members.wait_recovered(replicas, {primary.index})
    return meanwhile


def line_clients(group: ServingGroup, n: int, lines_of, meanwhile=None, pause: float = 0.0,
                 progress: Progress | None = None) -> dict:
    """n clients, each on its own connection, send lines_of(i) one at a time
    and read each reply (meanwhile() runs alongside, e.g. fault injection);
    returns each client's replies.  A connection that drops fails the test.
    Each reply ticks progress, if given."""
    results, errors = {}, []

    def client(i):
        try:
            with group.connect() as s:
                f = s.makefile("rwb")
                got = []
                for line in lines_of(i):
                    f.write(line.encode() + b"\n")
                    f.flush()
                    reply = f.readline().decode()
                    if not reply:
                        errors.append(f"client {i}: connection closed after {len(got)} replies")
                        return
                    got.append(reply.rstrip("\n"))
                    if progress is not None:
                        progress.tick()
                    time.sleep(pause)
                results[i] = got
        except OSError as e:
            errors.append(f"client {i}: {e}")
    concurrently(client, n, meanwhile)
    assert not errors, errors
    return results


class HttpCounters:
    """n clients of llft.nemesis.http_counter (or a server of its protocol),
    each counting its own name up (/incr/cI) on one connection, every
    answer checked, until finish()."""

    def __init__(self, group: ServingGroup, n: int = 3):
        self.group = group
        self.stopping = False
        self.errors: list[str] = []
        self.counts = [0] * n
        self.threads = [threading.Thread(target=self._count, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _count(self, i: int):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.group.port, timeout=20)
            while not self.stopping:
                c.request("GET", f"/incr/c{i}")
                assert int(c.getresponse().read()) == self.counts[i] + 1
                self.counts[i] += 1
        except (OSError, AssertionError, ValueError) as e:
            self.errors.append(repr(e))

    def progress(self, what: str, replies: int):
        """Waits until the clients have had `replies` more answers."""
        before, end = sum(self.counts), time.monotonic() + 20
        while sum(self.counts) < before + replies and not self.errors and time.monotonic() < end:
            time.sleep(0.01)
        assert not self.errors and sum(self.counts) >= before + replies, f"{what}: {self.errors or 'no progress'}"

    def finish(self):
        """Stops the clients; none may have failed."""
        self.stopping = True
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors


def udp_exchange(sock: socket.socket, port: int, payload: bytes, timeout: float = 30.0) -> bytes:
    """One request, one reply; resends while the gateway's UDP port is not
    there yet (ICMP refusals) or the datagram got lost."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        sock.sendto(payload, ("127.0.0.1", port))
        try:
            return sock.recv(70000)
        except (socket.timeout, ConnectionRefusedError):
            continue
    raise AssertionError(f"no reply to {payload[:40]!r}")


def start_script(tmp_path, server, *args) -> Path:
    """A start script as deployed: it runs the server as its child (no
    exec), and says when the server has exited, with its status."""
    script = tmp_path / "start.sh"
    script.write_text(f"#!/bin/sh\necho starting >&2\n{server} {' '.join(map(str, args))}\n"
                      f"echo \"server exited $?\"\n")
    script.chmod(0o755)
    return script
