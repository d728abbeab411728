"""A client that floods a group across hosts without reading its replies:
the gateway pushes back instead of buffering, and others are served."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil

from netns import in_ns
from test_multihost import PROGRAM_PORT, cluster, cluster_of  # noqa: F401 (fixtures)

FLOODER = """
import socket, sys, time
s = socket.create_connection(('127.0.0.1', %d), timeout=60)
s.setblocking(False)
line = b'x' * 1000 + b'\\n'
sent, end = 0, time.monotonic() + %f
while time.monotonic() < end:
    try:
        sent += s.send(line * 64)
    except BlockingIOError:
        time.sleep(0.01)
print(sent, flush=True)
"""


def test_a_flooding_client_is_pushed_back_across_hosts(cluster, examples):
    # Default fault timeouts: the flood must not make a live primary look
    # dead (its Heartbeats were once lost among the flood's datagrams in
    # overflowing socket buffers, and the group failed over again and again).
    cluster.start_members(3, [examples / "echo_server", PROGRAM_PORT])
    cluster.start_gateway(3)
    gateway = psutil.Process(cluster.gateway.pid)
    c = cluster.client()
    assert c.lines(["warm"])[0] == ["1 warm"]
    before = gateway.memory_info().rss
    flooder = subprocess.Popen(in_ns(cluster.hosts[3][0], sys.executable, "-c", FLOODER % (PROGRAM_PORT, 8.0)),
                               stdout=subprocess.PIPE, text=True)
    peak = before
    for i in range(16):
        replies, _ = c.lines([f"polite {i}"])
        assert replies[0].endswith(f" polite {i}"), replies
        peak = max(peak, gateway.memory_info().rss)
        time.sleep(0.5)
    sent = int(flooder.communicate(timeout=60)[0])
    assert sent > 1 << 20, "the flood never got going"
    growth = (peak - before) >> 20
    assert growth < 64, f"the gateway grew by {growth} MiB while a client sent {sent >> 20} MiB unread"
    assert c.lines(["after"])[0][0].endswith(" after")
    c.close()
    assert cluster.status(cluster.gateway_dir)["gateway"]["missing_bytes"] == 0
    views = {cluster.status(d)["view"]["pvn"] for _, d in cluster.members}
    assert views == {1}, f"a false failover under the flood: primary views {views}"
