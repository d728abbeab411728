"""A newcomer across hosts brought up from a checkpoint of a backup's
replica, or of the primary's where no backup gives one, once the group's
history is past --history-limit (llft/cluster/checkpoint_join.py,
backup_checkpoint.py): members in network namespaces, CRIU real, the
program restored on the newcomer's host."""
from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import tool
from serving import Progress, concurrently
from test_multihost import (PROGRAM_PORT, UDP_MEMBER_OPTIONS, cluster, cluster_of,  # noqa: F401 (fixtures)
                            new_view_at, numbering_agrees, outputs_of, primary_index, udp_clients, write_until,
                            writes_then_reads)

LIMIT = ["--history-limit", "0.05"]          # 52 KB
VALUE = "v" * 500


def said(c, lines: list[str]) -> list[str]:
    """The replies to lines, one line each (redis's without its CR)."""
    return [r.rstrip("\r") for r in c.lines(lines)[0]]


def past_the_limit(cluster, ok: str = "OK", n: int = 200):
    """n requests of half a kilobyte (each answered ok): every member's
    history passes LIMIT."""
    c = cluster.client()
    assert said(c, [f"SET big{j} {VALUE}" for j in range(n)]) == [ok] * n
    c.close()
    for _, d in cluster.members:
        cluster.wait(lambda d=d: not cluster.status(d)["history"]["complete"], "the history to pass its limit")


def joined_from_a_checkpoint(run_dir, source: str | None = None):
    """The member of run_dir joined from a checkpoint (of the source
    given: "backup" or "primary")."""
    text = (run_dir / "llft.log").read_text()
    sources = [source] if source else ["backup", "primary"]
    assert any(f"from a checkpoint of the {s}" in text and f"restored from the {s}'s checkpoint" in text
               for s in sources), text


def images_dropped(cluster, k: int):
    """Member k keeps no image it offered once the admission ended."""
    controller = cluster.status(cluster.members[k][1])["controller_pid"]
    cluster.wait(lambda: not list(Path("/dev/shm").glob(f"llft-{controller}-ck*")),
                 f"member {k} to drop the image it offered", timeout=20, watch=False)


def newest_connection_agrees(cluster, indices):
    """The newest connection's output (its bytes and digest) is the same at
    every member: a newcomer restored from a checkpoint serves a new
    connection whole, as the others do."""
    def newest():
        outs = [outputs_of(cluster.status(cluster.members[k][1])) for k in indices]
        key = max((int(k) for k in outs[0] if k != "closed"), default=None)
        return key, [o.get(str(key)) for o in outs]

    def same():
        key, outs = newest()
        return key is not None and outs[0] is not None and outs[0]["closed"] and all(o == outs[0] for o in outs)
    try:
        cluster.wait(same, "the newest connection's output to agree", timeout=20, watch=False)
    except AssertionError:
        raise AssertionError(f"the newest connection's output, by member: {newest()}") from None


def outputs_agree(cluster, indices):
    """What each member's replica sent, per connection (bytes, digest,
    closed), is the same everywhere: a newcomer's digests go on from the
    checkpoint's, and it lists the connections closed before it as the
    primary does."""
    def outputs():
        return [outputs_of(cluster.status(cluster.members[k][1])) for k in indices]
    try:
        cluster.wait(lambda: all(o == outputs()[0] for o in outputs()), "the outputs to agree", timeout=20,
                     watch=False)
    except AssertionError:
        raise AssertionError(f"outputs by member: {outputs()}") from None


def agree_then_newcomer_alone(cluster, keys: int):
    """The three members hold keys keys, number their messages alike and
    produced the same outputs; then the two older ones are killed in turn,
    leaving the newcomer (member 2) the primary, alone."""
    c = cluster.client()
    digest = c.lines(["DIGEST"])[0][0]
    c.close()
    assert digest.split()[2] == str(keys), digest
    numbering_agrees(cluster, [0, 1, 2])
    outputs_agree(cluster, [0, 1, 2])
    for _ in range(2):
        old = primary_index(cluster)
        cluster.kill("--primary")
        new_view_at(cluster, [2], cluster.status(cluster.members[old][1])["member"])


