"""A replica's sockets reach its controller only through its private
channel (llft/serving/channel.py, native/channel.c): nothing a replica
exposes has a name another process on the host could connect to, and the
gateway serves a program's port only on the address the program bound.

Before, each replica's virtual listener was an abstract AF_UNIX name: one
foreign connection to the primary's, writing a few bytes, was recorded as
a client connection the backups never got, and they stopped following
without a word; the next failover then served nothing."""
from __future__ import annotations

import array
import asyncio
import socket
import subprocess
import sys

import psutil
import pytest

import serving
from serving import ServingGroup, line_client, line_clients
from llft.checkpoint.sockets import fd_inodes
from llft.native import CHAN_CONNECT, CHAN_LISTEN, CHAN_PORT, EPHEMERAL_COUNT, EPHEMERAL_FIRST, EPHEMERAL_OWN, ffi
from llft.serving.channel import ProgramChannel
from llft.serving.outgoing import OutgoingService


def socket_inodes(pids) -> set[int]:
    return {ino for pid in pids for ino in fd_inodes(pid).values()}


def named_unix_sockets(inodes: set[int]) -> list[str]:
    """The names (paths, or @abstract ones) bound by unix sockets among inodes."""
    names = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[6]) in inodes and len(fields) > 7:
                names.append(fields[7])
    return names


def group_pids(group: ServingGroup) -> list[int]:
    me = psutil.Process(group.proc.pid)
    return [me.pid] + [c.pid for c in me.children(recursive=True)]


FOREIGN = r"""
import socket, sys
hits = 0
for line in open("/proc/net/unix").readlines()[1:]:
    f = line.split()
    if len(f) > 7 and "llft" in f[7]:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
            s = socket.socket(socket.AF_UNIX, kind)
            try:
                s.connect(f[7].replace("@", "\0", 1))
                s.send(b"\x01" * 64)
                hits += 1
            except OSError:
                pass
            s.close()
print(hits)
"""


