"""llft-run: run a program as a replicated group."""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from llft import PRELOAD_LIBRARY, rundir
from llft.cli.advice import known_race, races_by_design
from llft.cli.cluster_options import add_network_options, network_settings, run_until_signal
from llft.cli.common import LOG_LEVELS, Parser, UsageError, fail, reader_may_stop, setup_logging
from llft.cluster.history import DEFAULT_LIMIT as DEFAULT_HISTORY_LIMIT
from llft.cluster.member import FAULT_TIMEOUT_ORDINARY_S, FAULT_TIMEOUT_S, HostMember, MemberOptions
from llft.ordering.group import JoinRefused
from llft.follow import STALL_S
from llft.replication.group import LocalGroup
from llft.replication.options import GroupOptions
from llft.native import DEFAULT_SLOTS, EXIT_DIVERGED, StreamError
from llft.ordering.backend import ORDERS
from llft.private_files import PrivateFilesUnavailable
from llft.private_files import check_available as check_private_files
from llft.process_tree import become_subreaper
from llft.program_kind import unreachable

PROG = "llft-run"
MIN_FAULT_TIMEOUT_MS = 20.0
log = logging.getLogger("llft.run")

DESCRIPTION = """\
Run PROGRAM as a replicated group: replica 0 is the primary, the others are
backups.  Every replica runs the same binary under the llft preload library.
The primary records the outcome of each non-deterministic call (clocks,
thread creation, lock acquisitions, condition waits, randomness) and the
backups replay them, so every replica computes the same thing.

Each replica's stdout and stderr go to RUN_DIR/replica-K/{stdout,stderr};
the controller's log goes to RUN_DIR/llft.log.

A backup that diverges, or stops replaying, is reported at once on stderr
and in the log, with its report in RUN_DIR/replica-K/divergence.txt.

Exit status: the primary's, once every replica has finished; 86 if a backup
diverged from the primary, its record stream was incomplete, or its stdout
differs from the primary's (the reason is printed), also when stopped by a
signal; 2 for a bad command line; 128+N if stopped by signal N."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
               usage=f"{PROG} [options] -- PROGRAM [ARGS...]")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="number of replicas on this host, primary included (default 3)")
    p.add_argument("--join", action="store_true",
                   help="run one replica on this host as a member of group --group across hosts: the first "
                        "member founds the group as its primary, later ones join as backups (before the first "
                        "client connects); clients connect through llft-gateway")
    p.add_argument("--run-dir", type=Path, metavar="DIR",
                   help="where replica output, logs and state go (default ./llft-runs/GROUP-TIME-PID)")
    p.add_argument("--group", metavar="NAME", help="group name (default: the program's name)")
    p.add_argument("--ring-slots", type=int, default=DEFAULT_SLOTS, metavar="N",
                   help=f"OrderInfo ring size per replica, a power of two (default {DEFAULT_SLOTS})")
    p.add_argument("--fault-timeout", type=float, metavar="MS",
                   help="a replica frozen (stopped) this long is failed and fenced; a failed primary is "
                        "replaced by the backup of lowest rank (default 30).  With --join: how long the backup "
                        "of rank 2 waits without a word from the primary before it proposes itself (default "
                        f"{FAULT_TIMEOUT_S * 1000:.0f} when the member may run its controller at real-time "
                        f"priority, as root, else {FAULT_TIMEOUT_ORDINARY_S * 1000:.0f}; at "
                        "least 20: a liveness Heartbeat comes every 5); the primary removes a backup silent "
                        "for longer than every backup waits")
    p.add_argument("--fault-timeout-step", type=float, metavar="MS",
                   help="with --join: each backup after the first (by rank) suspects a silent primary this much "
                        "later than the one before, so that they do not compete (default: the fault timeout; "
                        "0 makes them all time out together)")
    p.add_argument("--no-realtime", action="store_true",
                   help="with --join: run this member's controller at ordinary priority, not real-time (which it "
                        "takes when permitted, so that a loaded host does not delay its Heartbeats past the "
                        "fault timeout); the default fault timeout is then 150")
    p.add_argument("--no-rejoin", action="store_true",
                   help="with --join: when this member is left out of the group, or its replica fails, exit "
                        "(status 3, or the replica's) instead of resetting and joining again with a fresh replica")
    p.add_argument("--history-limit", type=float, default=DEFAULT_HISTORY_LIMIT / (1 << 20), metavar="MIB",
                   help="with --join: a member keeps the group's history (every ordering entry and client "
                        "request since the start) for members that join later, in memory, up to this many MiB "
                        "(default %(default)g); past it, it keeps none, and no new member can join (state "
                        "transfer replays the whole history; there are no checkpoints yet)")
    p.add_argument("--respawn", action="store_true",
                   help="when a replica fails (killed, crashed, or fenced after a freeze), start a new backup in "
                        "its place, with a new index, ranked last; it catches up by replaying the group's whole "
                        "history (every OrderInfo record and every client's input since the start, kept in "
                        "RUN_DIR), so the group survives any number of failures one after another.  Off by "
                        "default: the history grows with the group's age, on disk and in catch-up time")
    p.add_argument("--keep", type=int, metavar="N",
                   help="keep the group at N replicas (N <= --replicas): a replica that fails is replaced by a "
                        "new backup cloned with CRIU from a live backup, at an exact point of the record "
                        "stream, however long the group has run (docs/checkpoints.md).  When no backup lives, "
                        "the replacement is restored from the stored checkpoint (--checkpoint-every) or replays "
                        "the group's history as with --respawn (which --keep implies), as it does without CRIU")
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                   help="with --keep: every SECONDS a checkpoint of a live backup is stored (its restore waits), "
                        "and the history before it is dropped, so that what llft-run keeps stays flat however "
                        "long the group runs; a replacement needed when no backup lives to be cloned (a group "
                        "of two) is restored from it and catches up (docs/checkpoints.md).  Default: off (the "
                        "whole history is kept for such a replacement to replay)")
    p.add_argument("--mode", choices=("semi-active", "semi-passive"), default="semi-active",
                   help="semi-active (the default): every replica executes, the backups replaying the primary's "
                        "records.  semi-passive (LLFT sec. II-E): only the primary executes; every "
                        "--checkpoint-every seconds a checkpoint of it is stored (CRIU, a full dump: the primary "
                        "is held still and frozen meanwhile), and the records and client input after it are "
                        "kept; when the primary fails, a copy of the checkpoint is restored, replays them and "
                        "takes over, the clients keeping their connections.  Needs CRIU and --checkpoint-every; "
                        "on one host the passive backups (--replicas - 1) share the stored checkpoint "
                        "(docs/checkpoints.md)")
    p.add_argument("--checkpoint-dir", type=Path, metavar="DIR",
                   help="with --keep: write each clone's image (about the program's memory in size) under DIR, "
                        "for the moment it takes to restore it, and the stored checkpoint's (--checkpoint-every) "
                        "for as long as it is kept, instead of in memory (/dev/shm); a dump that does not fit "
                        "fails, and the replacement replays the history.  With --join: where this member writes "
                        "a checkpoint of its replica for a newcomer (as primary), or the primary's it is "
                        "restored from (as a newcomer past the group's --history-limit)")
    p.add_argument("--divergence-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a backup thread that waits this long for a turn the primary already took "
                        "is reported as diverged (default 60)")
    p.add_argument("--end-grace", type=float, default=3.0, metavar="SECONDS",
                   help="after the primary exits, how long a backup may go without replaying any "
                        "record before its stream is called incomplete (a backup still catching up "
                        "finishes, within --backup-exit-timeout); threads with no record left stop "
                        "where the primary's were (default 3)")
    p.add_argument("--stall-alarm", type=float, default=STALL_S, metavar="SECONDS",
                   help="a backup that replays no record this long while records wait for it no longer follows "
                        "the primary: llft-run logs it (on stderr too) and llft-status flags it, since the group "
                        "can no longer fail over to it (default %(default)g)")
    p.add_argument("--backup-exit-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="after the primary exits, how long backups may take to finish (default 60)")
    p.add_argument("--save-stream", type=Path, metavar="FILE",
                   help="also write the primary's OrderInfo stream to FILE")
    p.add_argument("--replay-from", type=Path, metavar="FILE",
                   help="run no primary: run one backup replaying the stream saved in FILE")
    p.add_argument("--port", metavar="[PROG:]PUBLIC", action="append", default=[],
                   help="serve clients on PUBLIC instead of the port the program binds; PROG:PUBLIC maps one "
                        "of several ports (default: the program's own ports)")
    p.add_argument("--listen", "--host", dest="host", metavar="ADDR",
                   help="address the gateway listens on (default: the address the program bound, so that a "
                        "program bound to 127.0.0.1 is served on loopback only; 0.0.0.0 or :: widen it)")
    p.add_argument("--shared-files", action="store_true",
                   help="let the replicas write the machine's files themselves.  By default each replica "
                        "writes into its own overlay of the filesystem, RUN_DIR/replica-K/files/<mount>/upper "
                        "(llft-status shows where), reading the machine's files beneath it: replicas of a "
                        "program with a log or a data directory would otherwise write the same files.  "
                        "Without root, replicas share the files, with a warning")
    p.add_argument("--serialize", action="store_true",
                   help="let the program's threads run one at a time, taking turns at the calls llft sees "
                        "(locks, waits, reads, sleeps) in the order the primary records and the backups "
                        "follow, so that threads sharing memory outside any lock (atomics, flags, counters) "
                        "do the same at every replica.  Costs a record per such call and all parallelism.  "
                        "A thread that runs 10 ms without such a call (a spin on memory) has another run beside "
                        "it until its next one, and llft-run says so: there the threads race again.  On by "
                        "default for programs known to share memory so (node, java, memcached with its LRU "
                        "threads)")
    p.add_argument("--no-serialize", action="store_true",
                   help="run the threads of such a program at once all the same (its backups may diverge)")
    p.add_argument("--order", choices=ORDERS, default="llft",
                   help="the ordering backend that carries the primary's records to the backups: llft (the "
                        "default: LLFT's messaging; on one host, straight from ring to ring) or mailbox "
                        "(replicated shared-memory mailboxes: replicas on this host only; see "
                        "--mailbox-copies)")
    p.add_argument("--mailbox-copies", type=int, default=3, metavar="N",
                   help="with --order mailbox: copies of the mailbox, each in a shared-memory segment of its "
                        "own; N - 1 of them may fail (default 3)")
    p.add_argument("--mailbox-protocol", type=int, choices=(1, 2), default=1,
                   help="with --order mailbox: 1 tolerates crashed processes and copies (the default), 2 also "
                        "receivers with timing failures, deciding by majority")
    p.add_argument("--fork", choices=("unrecorded", "replicate"),
                   help="what becomes of the processes the program forks.  replicate (the default, where the "
                        "other options allow it): each is replicated with the program, on a record stream of its "
                        "own, its exit, its parent's waits and its signal handlers in the primary's order, the "
                        "connections it accepted handed to it at each backup, and fails over with it (nginx's "
                        "master and workers, prefork servers, dnsmasq's TCP children; docs/forked-processes.md).  "
                        "unrecorded (the default with --join, --keep, --mode "
                        "semi-passive or --replay-from, which replicate does not go with yet): "
                        "they run unrecorded at each replica, and one that would serve a client is refused")
    p.add_argument("--log-output", action="store_true",
                   help="keep what each replica sent on each connection in RUN_DIR/replica-K/output/")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="warning",
                   help="what the controller prints on stderr (default warning; llft.log gets everything)")
    p.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    add_network_options(p)
    return p


def resolve_program(name: str) -> str:
    if "/" in name:
        if not os.path.exists(name):
            raise UsageError(f"{name}: no such file")
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise UsageError(f"{name}: not an executable file")
        return name
    found = shutil.which(name)
    if not found:
        raise UsageError(f"{name}: command not found")
    return found


def check_reachable(path: str):
    """Refuses a program the preload library cannot reach (llft/program_kind.py)."""
    why = unreachable(path)
    if why:
        raise UsageError(f"cannot replicate it: {why}")


def parse(argv) -> tuple[argparse.Namespace, list[str]]:
    args = build_parser().parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise UsageError("no program given: llft-run [options] -- PROGRAM [ARGS...]")
    if args.order == "mailbox" and args.join:
        raise UsageError("--order mailbox reaches replicas on this host only: not with --join "
                         "(across hosts, use --order llft)")
    if args.join:
        if args.replicas is not None:
            raise UsageError("--join runs one replica on this host: start llft-run --join on each host "
                             "instead of --replicas")
        if not args.group:
            raise UsageError("--join needs --group NAME, the same on every host")
        if args.port or args.host:
            raise UsageError("with --join, clients connect through llft-gateway (its --port and --host)")
        args.key = network_settings(args)
    if args.serialize and args.no_serialize:
        raise UsageError("--serialize and --no-serialize: choose one")
    if args.order != "mailbox" and (args.mailbox_copies != 3 or args.mailbox_protocol != 1):
        raise UsageError("--mailbox-copies and --mailbox-protocol go with --order mailbox")
    if not 1 <= args.mailbox_copies <= 16:
        raise UsageError(f"--mailbox-copies must be from 1 to 16 (got {args.mailbox_copies})")
    args.replicas = 3 if args.replicas is None else args.replicas
    if args.replicas < 1:
        raise UsageError(f"--replicas must be at least 1 (got {args.replicas})")
    if args.replicas > 64:
        raise UsageError(f"--replicas must be at most 64 (got {args.replicas})")
    slots = args.ring_slots
    if slots < 8192 or slots & (slots - 1):
        raise UsageError(f"--ring-slots must be a power of two >= 8192 (got {slots})")
    if args.fault_timeout is None and not args.join:
        args.fault_timeout = 30.0              # with --join the member chooses (llft/cluster/member.py)
    for name in ("divergence_timeout", "end_grace", "backup_exit_timeout", "fault_timeout", "history_limit",
                 "stall_alarm"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.mode == "semi-passive":
        if args.checkpoint_every is None:
            raise UsageError("--mode semi-passive restores the primary from its checkpoints: give "
                             "--checkpoint-every too")
        if args.replicas < 2:
            raise UsageError("--mode semi-passive needs --replicas 2 or more (the primary and a passive backup)")
        if args.keep not in (None, 1):
            raise UsageError("--mode semi-passive keeps one replica executing: no --keep")
        if args.join:
            raise UsageError("--mode semi-passive runs on one host: not with --join")
        from llft.checkpoint.criu import problem
        why = problem()
        if why:
            raise UsageError(f"--mode semi-passive needs CRIU: {why}")
        args.keep = 1
    if args.keep is not None:
        if not 1 <= args.keep <= args.replicas:
            raise UsageError(f"--keep must be between 1 and --replicas ({args.replicas}), got {args.keep}")
        args.respawn = True
    if args.checkpoint_every is not None:
        if args.keep is None:
            raise UsageError("--checkpoint-every stores checkpoints for --keep's replacements: give --keep too")
        if args.checkpoint_every <= 0:
            raise UsageError("--checkpoint-every must be positive")
        if args.save_stream is not None:
            raise UsageError("--save-stream keeps the whole record stream; --checkpoint-every drops what precedes "
                             "each checkpoint: not both")
    if args.checkpoint_dir is not None:
        if args.keep is None and not args.join:
            raise UsageError("--checkpoint-dir is where --keep (or --join) writes checkpoints' images: give --keep "
                             "or --join too")
        if not args.checkpoint_dir.is_dir() or not os.access(args.checkpoint_dir, os.W_OK | os.X_OK):
            raise UsageError(f"--checkpoint-dir {args.checkpoint_dir}: not a directory llft-run can write in")
    if args.respawn and (args.replay_from is not None or args.join):
        raise UsageError(f"--{'keep' if args.keep else 'respawn'} replaces replicas of a group on this host: "
                         "not with --replay-from or --join")
    clash = [name for name, on in (("--join", args.join), ("--keep", args.keep is not None),
                                   ("--mode semi-passive", args.mode == "semi-passive"),
                                   ("--replay-from", args.replay_from is not None)) if on]
    if args.fork == "replicate" and clash:
        raise UsageError(f"--fork replicate does not go with {', '.join(clash)} yet")
    args.fork_chosen = args.fork is not None
    if args.fork is None:
        args.fork = "unrecorded" if clash else "replicate"
    if args.replay_from is not None and not args.replay_from.is_file():
        raise UsageError(f"--replay-from {args.replay_from}: no such file")
    args.port_map = {}
    for spec in args.port:
        prog, _, public = spec.rpartition(":")
        try:
            args.port_map[int(prog) if prog else 0] = int(public)
        except ValueError:
            raise UsageError(f"--port {spec}: expected PORT or PROG:PORT") from None
        if not 0 < int(public) < 65536:
            raise UsageError(f"--port {spec}: port out of range")
    program[0] = resolve_program(program[0])
    check_reachable(program[0])
    if not PRELOAD_LIBRARY.exists():
        raise UsageError(f"the preload library {PRELOAD_LIBRARY} is missing: reinstall llft")
    return args, program


def private_files(args) -> bool:
    """Whether replicas get private files: by default, where this machine allows it."""
    if args.shared_files:
        return False
    try:
        check_private_files()
    except PrivateFilesUnavailable as e:
        log.warning("the replicas share this machine's files (%s): a program that writes files may diverge; "
                    "--shared-files silences this", e)
        return False
    return True


def run_member(args, program: list[str], run_dir: Path) -> int:
    """llft-run --join: this host's member of a group across hosts."""
    opts = MemberOptions(group=args.group, key=args.key, interface=args.interface, group_port=args.group_port,
                         ring_slots=args.ring_slots, stall_timeout_ms=int(args.divergence_timeout * 1000),
                         end_grace_ms=int(args.end_grace * 1000), log_output=args.log_output,
                         # Liveness Heartbeats come every 5 ms: suspect a member only after a few are missing.
                         fault_timeout=args.fault_timeout and max(args.fault_timeout, MIN_FAULT_TIMEOUT_MS) / 1000,
                         fault_step=args.fault_timeout_step and args.fault_timeout_step / 1000,
                         rejoin=not args.no_rejoin, realtime=not args.no_realtime,
                         history_limit=int(args.history_limit * (1 << 20)), stall_alarm=args.stall_alarm,
                         private_files=private_files(args), serialize=args.serialize,
                         checkpoint_dir=args.checkpoint_dir and str(args.checkpoint_dir.resolve()))
    member = HostMember(program, run_dir, opts)

    def on_signal(sig):
        member.interrupted = sig
    try:
        status = run_until_signal(member.run, on_signal)
    except JoinRefused as e:
        return fail(PROG, f"could not join group {args.group}: {e}", 1)
    except (StreamError, OSError) as e:
        member.stop()
        return fail(PROG, str(e), 1)
    finally:
        member.cleanup()
    if member.failed:
        return fail(PROG, f"{member.failed}; this member was stopped", 1)
    if status == EXIT_DIVERGED:
        print(f"{PROG}: this replica did not stay consistent with the primary; see {run_dir}", file=sys.stderr)
    return status


