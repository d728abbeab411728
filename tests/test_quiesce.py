"""A primary held still for a checkpoint of itself (llft/checkpoint/quiesce.py,
native/quiesce.c): every thread answers the census (those blocked in a
read, an accept or a poll are interrupted and start the call again once
released), and the program never sees it: the clients get every answer
once, the backups replay in step, and every replica ends with the same
output.  Held under load, driven by the clients' progress, many times."""
from __future__ import annotations

import shutil
import sys
import time

import pytest

from conftest import PROGRAMS_DIR
from serving import HttpCounters, ServingGroup
from test_checkpoint import MemcachedClient, memcached_argv
from test_group_lifecycle import wait_for as wait_until
from test_rejoin import KvClient, RedisClient, Workload, check_digests, live, state, wait_for

from llft.checkpoint import quiesce
from llft.members import process_state
from llft.native import StreamFile

HOLDS = 25


def primary_of(group) -> dict:
    return next(r for r in state(group)["replicas"] if r["role"] == "primary")


SERVERS = {
    # a thread per connection, blocked in read(); the main thread in accept()
    "kv_server": (lambda examples: [examples / "kv_server", 7000], KvClient, 6),
    # one thread in epoll_wait, background threads in condition waits
    "redis": (lambda examples: [shutil.which("redis-server"), "--port", "6379", "--save", "", "--appendonly",
                                "no", "--enable-debug-command", "yes"], RedisClient, 3),
    # libevent's epoll_wait in four workers and the dispatcher, memcached's
    # own threads in condition waits and sleeps
    "memcached": (lambda examples: memcached_argv(), MemcachedClient, 3),
}


@pytest.mark.parametrize("server", SERVERS)
def test_a_primary_held_for_its_checkpoint_goes_on_as_if_never_held(server, examples, tmp_path):
    argv, client_cls, nclients = SERVERS[server]
    if argv(examples)[0] is None:
        pytest.skip(f"{server} not installed (scripts/setup.sh installs it)")
    group = ServingGroup(tmp_path / "rd", argv(examples), replicas=3, extra=["--log-output"])
    wl = Workload(group, client_cls, nclients)
    try:
        wait_for(lambda st: len(live(st)) == 3, "the group starts", group)
        primary = primary_of(group)
        stream = StreamFile(primary["stream"])
        answered = []
        for n in range(HOLDS):
            wl.progresses(f"before hold {n + 1}", replies=30)
            with quiesce.held(stream, primary["pid"], timeout_ms=3000) as threads:
                answered.append(threads)
                # Held as long as a dump takes; meanwhile the primary's
                # threads stay out of the kernel's blocking calls, except
                # in their waits at a call's entry and in lock waits.
                time.sleep(0.03)
        wl.progresses("after the last hold", replies=60)
        assert primary_of(group)["index"] == primary["index"], "the primary was held, never replaced"
        check_digests(group, client_cls, state(group))
        final = wl.finish_and_shut_down(group)
    finally:
        wl.stop.set()
    # Every thread answered, the clients' connection threads among them.
    assert min(answered) >= nclients + 1, answered
    survivors = live(final)
    assert len(survivors) == 3 and all(r["status"] == 0 for r in survivors), final["replicas"]
    for r in survivors[1:]:
        assert r["outputs"] == survivors[0]["outputs"], f"replica {r['index']} sent something else"


def test_threads_that_block_every_signal_are_held_all_the_same(tmp_path):
    """A CPython server whose every thread blocks every signal
    (pthread_sigmask with the full set): the census's signals stay open
    (the shim takes them out of the masks the program sets), so the
    primary, its connections' threads in recv() and its main thread in
    poll(), is held as any other; each client counts on unseen."""
    group = ServingGroup(tmp_path / "rd", [sys.executable, PROGRAMS_DIR / "masked_server.py", 7000], replicas=2)
    clients = HttpCounters(group)
    try:
        wait_for(lambda st: len(live(st)) == 2, "the group starts", group)
        primary = primary_of(group)
        stream = StreamFile(primary["stream"])
        for n in range(10):
            clients.progress(f"before hold {n + 1}", 20)
            with quiesce.held(stream, primary["pid"], timeout_ms=3000) as answered:
                assert answered >= 4   # main, and a thread per client
        clients.finish()
    finally:
        clients.stopping = True
    with group.connect() as s:
        s.sendall(b"GET /shutdown HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(1000)
    final = group.finish()
    assert group.proc.returncode == 0, group.stderr
    survivors = live(final)
    assert len(survivors) == 2 and survivors[0]["outputs"] == survivors[1]["outputs"]


ERRNO_CALLS = ["poll", "ppoll", "select", "epoll", "read", "recv"]


def test_a_call_started_again_after_a_hold_leaves_errno_as_the_program_had_it(examples, tmp_path):
    """A hold interrupts the primary's blocking calls and starts them again;
    once one succeeds, errno is what the program set before it, as after
    any call that succeeds.  A call that left the interruption's EINTR
    there steered CPython's poll loop into a retry the backups never made
    (test_threads_that_block_every_signal_are_held_all_the_same, 1 run in
    14 under load).  Each kind of call that is started again (accept, the
    waits, the reads) is held while blocked, in every other round, and
    reports the errno it left: 0 every time, at every replica."""
    group = ServingGroup(tmp_path / "rd", [examples / "errno_after_call", 7000], replicas=2)
    try:
        wait_for(lambda st: len(live(st)) == 2, "the group starts", group)
        primary = primary_of(group)
        stream = StreamFile(primary["stream"])

        def hold_while_blocked():
            if n % 2:
                return
            # (its main thread asleep: in the blocking call it announced)
            wait_until(lambda: process_state(primary["pid"]) == "S", "the primary blocks in its call")
            with quiesce.held(stream, primary["pid"], timeout_ms=3000) as answered:
                assert answered == 1

        for n in range(6):
            hold_while_blocked()   # in accept
            with group.connect() as s:
                f = s.makefile("rb")
                for call in ERRNO_CALLS:
                    assert f.readline() == f"WAIT {call}\n".encode()
                    hold_while_blocked()
                    s.sendall(b"a")
                reply = f.readline().decode()
                assert reply == "ERRNO " + " ".join(f"{c}=0" for c in ["accept"] + ERRNO_CALLS) + "\n", reply
                assert f.readline() == b"WAIT poll\n"
                s.sendall(b"x" if n == 5 else b"q")
        final = group.finish()
    finally:
        group.stop()
    assert group.proc.returncode == 0, group.stderr
    survivors = live(final)
    assert len(survivors) == 2 and survivors[0]["outputs"] == survivors[1]["outputs"]
