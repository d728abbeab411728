"""The virtual determinizer end to end: real programs, real processes, the
real preload library.  A program that races on locks, clocks and random
numbers is first shown to be non-deterministic on its own, then shown to
print the primary's results in every replica under llft."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llft.native import EXIT_DIVERGED, EXIT_NOSTREAM
from llft import PRELOAD_LIBRARY

PROGRAMS = Path(__file__).with_name("programs")


def digests(text: str) -> dict[str, str]:
    return dict(line.split("=", 1)[0:2] for line in text.split() if "=" in line)


def test_race_is_nondeterministic_without_llft(examples):
    runs = [subprocess.run([examples / "race", "4", "2000"], capture_output=True, text=True, check=True).stdout
            for _ in range(6)]
    orders = {digests(r)["order"] for r in runs}
    values = {digests(r)["values"] for r in runs}
    assert len(orders) > 1, "the lock order never changed: the example does not race"
    assert len(values) == len(runs), "clock and random values should differ on every run"


def test_race_replicas_agree_run_after_run(examples, llft_run):
    seen = set()
    for _ in range(10):
        run = llft_run([examples / "race", "4", "2000"], replicas=3)
        assert run.status == 0, run.stderr
        primary = run.out(0)
        assert "digest=" in primary
        for k in (1, 2):
            assert run.out(k) == primary, f"replica {k} differs from the primary"
        seen.add(digests(primary)["digest"])
    assert len(seen) > 1, "every run gave the same digest: nothing was non-deterministic"


def test_inputs_read_through_libcs_generic_syscall_agree(examples, llft_run):
    """syscall(SYS_getrandom), the clocks, getpid, getrusage and times
    through libc's generic entry (as OpenSSL and libuv reach getrandom):
    every replica prints the primary's values (llft-run exits 86 when the
    replicas' stdout differ)."""
    run = llft_run([examples / "syscall_inputs"])
    assert run.status == 0, run.stderr
    assert run.out(0).startswith("getrandom 16:"), run.out(0)
    assert run.out(1) == run.out(0) and run.out(2) == run.out(0)


def test_fd_numbers_race_and_replicas_agree(examples, llft_run):
    """Threads make pipes, eventfds, socketpairs, sockets and copies of them
    and close them again: which thread gets which number changes from run to
    run.  Every replica gets the primary's numbers (epoll sets, poll arrays
    and a program's fd-indexed tables name fds by number).  Before pipes
    and the rest were made under the primary's numbers, in its order, the
    backups' threads deadlocked on each other's numbers."""
    plain = {subprocess.run([examples / "fd_race", "4", "200"], capture_output=True, text=True,
                            check=True).stdout for _ in range(5)}
    assert len(plain) > 1, "the fd numbers never changed: the example does not race"
    for _ in range(3):
        run = llft_run([examples / "fd_race", "8", "300"], extra=["--backup-exit-timeout", "20"])
        assert run.status == 0, run.stderr
        assert "all " in run.out(0)
        assert run.out(1) == run.out(0) and run.out(2) == run.out(0)


def test_accepted_connections_take_fd_numbers_in_the_primarys_order(examples, tmp_path):
    """fd_race's workers churn fd numbers while another thread accepts
    connections, which reuse the numbers the workers just closed; each
    accept and each worker round pass one mutex.  A backup that placed an
    accepted connection on its number before the worker that had the
    number first at the primary made it, waited for the mutex while that
    worker waited for the number (accepts took their listener's turn only,
    not the fd numbers')."""
    from serving import ServingGroup
    for attempt in range(2):
        # (151: ServingGroup's connection to see the port open is the first)
        group = ServingGroup(tmp_path / f"rd{attempt}", [examples / "fd_race", 3, 50, 7000, 151],
                             extra=["--backup-exit-timeout", "20"])
        for _ in range(150):
            with group.connect() as s:
                assert s.makefile().readline() == "ok\n"
        group.finish(timeout=90)
        assert group.proc.returncode == 0, group.stderr[-3000:]
        outs = [(group.run_dir / f"replica-{i}" / "stdout").read_text() for i in range(3)]
        assert "acceptor fds" in outs[0] and outs[1] == outs[0] and outs[2] == outs[0]


def test_many_threads_and_long_queues(examples, llft_run):
    """16 threads, enough records per thread to span many queue chunks."""
    run = llft_run([examples / "race", "16", "3000"], replicas=2)
    assert run.status == 0, run.stderr
    assert run.out(1) == run.out(0)


def test_more_threads_than_wake_bits(examples, llft_run):
    """A backup's waiting threads sleep with one bit of 32 (thread id mod
    32, native/replay.c): with 48 threads, pairs share a bit and wake each
    other for records that are not theirs; each must look again, sleep,
    and still get its own, with every replica computing the primary's."""
    run = llft_run([examples / "race", "48", "400"], replicas=3)
    assert run.status == 0, run.stderr
    assert "order=" in run.out(0) and run.out(1) == run.out(0) and run.out(2) == run.out(0)


