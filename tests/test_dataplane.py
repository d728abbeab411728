"""The native data plane (native/dataplane.c) on real sockets, with its own
thread: fan-out of client bytes, the primary's output once, digests, the
takeover's offsets, a joining replica fed from the input log.  The
programs' ends of the legs are socketpairs this test plays."""
import hashlib
import os
import socket
import time
from dataclasses import dataclass

import pytest

from llft.serving.dataplane import DataPlane


@dataclass
class Proc:
    """What the plane needs of a replica: a live pid (this one)."""
    index: int
    pid: int = os.getpid()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(10)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"ended after {data!r}"
        data += chunk
    return data


def eventually(check, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def at_eof(sock: socket.socket) -> bool:
    sock.settimeout(10)
    return sock.recv(1) == b""


@pytest.fixture
def group(tmp_path):
    """A plane with three replicas (slot 0 primary) and one client
    connection; returns (plane, client end, [program ends])."""
    (tmp_path / "input").mkdir()
    plane = DataPlane(tmp_path / "input")
    slots = [plane.add_replica(Proc(k), None) for k in range(3)]
    plane.set_primary(slots[0])
    client, gw_side = socket.socketpair()
    assert plane.open_conn(1, gw_side)
    programs = []
    for s in slots:
        prog, leg = socket.socketpair()
        plane.attach(s, 1, leg)
        programs.append(prog)
    yield plane, client, programs
    plane.stop()
    for s in [client, *programs]:
        s.close()


def test_client_bytes_reach_every_replica_and_one_reply_comes_back(group):
    plane, client, programs = group
    client.sendall(b"request" * 1000)
    for prog in programs:
        assert recv_exactly(prog, 7000) == b"request" * 1000
    for prog in programs:
        prog.sendall(b"reply")
    assert recv_exactly(client, 5) == b"reply"
    want = {"1": {"bytes": 5, "sha256": hashlib.sha256(b"reply").hexdigest(), "closed": False}}
    # the backups' copies are digested on the plane's thread, maybe after the client got the primary's
    assert eventually(lambda: [plane.summary(s) for s in range(3)] == [want] * 3), \
        [plane.summary(s) for s in range(3)]
    assert plane.stats()["bytes_in"] == 7000 and plane.stats()["bytes_out"] == 5


def test_takeover_sends_only_what_the_client_has_not_had(group):
    plane, client, programs = group
    programs[0].sendall(b"abc")
    assert recv_exactly(client, 3) == b"abc"
    programs[1].sendall(b"abcdef")          # a backup ahead of the failed primary
    programs[2].sendall(b"ab")              # one behind
    plane.remove_replica(0)
    plane.set_primary(1)
    assert recv_exactly(client, 3) == b"def"
    programs[1].sendall(b"gh")
    assert recv_exactly(client, 2) == b"gh"
    programs[2].sendall(b"cdefgh")          # it catches up: nothing more reaches the client
    programs[1].close()                     # the new primary closes: so does the client
    assert at_eof(client)
    assert eventually(lambda: plane.summary(2)["1"]["sha256"] == hashlib.sha256(b"abcdefgh").hexdigest())


def test_a_backup_closing_does_not_close_the_client(group):
    plane, client, programs = group
    programs[1].close()
    programs[0].sendall(b"still here")
    assert recv_exactly(client, 10) == b"still here"
    programs[0].close()
    assert at_eof(client)


def test_a_joining_replica_gets_the_logged_input_then_the_live_bytes(group):
    plane, client, programs = group
    client.sendall(b"first")
    for prog in programs:
        assert recv_exactly(prog, 5) == b"first"
    slot = plane.add_replica(Proc(3), None)
    client.sendall(b"-second")
    prog, leg = socket.socketpair()
    plane.attach(slot, 1, leg)              # connected after the live bytes came
    client.shutdown(socket.SHUT_WR)
    assert recv_exactly(prog, 12) == b"first-second"
    assert at_eof(prog)
    for p in programs:
        assert recv_exactly(p, 7) == b"-second" and at_eof(p)
    prog.close()


def test_a_leg_connected_late_gets_what_was_queued():
    plane = DataPlane(None)
    s = plane.add_replica(Proc(0), None)
    plane.set_primary(s)
    client, gw_side = socket.socketpair()
    plane.open_conn(7, gw_side)
    client.sendall(b"x" * 100_000)
    prog, leg = socket.socketpair()
    plane.attach(s, 7, leg)
    assert recv_exactly(prog, 100_000) == b"x" * 100_000
    plane.stop()
    assert plane.summary(s)["7"]["closed"]  # stopping ends every leg's output


def test_two_joiners_in_a_row_get_each_done_connection_once(tmp_path):
    """Connections done at every replica are freed, their input kept; a
    joiner gets them back, and a second joiner, while the first has not
    finished them, gets each once too (not once more as a second copy,
    which the plane later freed under the other's feet)."""
    (tmp_path / "input").mkdir()
    plane = DataPlane(tmp_path / "input")
    first = plane.add_replica(Proc(0), None)
    plane.set_primary(first)
    for conn_id in range(1, 21):
        client, gw_side = socket.socketpair()
        assert plane.open_conn(conn_id, gw_side)
        prog, leg = socket.socketpair()
        plane.attach(first, conn_id, leg)
        client.sendall(b"in%d" % conn_id)
        assert recv_exactly(prog, len(b"in%d" % conn_id)) == b"in%d" % conn_id
        prog.sendall(b"out")
        assert recv_exactly(client, 3) == b"out"
        prog.close()
        client.close()
    assert eventually(lambda: list(plane.summary(first)) == ["closed"]), plane.summary(first)
    joiners = [plane.add_replica(Proc(k), None) for k in (1, 2)]   # the second before the first has finished
    legs = {}
    for s in joiners:
        for conn_id in range(1, 21):
            prog, leg = socket.socketpair()
            plane.attach(s, conn_id, leg)
            legs[(s, conn_id)] = prog
    for (s, conn_id), prog in legs.items():
        assert recv_exactly(prog, len(b"in%d" % conn_id)) == b"in%d" % conn_id, (s, conn_id)
        assert at_eof(prog), "its client had closed: the input ends"
        prog.sendall(b"out")
        prog.close()
    for s in joiners:
        assert eventually(lambda s=s: plane.summary(s) == plane.summary(first)), (plane.summary(s),
                                                                                   plane.summary(first))
    assert eventually(lambda: plane.stats()["held"] == 0), f"{plane.stats()['held']} connections still held"
    plane.remove_replica(joiners[1])
    assert plane.summary(first)["closed"]["connections"] == 20
    plane.stop()


def test_a_clone_continues_its_sources_connections(group):
    """A clone of backup 2 (llft/checkpoint/clone.py): what 2 had not read
    is given to the clone first, input that comes while 2 is held reaches
    both, in order, and the clone's output continues 2's offsets and
    digest, so that it can take over like any backup."""
    from llft.serving.dataplane import LEG_LIVE
    plane, client, programs = group
    client.sendall(b"first ")
    for prog in programs:
        assert recv_exactly(prog, 6) == b"first "
    client.sendall(b"unread ")
    assert recv_exactly(programs[0], 7) == b"unread "
    programs[2].sendall(b"reply-one ")   # the backup's output before the checkpoint
    for prog in programs[:2]:
        prog.sendall(b"reply-one ")
    assert recv_exactly(client, 10) == b"reply-one "
    time.sleep(0.05)   # the plane has read every program's output
    slot, legs = plane.clone_replica(2, None)
    assert [(c, state) for c, _ino, state in legs] == [(1, LEG_LIVE)] and legs[0][1] > 0
    client.sendall(b"held")              # while 2 is held: queued for it and for the clone
    assert recv_exactly(programs[0], 4) == b"held"
    programs[2].settimeout(0.2)
    assert programs[2].recv(100) == b"unread ", "a held replica gets nothing more"
    clone_prog, clone_leg = socket.socketpair()
    plane.clone_attach(slot, 1, clone_leg, b"unread ")   # what 2 had not read, as a peek saw it
    plane.set_pid(slot, os.getpid())
    assert recv_exactly(clone_prog, 11) == b"unread held"
    plane.release(2)
    assert recv_exactly(programs[2], 4) == b"held"
    for prog in [programs[0], programs[1], programs[2], clone_prog]:
        prog.sendall(b"reply-two")
    assert recv_exactly(client, 9) == b"reply-two"
    want = {"1": {"bytes": 19, "sha256": hashlib.sha256(b"reply-one reply-two").hexdigest(), "closed": False}}
    assert eventually(lambda: [plane.summary(s) for s in (0, 1, 2, slot)] == [want] * 4), \
        [plane.summary(s) for s in (0, 1, 2, slot)]
    clone_prog.close()


def test_a_parked_clone_holds_nobody_back_and_wakes_to_the_logged_input(group, tmp_path):
    """A stored checkpoint's slot (llft/checkpoint/stored.py): parked, it
    holds no client back (a flood the running replicas read goes through)
    and gets no leg for a new connection; woken, it is given from the input
    log what its connection's client sent since it was parked, and the
    connection opened and closed meanwhile whole.  Then the connections
    done up to that one are forgotten, their logs deleted."""
    import threading
    plane, client, programs = group
    client.sendall(b"first ")
    for prog in programs:
        assert recv_exactly(prog, 6) == b"first "
    slot, legs = plane.clone_replica(2, None)
    clone_prog, clone_leg = socket.socketpair()
    plane.clone_attach(slot, 1, clone_leg, b"")   # 2 had read all
    plane.set_pid(slot, os.getpid())
    plane.release(2)
    assert plane.park(slot) == 1
    flood = os.urandom(3 << 20)                   # more than the plane queues before it stops reading
    got = [None] * len(programs)

    def read(i):
        got[i] = recv_exactly(programs[i], len(flood))
    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(programs))]
    for t in readers:
        t.start()
    client.sendall(flood)
    for t in readers:
        t.join(30)
    assert got == [flood] * len(programs)
    client2, gw2 = socket.socketpair()
    assert plane.open_conn(2, gw2)
    progs2 = []
    for s in range(3):
        prog, leg = socket.socketpair()
        plane.attach(s, 2, leg)
        progs2.append(prog)
    client2.sendall(b"second")
    client2.shutdown(socket.SHUT_WR)
    for prog in progs2:
        assert recv_exactly(prog, 6) == b"second" and at_eof(prog)
        prog.close()
    assert at_eof(client2)
    assert eventually(lambda: "2" not in plane.summary(0)), "connection 2 is done at the running replicas"
    clone_prog.settimeout(0.1)
    with pytest.raises(TimeoutError):
        clone_prog.recv(1)
    plane.wake(slot, None)
    assert recv_exactly(clone_prog, len(flood)) == flood
    prog2, leg2 = socket.socketpair()
    plane.attach(slot, 2, leg2)                   # its relay hands it over, as to any joiner
    assert recv_exactly(prog2, 6) == b"second" and at_eof(prog2)
    prog2.close()
    assert (tmp_path / "input" / "conn-2").exists()
    assert plane.forget_through(1) == 0, "connection 1 is open"
    assert plane.forget_through(2) == 1 and not (tmp_path / "input" / "conn-2").exists()
    clone_prog.close()