@reader_may_stop
def main(argv=None) -> int:
    try:
        args, program = parse(sys.argv[1:] if argv is None else argv)
        group_name = args.group or Path(program[0]).name
        run_dir = rundir.prepare(args.run_dir or rundir.default_run_dir(group_name),
                                 0 if args.join else args.replicas)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    setup_logging(args.log_level, run_dir / "llft.log")
    become_subreaper()   # a daemon the program forks is ended with the group (llft/process_tree.py)
    why = races_by_design(program)
    if why and not args.serialize and not args.no_serialize:
        args.serialize = True
        log.warning("%s: running it with --serialize (--no-serialize runs its threads at once)", why)
    advice = known_race(program, serialize=args.serialize)
    if advice:
        log.warning("%s", advice)
    if args.join:
        return run_member(args, program, run_dir)

    options = GroupOptions(replicas=args.replicas, ring_slots=args.ring_slots,
                           stall_timeout_ms=int(args.divergence_timeout * 1000),
                           end_grace_ms=int(args.end_grace * 1000),
                           backup_exit_timeout=args.backup_exit_timeout,
                           save_stream=args.save_stream, replay_from=args.replay_from,
                           port_map=args.port_map, host=args.host, log_output=args.log_output,
                           fault_timeout=args.fault_timeout / 1000, respawn=args.respawn, keep=args.keep,
                           checkpoint_dir=args.checkpoint_dir and str(args.checkpoint_dir.resolve()),
                           checkpoint_every=args.checkpoint_every, semi_passive=args.mode == "semi-passive",
                           stall_alarm=args.stall_alarm, private_files=private_files(args),
                           serialize=args.serialize, order=args.order, replicate_forks=args.fork == "replicate",
                           mailbox_copies=args.mailbox_copies, mailbox_protocol=args.mailbox_protocol)
    group = LocalGroup(program, run_dir, options, group_name)

    def on_signal(sig, _frame):
        group.interrupted = sig
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    try:
        group.start()
        log.info("run dir %s", run_dir)
        status = group.wait()
        if group.failed:
            return fail(PROG, f"{group.failed}; the group was stopped", 1)
        for replica, problem in group.problems():
            print(f"{PROG}: replica {replica.index} ({replica.role}): {problem}", file=sys.stderr)
        if status == EXIT_DIVERGED:
            print(f"{PROG}: the replicas did not stay consistent; see {run_dir}", file=sys.stderr)
        elif 0 < status < 128 and not group.interrupted:
            said = group.primary_last_words()
            print(f"{PROG}: the program exited with status {status}" + (f"; it said: {said}" if said else ""),
                  file=sys.stderr)
        return status
    except (StreamError, OSError) as e:
        group.stop()
        return fail(PROG, str(e), 1)
    finally:
        group.cleanup()


if __name__ == "__main__":
    sys.exit(main())