def test_a_newcomer_past_the_history_limit_joins_from_a_checkpoint(cluster, examples):
    """Past --history-limit, a newcomer is brought up from a checkpoint of
    the backup's replica (the primary serves on, not paused) taken at an
    exact point of the ordering stream: a client connection open across it
    goes on at every member (the newcomer's logged output is the tail of
    what the client received), the newcomer's state digest is the
    others', it numbers its messages as the primary does, and it takes
    over when the others are gone, with nothing acknowledged lost; the
    members killed meanwhile rejoin from checkpoints too (of the primary:
    no backup is left), one of them taken of the restored replica."""
    extra = [*LIMIT, "--log-output"]
    program = [examples / "kv_server", PROGRAM_PORT]
    cluster.start_members(2, program, extra=extra)
    cluster.start_gateway(3)
    past_the_limit(cluster)
    kept = cluster.client()                      # open across the checkpoint
    _, received = kept.lines([f"SET kept{j} k{j}" for j in range(10)])
    late = cluster.start_member(2, program, extra=extra)
    cluster.wait_members(3)
    joined_from_a_checkpoint(late, "backup")
    assert primary_index(cluster) == 0
    assert "checkpoint of the primary" not in (cluster.members[0][1] / "llft.log").read_text()
    # The image it offered is the backup's to keep only until the admission ends.
    images_dropped(cluster, 1)
    said_by = {k: subprocess.run([tool("llft-status"), "--run-dir", str(cluster.members[k][1])], capture_output=True,
                                 text=True).stdout for k in (0, 1, 2)}
    assert "last checkpoint" not in said_by[0], said_by
    assert "last checkpoint: of this replica for newcomer" in said_by[1], said_by
    assert "this backup (the primary not paused) frozen" in said_by[1], said_by
    assert "this replica: restored from the backup's checkpoint" in said_by[2], said_by
    replies, raw = kept.lines([f"SET kept{j} k{j}" for j in range(10, 30)] + [f"GET kept{j}" for j in range(30)])
    assert replies == ["OK"] * 20 + [f"VALUE k{j}" for j in range(30)]
    received += raw
    writes_then_reads(cluster, "after", 20)
    newest_connection_agrees(cluster, [0, 1, 2])
    agree_then_newcomer_alone(cluster, 250)
    replies, raw = kept.lines(["GET kept29", "SET kept30 k30", "GET big199"])
    assert replies == ["VALUE k29", "OK", f"VALUE {VALUE}"]
    received += raw
    kept.close()
    # What the newcomer's replica wrote on the kept connection (logged with
    # --log-output, once the connection is done) is what the client got,
    # from the checkpoint on.
    log = next(f for f in (late / "replica-2" / "output").glob("conn-*")
               if int(f.name[5:]) & 0xFFFFFFFF == 2)   # (the gateway's second connection)
    cluster.wait(lambda: log.stat().st_size > 0, "the kept connection's log")
    kept_log = log.read_bytes()
    assert len(kept_log) < len(received) and received.endswith(kept_log), (kept_log[:200], received[-200:])
    assert kept_log.endswith(raw) and b"VALUE k10\n" in kept_log, kept_log[-300:]
    c = cluster.client()
    assert c.lines(["DIGEST"])[0][0].split()[2] == str(251)
    c.close()
    assert primary_index(cluster) == 2
    for k in (0, 1):
        joined_from_a_checkpoint(cluster.members[k][1])


