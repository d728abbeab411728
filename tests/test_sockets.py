"""The rest of the Consistent Socket Communication Service, end to end:
sendfile on a virtual connection, the program's UDP ports, and a program
that never listens.  Real programs under the real preload library, real
clients on real sockets through llft-run's gateway."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from conftest import tool
from serving import ServingGroup, concurrently, line_client, udp_exchange
from test_serving import assert_replicas_agree


def recv_exact(f, n: int) -> bytes:
    data = f.read(n)
    assert len(data) == n, f"short read: {len(data)} of {n}"
    return data


def test_sendfile_replicas_send_the_same_bytes(examples, tmp_path):
    """file_server answers with sendfile on non-blocking sockets, at its
    file position and at explicit offsets, from four connections at once:
    sendfile sends part of what it is asked, as the kernel decides at the
    primary; each backup moves the primary's byte counts from its own file
    through its own socket (or it would poll a different number of times
    and be stopped as diverged)."""
    content = os.urandom(1_000_000)
    path = tmp_path / "served.bin"
    path.write_bytes(content)
    group = ServingGroup(tmp_path / "rd", [examples / "file_server", 7000, path], extra=["--log-output"])
    raw = {}

    def client(i):
        with group.connect() as s:
            f = s.makefile("rwb")
            got = b""
            for j in range(3):
                f.write(b"FILE\n")
                f.flush()
                head = f.readline()
                assert head == b"SIZE %d\n" % len(content)
                body = recv_exact(f, len(content))
                assert body == content
                got += head + body
                off, n = 1000 * (i + 1) + 7 * j, 20_000 + 3000 * i
                f.write(b"RANGE %d %d\n" % (off, n))
                f.flush()
                head = f.readline()
                body = recv_exact(f, n)
                assert body == content[off:off + n]
                got += head + body
                f.write(b"line %d.%d\n" % (i, j))
                f.flush()
                got += f.readline()
            raw[i] = got

    concurrently(client, 4)
    with group.connect() as s:
        final, final_raw = line_client(s, ["PARTIAL", "DIGEST", "SHUTDOWN"])
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert final[2] == "BYE"
    assert int(final[0].split()[1]) > 0, "sendfile always sent everything: the test shows nothing"
    assert_replicas_agree(state, list(raw.values()) + [final_raw], group.run_dir)
    total = sum(v["bytes"] for v in state["replicas"][0]["outputs"].values())
    assert total > 4 * 3 * len(content), "the files went through the primary's connections"


def test_udp_server_datagrams_and_replicas_agree(examples, tmp_path):
    """udp_server binds a UDP port: the gateway serves it, every replica
    gets each client datagram whole with the client's address, and only
    the primary's replies reach the clients, once."""
    group = ServingGroup(tmp_path / "rd", [examples / "udp_server", 7000], wait_tcp=False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.connect(("127.0.0.1", group.port))
        udp_exchange(s, group.port, b"warm-up")     # waits until the port is served
    replies: dict[int, list[bytes]] = {}

    def client(i):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(20)
            s.connect(("127.0.0.1", group.port))
            me = "127.0.0.1:%d" % s.getsockname()[1]
            got = []
            for j in range(30):
                payload = f"client{i}-dgram{j}".encode() + (b"." * (j * 200 if j % 5 == 0 else 0))
                s.send(payload)
                r = s.recv(70000)
                count, rest = r.split(b" ", 1)
                assert rest == payload + b" from " + me.encode(), (r[:80], payload[:40])
                got.append(r)
            s.send(b"")                               # an empty datagram is a datagram too
            r = s.recv(70000)
            assert r.endswith(b"  from " + me.encode()), r
            got.append(r)
            replies[i] = got

    concurrently(client, 5)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(20)
        s.connect(("127.0.0.1", group.port))
        s.send(b"DIGEST")
        digest = s.recv(1000)
        s.send(b"SHUTDOWN")
        assert s.recv(1000) == b"BYE"
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    assert digest.startswith(b"DIGEST ")
    counts = sorted(int(r.split(b" ", 1)[0]) for got in replies.values() for r in got)
    assert counts == list(range(2, 2 + 5 * 31)), "each datagram served once, the warm-up first"
    outputs = [r["datagrams"] for r in state["replicas"]]
    assert all(r["status"] == 0 for r in state["replicas"]), [r["status"] for r in state["replicas"]]
    assert outputs[0]["7000"]["datagrams"] == 1 + 5 * 31 + 2
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0], "a backup would have replied differently"
    udp = state["gateway"]["udp"]
    assert udp["datagrams_out"] == outputs[0]["7000"]["datagrams"], "a reply reached the clients once"
    client_bytes = sum(len(r) for got in replies.values() for r in got)
    assert outputs[0]["7000"]["bytes"] > client_bytes


def test_program_that_never_listens_is_reported(tmp_path):
    """Clients cannot reach a program that never binds a port: llft-run says
    so in its log and in llft-status, and lets the program run on."""
    run_dir = tmp_path / "rd"
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([tool("llft-run"), "--replicas", "2", "--run-dir", str(run_dir), "--",
                                 "sleep", "120"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        expected = "has not listened on any TCP port"
        end = time.monotonic() + 60
        while time.monotonic() < end and expected not in (tmp_path / "stderr").read_text():
            time.sleep(0.1)
        assert expected in (tmp_path / "stderr").read_text()
        assert "clients cannot reach it" in (run_dir / "llft.log").read_text()
        status = ""
        while time.monotonic() < end and expected not in status:  # the state file follows within a second
            status = subprocess.run([tool("llft-status"), "--run-dir", str(run_dir)], capture_output=True,
                                    text=True, timeout=30).stdout
            time.sleep(0.2)
        assert "notice: the program has not listened on any TCP port" in status, status
        state = json.loads(subprocess.run([tool("llft-status"), "--run-dir", str(run_dir), "--json"],
                                          capture_output=True, text=True, timeout=30).stdout)
        assert any(expected in n for n in state["gateway"]["notices"])
        assert proc.poll() is None, "llft-run must not stop the program"
        assert all(m["state"] == "running" for m in state["members"]), state["members"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