def test_python_interpreter_replicas_agree(real_python, llft_run):
    plain = {subprocess.run([real_python, PROGRAMS / "py_threads.py"], capture_output=True, text=True,
                            check=True).stdout.splitlines()[0] for _ in range(4)}
    assert len(plain) > 1, "set order should change between plain runs (hash randomisation)"
    for _ in range(3):
        run = llft_run([real_python, PROGRAMS / "py_threads.py"], replicas=2)
        assert run.status == 0, run.stderr
        assert run.out(0).startswith("set ")
        assert run.out(1) == run.out(0)


def test_forced_gil_hand_offs_race_and_python_replicas_agree(real_python, llft_run):
    """CPython forces the GIL from a thread that runs Python code without
    blocking, at a point no record marks (native/python_gil.c): on its own
    the program prints something else on every run; under llft every
    replica prints the primary's, because the shim lengthens the switch
    interval; with the interpreter's own interval kept, a backup diverges."""
    program = [real_python, PROGRAMS / "gil_race.py"]
    plain = set()
    for _ in range(12):   # (on a loaded machine runs come out alike more often)
        plain.add(subprocess.run(program, capture_output=True, text=True, check=True).stdout)
        if len(plain) > 1:
            break
    assert len(plain) > 1, "the hand-offs never changed: the example does not race"
    for _ in range(3):
        run = llft_run(program, replicas=3)
        assert run.status == 0, run.stderr
        assert run.out(1) == run.out(0) and run.out(2) == run.out(0)
    kept = [llft_run(program, replicas=3, env={"LLFT_PYTHON_GIL_SWITCHING": "1"}) for _ in range(3)]
    assert EXIT_DIVERGED in [r.status for r in kept], "with forced hand-offs a backup should diverge"


def test_program_started_through_an_exec_wrapper(examples, llft_run):
    run = llft_run([PROGRAMS / "exec_wrapper.sh", examples / "race", "4", "1000"], replicas=2)
    assert run.status == 0, run.stderr
    assert run.out(1) == run.out(0)


def test_divergence_is_reported_with_thread_and_call(examples, llft_run):
    run = llft_run([examples / "race", "4", "2000"], replicas=3, env={"RACE_DIVERGE_REPLICA": "1"})
    assert run.status == EXIT_DIVERGED
    assert "replica 1 (backup)" in run.stderr
    assert "thread 1 call #" in run.stderr
    assert "called clock_gettime" in run.stderr
    assert "divergence" in run.err(1)
    assert run.out(2) == run.out(0), "the other backup stays consistent"


def test_saved_stream_replays_and_truncated_stream_is_reported(examples, llft_run, tmp_path):
    saved = tmp_path / "race.stream"
    rec = llft_run([examples / "race", "4", "1000"], replicas=1, extra=["--save-stream", str(saved)])
    assert rec.status == 0, rec.stderr
    rep = llft_run([examples / "race", "4", "1000"], extra=["--replay-from", str(saved)])
    assert rep.status == 0, rep.stderr
    assert rep.out(1) == rec.out(0)

    cut = tmp_path / "cut.stream"
    cut.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    bad = llft_run([examples / "race", "4", "1000"], extra=["--replay-from", str(cut), "--end-grace", "1"],
                   timeout=60)
    assert bad.status == EXIT_DIVERGED
    assert "incomplete" in bad.stderr or "truncated" in bad.stderr


def test_threads_past_the_primarys_end_stop_as_the_primarys_did(examples, llft_run):
    """Replica 1's main thread misses the stop flag (set late there) and
    reads the clock once more than the primary ever did, while its worker
    waits on a condition the primary's never returned from.  Both are where
    the primary's threads were when it exited: replica 1 has done all the
    primary did and ends with its status, not as an incomplete stream."""
    run = llft_run([examples / "stop_flag"], replicas=3, env={"STOP_FLAG_LATE_REPLICA": "1"},
                   extra=["--end-grace", "1"])
    assert run.status == 3, run.stderr
    assert "replayed the primary's whole stream" in run.err(1)
    assert "exiting with the primary's status 3" in run.err(1)
    assert "incomplete" not in run.stderr