def test_a_clone_of_a_replica_still_replaying_logged_input_is_refused(tmp_path):
    (tmp_path / "input").mkdir()
    plane = DataPlane(tmp_path / "input")
    try:
        first = plane.add_replica(Proc(0), None)
        plane.set_primary(first)
        client, gw_side = socket.socketpair()
        assert plane.open_conn(1, gw_side)
        prog, leg = socket.socketpair()
        plane.attach(first, 1, leg)
        client.sendall(b"x" * (1 << 20))   # more than a socket holds: the joiner's replay lasts
        assert recv_exactly(prog, 1 << 20)
        joiner = plane.add_replica(Proc(1), None)
        jprog, jleg = socket.socketpair()
        plane.attach(joiner, 1, jleg)
        with pytest.raises(OSError, match="Device or resource busy"):
            plane.clone_replica(joiner, None)
        assert plane.open_legs(joiner) == 1, "the refused clone left the joiner as it was"
    finally:
        plane.stop()


def test_a_clone_of_a_connection_not_handed_over_yet_counts_its_queued_input(tmp_path):
    """Input queued for a leg not connected yet goes to the clone's copy of
    the leg too, and is counted as queued for the clone: once both are
    connected and drained, nothing stays counted, and the clients are
    still read (a count off by what was copied would hold them forever)."""
    plane = DataPlane(None, queue_limit=4 << 20)
    try:
        slots = [plane.add_replica(Proc(k), None) for k in range(2)]
        plane.set_primary(slots[0])
        client, gw_side = socket.socketpair()
        client.settimeout(10)
        assert plane.open_conn(1, gw_side)
        prog0, leg0 = socket.socketpair()
        plane.attach(slots[0], 1, leg0)
        early = b"queued for the backup" * 40000   # 840 kB; its leg is not connected: queued
        client.sendall(early)
        assert recv_exactly(prog0, len(early)) == early
        slot, legs = plane.clone_replica(slots[1], None)
        assert [(c, state) for c, _ino, state in legs] == [(1, 0)]
        plane.release(slots[1])
        progs = []
        for s in (slots[1], slot):
            prog, leg = socket.socketpair()
            plane.attach(s, 1, leg)
            progs.append(prog)
        plane.set_pid(slot, os.getpid())
        for prog in progs:
            assert recv_exactly(prog, len(early)) == early
        import threading
        got = {id(p): 0 for p in [prog0, *progs]}

        def drain(prog, n):
            got[id(prog)] += len(recv_exactly(prog, n))
        chunk, chunks = 1 << 14, 32   # 512 KiB: the clone's leg queues some while it does not read
        readers = [threading.Thread(target=drain, args=(p, chunk * chunks)) for p in (prog0, progs[0])]
        for t in readers:
            t.start()
        for _ in range(chunks):
            client.sendall(b"y" * chunk)
        drain(progs[1], chunk * chunks)   # the clone reads late: its queue empties
        for t in readers:
            t.join(10)
        client.sendall(b"z" * chunk)      # still read from the client: nothing holds it
        for prog in [prog0, *progs]:
            assert recv_exactly(prog, chunk) == b"z" * chunk
    finally:
        plane.stop()