def test_a_backups_checkpoint_taken_under_writers_loses_nothing(cluster, examples):
    """Writers never stop while the newcomer joins from the backup's
    checkpoint, started after the writers' 300th reply: what the backup had
    received but not yet given its program, and the ordering it had not
    yet applied, go in the cut.  The newcomer's digest and numbering then
    equal the others', and once both older members are killed it serves
    every acknowledged write alone."""
    program = [examples / "kv_server", PROGRAM_PORT]
    cluster.start_members(2, program, extra=LIMIT)
    cluster.start_gateway(3)
    past_the_limit(cluster)
    stop, acked, progress = threading.Event(), {}, Progress()

    def join_meanwhile():
        try:
            progress.wait(300)
            late = cluster.start_member(2, program, extra=LIMIT)
            cluster.wait_members(3)
            joined_from_a_checkpoint(late, "backup")
            progress.wait(progress.replies + 300)   # the newcomer follows the writers a while
        finally:
            stop.set()

    concurrently(lambda i: write_until(cluster, i, stop, acked, progress=progress), 3, join_meanwhile, timeout=240)
    total = sum(acked.values())
    agree_then_newcomer_alone(cluster, 200 + total)
    c = cluster.client()
    for i, n in acked.items():
        assert c.lines([f"GET w{i}-{j}" for j in range(n)])[0] == [f"VALUE v{j}" for j in range(n)], i
    c.close()


def test_the_primary_is_checkpointed_when_its_backup_gives_no_checkpoint(cluster, examples):
    """The backup asked for the newcomer's checkpoint cannot take one (no
    CRIU on its host): it says why, and the primary checkpoints its own
    replica instead; the newcomer joins from that."""
    program = [examples / "kv_server", PROGRAM_PORT]
    first = cluster.start_member(0, program, extra=LIMIT)
    cluster.wait(lambda: (st := cluster.status(first)) and st["members"], "the first member")
    no_criu = {"LLFT_CRIU_PREFIX": str(cluster.tmp / "no-criu"), "PATH": "/usr/bin:/bin"}
    backup = cluster.start_member(1, program, extra=LIMIT, env=no_criu)
    cluster.wait_members(2)
    cluster.start_gateway(3)
    past_the_limit(cluster)
    late = cluster.start_member(2, program, extra=LIMIT)
    cluster.wait_members(3)
    joined_from_a_checkpoint(late, "primary")
    assert "CRIU does not work at member" in (backup / "llft.log").read_text()
    assert "this primary's replica is checkpointed instead" in (first / "llft.log").read_text()
    images_dropped(cluster, 0)
    writes_then_reads(cluster, "after", 20)
    numbering_agrees(cluster, [0, 1, 2])
    outputs_agree(cluster, [0, 1, 2])


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server not installed (scripts/setup.sh installs it)")
def test_redis_with_an_aof_joins_from_a_checkpoint(cluster, examples, tmp_path):
    """redis with an append-only file, each replica in its own view of the
    files: the newcomer gets what the primary's replica wrote (its upper
    layers) with the checkpoint, its AOF goes on where the primary's was,
    and it takes over with every key."""
    data = tmp_path / "redis-data"
    data.mkdir()
    program = [shutil.which("redis-server"), "--port", str(PROGRAM_PORT), "--save", "", "--appendonly", "yes",
               "--appendfsync", "everysec", "--dir", str(data), "--enable-debug-command", "yes"]
    cluster.start_members(2, program, extra=LIMIT)
    cluster.start_gateway(3)
    past_the_limit(cluster, "+OK")
    late = cluster.start_member(2, program, extra=LIMIT)
    cluster.wait_members(3)
    joined_from_a_checkpoint(late)
    c = cluster.client()
    assert said(c, [f"SET after{j} a{j}" for j in range(50)]) == ["+OK"] * 50
    c.close()
    c = cluster.client()
    assert said(c, ["DEBUG DIGEST"])[0].startswith("+")
    c.close()
    newest_connection_agrees(cluster, [0, 1, 2])
    numbering_agrees(cluster, [0, 1, 2])
    aofs = sorted((late / "replica-2" / "files").rglob("*.aof"))
    assert aofs and any(b"after49" in f.read_bytes() and b"big0" in f.read_bytes() for f in aofs), aofs
    assert not any(data.iterdir()), "a replica wrote into the machine's files"
    for _ in range(2):
        old = primary_index(cluster)
        cluster.kill("--primary")
        new_view_at(cluster, [2], cluster.status(cluster.members[old][1])["member"])
    c = cluster.client()
    assert said(c, ["DBSIZE", "SET last 1", "DBSIZE"]) == [":250", "+OK", ":251"]
    c.close()