@pytest.mark.parametrize("quiet", [False, True], ids=["handler-reads-clock", "quiet-handler"])
@pytest.mark.parametrize("late", [None, "1"], ids=["in-step", "late-replica"])
def test_event_loop_wait_returns_after_the_calls_before_it(examples, llft_run, late, quiet):
    """memcached's shutdown shape: the main thread polls in a loop until a
    flag, set by a worker's signal handler without a lock, says stop; then
    it closes a pipe.  A backup's replayed poll returns only once the worker
    has started each call the primary recorded before that poll returned
    (the handler's clock read), so its main thread sees the flag where the
    primary's did and closes the pipe too; without that its polls ran ahead
    of the worker, even in step ("called poll; the primary's next record for
    this thread is close").  Replica 1 raises the signal 200 ms late.  With
    a quiet handler (memcached's only prints) the raise itself is the
    record: a backup raises for real before it takes it."""
    run = llft_run([examples / "stop_signal", *(["quiet"] if quiet else [])], replicas=3,
                   env={"STOP_FLAG_LATE_REPLICA": late} if late else {})
    assert run.status == 3, run.stderr
    assert "diverge" not in run.stderr and "different call" not in run.stderr


def test_a_program_that_ends_with_underscore_exit_ends_after_its_primary(examples, llft_run):
    """_exit() runs no destructors (dash's exit builtin ends so): a backup
    must still wait for its primary's end of stream.  The primary spins
    before its _exit, so without that wait both backups end first, are
    taken for gone astray, and the group exits 86."""
    run = llft_run([examples / "late_exit", 7], replicas=3, env={"LATE_REPLICA": "0"})
    assert run.status == 7, run.stderr


@pytest.mark.parametrize("serialize", [False, True], ids=["threads at once", "serialize"])
def test_a_backup_still_replaying_after_its_primarys_end_finishes(examples, llft_run, serialize):
    """--end-grace bounds how long a backup may go without progress after
    the primary's end, not how long it may take: replica 1 spins a
    millisecond after each of 1000 rounds the primary runs at once, so it
    replays for about a second after its primary exited, its waiter thread
    parked on a turn hundreds of rounds ahead all along (npm's backup under
    a loaded machine lags so at its exit).  With a grace of 0.5 s counted
    from the end, it would be called incomplete and the group exit 86."""
    run = llft_run([examples / "lagging_replica", 1000], replicas=2,
                   extra=["--end-grace", "0.5", *(["--serialize"] if serialize else [])], env={"LAG_REPLICA": "1"})
    assert run.status == 0, run.stderr
    assert run.out(1) == run.out(0) == f"counter={sum(range(1000)) * 3}\n"


def test_missing_stream_is_a_clear_error_not_a_hang(examples, tmp_path):
    env = {**os.environ, "LD_PRELOAD": str(PRELOAD_LIBRARY), "LLFT_SHM": str(tmp_path / "nope")}
    proc = subprocess.run([examples / "race", "2", "10"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == EXIT_NOSTREAM
    assert "cannot attach the record stream" in proc.stderr


def test_unreplicated_program_runs_untouched_under_the_library(examples):
    """Preloaded without LLFT_SHM (e.g. a child the replica starts), the
    library only passes calls through."""
    env = {k: v for k, v in os.environ.items() if k != "LLFT_SHM"}
    env["LD_PRELOAD"] = str(PRELOAD_LIBRARY)
    proc = subprocess.run([examples / "race", "2", "100"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "digest=" in proc.stdout


def test_thread_per_request_churn(real_python, llft_run):
    """Hundreds of short-lived threads: queues are created and reclaimed."""
    run = llft_run([real_python, PROGRAMS / "thread_churn.py", "600"], replicas=3)
    assert run.status == 0, run.stderr
    assert run.out(0).startswith("600 ")
    assert run.out(1) == run.out(0) and run.out(2) == run.out(0)


def test_thousands_of_detached_threads_waiting_on_one_mutex(examples, llft_run):
    """3,000 detached threads, thousands of them alive at a backup at once,
    each waiting for its turn on one mutex: a finished turn wakes exactly
    the next taker however many wait (waking every waiter at every turn
    made the backup crawl, and stop as stalled), and the threads' queue
    slots are taken again as they end."""
    run = llft_run([examples / "detached_churn", 3000], replicas=3, timeout=120)
    assert run.status == 0, run.stderr
    assert run.out(0) == "3000 threads\n"
    assert run.out(1) == run.out(0) and run.out(2) == run.out(0)


def test_backups_keep_group_clock_offsets(examples, llft_run):
    """Consistent Time Service bookkeeping: the primary's offset is 0; each
    backup tracks group clock minus its own clock.  On one host both read
    the same clocks, the primary earlier, so the offset is small and <= 0."""
    import json
    run = llft_run([examples / "race", "2", "500"], replicas=3)
    assert run.status == 0, run.stderr
    state = json.loads((run.run_dir / "llft-run.json").read_text())
    primary, *backups = state["replicas"]
    assert set(primary["clock_offsets_ns"].values()) == {0}
    for b in backups:
        for clock in ("realtime", "monotonic"):
            off = b["clock_offsets_ns"][clock]
            assert -5_000_000_000 < off <= 0, (clock, off)
        assert b["clock_offsets_ns"]["monotonic"] != 0, "a replaying backup must record its offset"