def test_nothing_a_replica_exposes_can_be_reached_by_another_process(examples, tmp_path):
    group = ServingGroup(tmp_path / "rd", [examples / "pool_server", 7000], extra=["--log-output"])
    with group.connect() as s:
        assert line_client(s, ["before"])[0] == ["1 before"]
    pids = group_pids(group)
    assert len(pids) == 4, pids
    assert named_unix_sockets(socket_inodes(pids)) == [], "a replica or its controller has a named socket"
    r = subprocess.run([sys.executable, "-c", FOREIGN], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "0", r.stderr
    results = line_clients(group, 3, lambda i: [f"c{i}-{j}" for j in range(100)])
    assert sorted(int(x.split()[0]) for got in results.values() for x in got) == list(range(2, 302))
    serving.kill_primary(group.run_dir)
    with group.connect() as s:
        assert line_client(s, ["after"])[0] == ["302 after"]
        line_client(s, ["SHUTDOWN"])
    state = group.finish()
    assert group.proc.returncode == 0, group.stderr
    survivors = [r for r in state["replicas"] if r["role"] != "failed"]
    assert len(survivors) == 2 and survivors[0]["outputs"] == survivors[1]["outputs"]


def gateway_addresses(group: ServingGroup) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(group.proc.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == group.port}


@pytest.mark.parametrize("bind, extra, served_on", [
    ("127.0.0.1", [], {"127.0.0.1"}),
    ("0.0.0.0", [], {"0.0.0.0"}),
    ("127.0.0.1", ["--listen", "0.0.0.0"], {"0.0.0.0"}),
])
def test_the_gateway_binds_the_address_the_program_bound(real_python, tmp_path, bind, extra, served_on):
    group = ServingGroup(tmp_path / "rd", [real_python, "-m", "http.server", "--bind", bind, "7000"],
                         replicas=2, extra=extra)
    assert gateway_addresses(group) == served_on
    group.stop()


# -- the channel itself, as a replica's shim would use it, with bad input --------

def send_on_channel(theirs: socket.socket, body: bytes, fds: list[int]):
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    theirs.sendmsg([body], anc)


def channel_message(kind: int, port: int = 0, family: int = socket.AF_INET, type: int = 0) -> bytes:
    m = ffi.new("llft_channel_msg_t *")
    m.kind, m.port, m.family, m.type = kind, port, family, type
    return bytes(ffi.buffer(m))


def test_malformed_channel_messages_are_dropped_and_counted():
    async def run():
        ch = ProgramChannel(7)
        ch.attach()
        a, b = socket.socketpair()
        send_on_channel(ch.theirs, b"short", [a.fileno()])                        # wrong size
        send_on_channel(ch.theirs, channel_message(CHAN_LISTEN, 7000), [])         # no socket
        send_on_channel(ch.theirs, channel_message(CHAN_LISTEN, 7000), [a.fileno(), b.fileno()])   # two
        send_on_channel(ch.theirs, channel_message(99, 7000), [a.fileno()])        # unknown kind
        send_on_channel(ch.theirs, channel_message(CHAN_LISTEN, 7000, family=1), [a.fileno()])   # AF_UNIX
        send_on_channel(ch.theirs, channel_message(CHAN_LISTEN, 7001), [a.fileno()])   # well formed
        for _ in range(100):
            if ch.listeners:
                break
            await asyncio.sleep(0.01)
        assert ch.drops == 5
        assert list(ch.listeners) == [(7001, socket.AF_INET)]
        ch.close()
        a.close()
        b.close()
    asyncio.run(run())


def test_a_forked_process_asking_for_a_port_gets_one_apart_from_those_held():
    """CHAN_PORT: a port of the upper half of the ephemeral range, none the
    replica's processes hold, none given before until the range goes
    round; a request for a socket of another type is dropped and counted."""
    async def ask(ch, type_) -> bytes:
        ours, theirs = socket.socketpair()
        send_on_channel(ch.theirs, channel_message(CHAN_PORT, type=type_), [theirs.fileno()])
        theirs.close()
        ours.settimeout(10)
        got = await asyncio.to_thread(ours.recv, 8)
        ours.close()
        return got

    async def run():
        ch = ProgramChannel(7)
        first = EPHEMERAL_FIRST + EPHEMERAL_OWN
        ch.ports.in_use = lambda: {first, first + 2}
        ch.attach()
        got = [int.from_bytes(await ask(ch, kind), "little")
               for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM, socket.SOCK_DGRAM)]
        assert got == [first + 1, first + 3, first + 4]
        assert await ask(ch, socket.SOCK_RAW) == b"" and ch.drops == 1
        ch.ports.in_use = lambda: set(range(EPHEMERAL_FIRST, EPHEMERAL_FIRST + EPHEMERAL_COUNT))
        assert int.from_bytes(await ask(ch, socket.SOCK_DGRAM), "little") == 0, "none left: the shim's EADDRNOTAVAIL"
        ch.close()
    asyncio.run(run())


class ChannelOnly:
    """What OutgoingService needs of a replica: its index and its channel."""

    def __init__(self, index: int):
        self.index = index
        self.channel = ProgramChannel(index)

    def alive(self):
        return True


def test_a_malformed_outgoing_request_is_dropped_and_counted():
    async def run():
        replica = ChannelOnly(0)
        service = OutgoingService()
        service.listen(replica)
        await service.serve()
        ours, program = socket.socketpair()
        send_on_channel(replica.channel.theirs, channel_message(CHAN_CONNECT), [ours.fileno()])
        ours.close()
        program.sendall(b"\xff" * 32)          # address family 0xffff
        program.settimeout(10)
        assert await asyncio.to_thread(program.recv, 64) == b"", "closed without an answer"
        assert service.stats["dropped"] == 1 and "bad request" in service.errors[0]
        program.close()
        service.close()
        replica.channel.close()
    asyncio.run(run())