def test_a_program_with_udp_ports_is_not_checkpointed_and_the_newcomer_is_told(cluster, examples):
    """What a checkpoint cannot carry to another host (a UDP port) is found
    at the checkpoint's instant: the newcomer, already in the view, is
    removed again and refused with the reason, and the group serves on."""
    options = [*UDP_MEMBER_OPTIONS, *LIMIT]
    program = [examples / "udp_server", PROGRAM_PORT]
    cluster.start_members(2, program, options)
    cluster.start_gateway(3, extra=["--udp-port", str(PROGRAM_PORT)])
    sent = 0
    while any(cluster.status(d)["history"]["complete"] for _, d in cluster.members):
        assert udp_clients(cluster, 2, 50) == list(range(sent + 1, sent + 101))
        sent += 100
        assert sent < 2000, "the history never passed its limit"
    cluster.start_member(2, program, extra=options)
    p, late = cluster.members[-1]
    assert p.wait(timeout=60) == 1
    err = p.stderr.read()
    assert "could not join group kv" in err and "UDP port" in err, err
    cluster.members.remove((p, late))
    cluster.procs.remove(p)
    cluster.wait_members(2)
    assert udp_clients(cluster, 2, 10) == list(range(sent + 1, sent + 21))


def test_a_newcomer_without_criu_is_refused_past_the_limit(cluster, examples):
    """A newcomer that cannot restore a checkpoint (no CRIU on its host)
    says so when it asks to join, and is refused at once with the reason,
    the primary paused for nothing."""
    program = [examples / "kv_server", PROGRAM_PORT]
    first = cluster.start_members(2, program, extra=LIMIT)
    cluster.start_gateway(3)
    past_the_limit(cluster)
    taken = (first / "llft.log").read_text().count("checkpoint of the primary")   # (the backup's, maybe)
    cluster.start_member(2, program, extra=LIMIT, env={"LLFT_CRIU_PREFIX": str(cluster.tmp / "no-criu"),
                                                       "PATH": "/usr/bin:/bin"})
    p, late = cluster.members[-1]
    assert p.wait(timeout=60) == 1
    err = p.stderr.read()
    assert "checkpoints are off here (CRIU is not installed" in err, err   # at start-up, in one line
    assert "the newcomer cannot restore a checkpoint instead" in err, err
    assert (first / "llft.log").read_text().count("checkpoint of the primary") == taken
    cluster.members.remove((p, late))
    cluster.procs.remove(p)
    writes_then_reads(cluster, "after", 20)


def test_a_newcomer_that_cannot_restore_the_checkpoint_gives_up_clearly(cluster, examples, tmp_path):
    """The newcomer writes the primary's image into --checkpoint-dir, here
    a 256 KiB tmpfs of its own: the image does not fit.  It says why, tries
    again (a new checkpoint each time), gives up after three, and exits 1
    with the reason; the group, which had it in its view each time, serves
    on without it."""
    program = [examples / "kv_server", PROGRAM_PORT]
    cluster.start_members(2, program, extra=LIMIT)
    cluster.start_gateway(3)
    past_the_limit(cluster)
    small = tmp_path / "small"
    small.mkdir()
    in_small_tmpfs = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                      'mount -t tmpfs -o size=256k llft-test "$0" && exec "$@"', str(small)]
    cluster.start_member(2, program, extra=[*LIMIT, "--checkpoint-dir", str(small)], prefix=in_small_tmpfs)
    p, late = cluster.members[-1]
    assert p.wait(timeout=120) == 1
    err = p.stderr.read()
    assert "No space left on device" in err and "3 attempts failed, this member gives up" in err, err
    assert err.count("this member joins again") == 2, err
    assert list(small.iterdir()) == [], "the tmpfs was the test's own: nothing reached the directory beneath"
    cluster.members.remove((p, late))
    cluster.procs.remove(p)
    cluster.wait_members(2)
    writes_then_reads(cluster, "after", 20)
