"""The primary fails while a client has megabytes of output in flight: the
new primary sends every byte of the connection's output the gateway has
not had (LLFT phase 2), and the client receives exactly the byte stream
the program produced, nothing missing or repeated.

End to end, on real hosts; whether a backup's window is full at the
moment of the failure depends on timing here (see test_output_failover.py
for the deterministic check of that case)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from netns import in_ns
from test_multihost import PROGRAM_PORT, cluster, cluster_of  # noqa: F401 (fixtures)

LINES = 8000
KILL_AFTER = 1 << 20    # bytes of replies the client has read when the primary is killed

# Writes LINES lines of about 1000 bytes as fast as it can while reading the
# replies; says "progress" once it has read KILL_AFTER bytes, then checks
# every reply: the echo server answers line i (from 1) with "i <line>".
CLIENT = r"""
import socket, sys, threading
lines, kill_after = %d, %d
s = socket.create_connection(('127.0.0.1', %d), timeout=120)
def line(i):
    return b'L%%07d ' %% i + b'x' * 990
def write():
    for i in range(1, lines + 1):
        s.sendall(line(i) + b'\n')
threading.Thread(target=write, daemon=True).start()
f = s.makefile('rb')
got, said = 0, False
for i in range(1, lines + 1):
    r = f.readline()
    want = b'%%d ' %% i + line(i) + b'\n'
    if r != want:
        print('MISMATCH at reply %%d (%%d bytes read): %%r' %% (i, got, r[:80]), flush=True)
        sys.exit(1)
    got += len(r)
    if not said and got >= kill_after:
        print('progress', flush=True)
        said = True
print('OK %%d' %% got, flush=True)
"""


def test_primary_killed_with_megabytes_of_output_in_flight(cluster, examples):
    first = cluster.start_members(3, [examples / "echo_server", PROGRAM_PORT], extra=["--no-rejoin"])
    cluster.start_gateway(3)
    replica_pid = cluster.status(first)["replicas"][0]["pid"]
    client = subprocess.Popen(in_ns(cluster.hosts[3][0], sys.executable, "-c",
                                    CLIENT % (LINES, KILL_AFTER, PROGRAM_PORT)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = client.stdout.readline().strip()
        assert said == "progress", (said, client.stderr.read()[-2000:])
        os.kill(replica_pid, signal.SIGKILL)     # the primary fails with output in flight
        out, err = client.communicate(timeout=180)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    gateway_log = (cluster.gateway_dir / "llft.log").read_text()
    missing = [ln for ln in gateway_log.splitlines() if "output are missing" in ln]
    assert not missing, missing[:5]
    assert out.strip().startswith("OK"), (out, err[-2000:])
    assert cluster.members[0][0].wait(timeout=30) == 128 + 9
