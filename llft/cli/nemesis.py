"""llft-nemesis: inject faults at random into replicated servers and check
that no client noticed anything but a pause."""
from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

from llft.cli.common import Parser, UsageError, fail, reader_may_stop
from llft.nemesis.cluster import KINDS as CLUSTER_KINDS, ClusterRun
from llft.nemesis.faults import KINDS
from llft.nemesis.run import ShapeRun
from llft.nemesis.shapes import SHAPES

PROG = "llft-nemesis"

DESCRIPTION = f"""\
A soak of llft as its users rely on it: each server shape runs under
llft-run --respawn (three replicas by default) with clients whose every
answer is checked, and faults are injected at random, each after the
clients' k-th reply since the last: {", ".join(sorted(KINDS))}.
After each fault the group must recover (a primary serving, every replica
back and caught up).  At the end every acknowledged operation must have
been applied exactly once and in order, the group clock never gone back,
no client connection lost, and the surviving replicas must have sent the
same bytes.

The faults are drawn from --seed (printed); a shape's run dir is kept
when it fails, with the seed to run it again.  Exit status 0 when every
fault was survived with nothing lost, 1 otherwise.

Shapes: {", ".join(SHAPES)}."""


def build_parser():
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), metavar="A,B,...",
                   help="server shapes to run, in turn (default: all)")
    p.add_argument("--faults", type=int, default=70, metavar="N",
                   help="faults in all, shared among the shapes (default %(default)s)")
    p.add_argument("--seed", type=int, metavar="S", help="seed of the faults (default: random, printed)")
    p.add_argument("--replicas", type=int, default=3, metavar="N", help="replicas per group (default 3)")
    p.add_argument("--clients", type=int, default=4, metavar="N", help="clients per group (default 4)")
    p.add_argument("--progress", type=int, default=150, metavar="K",
                   help="replies the clients must have had since the last fault before the next (default 150)")
    p.add_argument("--pace", type=float, default=1.0, metavar="MS",
                   help="each client waits this long after each reply (default %(default)g): a replacement "
                        "replays its group's whole history, so unbounded load makes recoveries long")
    p.add_argument("--work-dir", type=Path, default=Path("llft-nemesis"), metavar="DIR",
                   help="run dirs and the fault log (nemesis.jsonl) go here (default ./llft-nemesis)")
    p.add_argument("--examples", type=Path, default=Path("examples/bin"), metavar="DIR",
                   help="where the example servers are built (default ./examples/bin)")
    p.add_argument("--keep", action="store_true", help="keep every shape's run dir, not only failed ones")
    p.add_argument("--clone", action="store_true",
                   help="replacements are CRIU clones of a live backup (llft-run --keep N, docs/checkpoints.md) "
                        "rather than replays of the group's history (--respawn); with --hosts, every member that "
                        "joins again is restored from a checkpoint of the primary (a --history-limit the group "
                        "passes at once)")
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                   help="with --clone: checkpoints stored every SECONDS too (llft-run --checkpoint-every), so "
                        "that a group with no backup left to clone (--replicas 2) is restored from the latest")
    p.add_argument("--fuzz", type=int, metavar="N",
                   help="instead of faults: N bad datagrams (garbage, truncated, mutated, forged with a wrong key, "
                        "the group's own replayed) against a live group across hosts (root) while checked clients "
                        "go on; every member and the gateway must survive, the view stay, nothing be accepted")
    p.add_argument("--fuzz-rate", type=float, default=15000.0, metavar="PER_S",
                   help="bad datagrams a second (default %(default)g)")
    p.add_argument("--hosts", action="store_true",
                   help="run each group across hosts: three members (llft-run --join) and a gateway, each in a "
                        "network namespace of its own on one bridge (root); the faults are then those of hosts: "
                        f"{', '.join(sorted(CLUSTER_KINDS))}")
    return p


@reader_may_stop
def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        names = [s.strip() for s in args.shapes.split(",") if s.strip()]
        unknown = [n for n in names if n not in SHAPES]
        if unknown:
            raise UsageError(f"unknown shape {', '.join(unknown)}; known: {', '.join(SHAPES)}")
        if args.faults < 0 or args.replicas < 2 or args.clients < 1 or args.progress < 1 or args.pace < 0:
            raise UsageError("--faults and --pace must be >= 0, --replicas >= 2, --clients and --progress >= 1")
    except UsageError as e:
        return fail(PROG, str(e))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    # SIGTERM unwinds as Ctrl-C does: each group's llft-run runs in a session
    # of its own, and only the unwinding stops it.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    if args.fuzz is not None:
        return fuzz_main(args, seed)
    shapes = []
    for name in names:
        why = SHAPES[name].missing(args.examples)
        if why:
            print(f"{PROG}: skipping {name}: {why}", file=sys.stderr)
        else:
            shapes.append(SHAPES[name])
    if not shapes:
        return fail(PROG, "no shape can run here", 1)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.work_dir / "nemesis.jsonl"
    print(f"{PROG}: seed {seed}, {args.faults} faults over {', '.join(s.name for s in shapes)}; "
          f"fault log {log_path}", flush=True)
    results = []
    with open(log_path, "a") as log_file:
        def log(record):
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            print(f"  {record['shape']:>15} fault {record['fault']:>3}: {record['kind']:<18} "
                  f"recovered in {record['recovered_ms']:7.1f} ms  ({record['what']})", flush=True)
        for i, shape in enumerate(shapes):
            share = args.faults // len(shapes) + (1 if i < args.faults % len(shapes) else 0)
            shape_seed = random.Random(f"{seed}:{shape.name}").randrange(1 << 31)
            started = time.monotonic()
            if args.hosts:
                run = ClusterRun(shape, shape_seed, share, args.work_dir, args.examples, clients=args.clients,
                                 progress=args.progress, pace_ms=args.pace, keep=args.keep, clone=args.clone, log=log)
            else:
                run = ShapeRun(shape, shape_seed, share, args.work_dir, args.examples, replicas=args.replicas,
                               clients=args.clients, progress=args.progress, pace_ms=args.pace, keep=args.keep,
                               clone=args.clone, checkpoint_every=args.checkpoint_every, log=log)
            r = run.run()
            results.append(r)
            summary = {"shape": r.shape, "seed": r.seed, "summary": True, "injected": r.injected,
                       "survived": r.survived, "acknowledged": r.verdict.acknowledged, "lost": r.verdict.lost,
                       "duplicated": r.verdict.duplicated, "clock_back": r.verdict.clock_back,
                       "disconnected": r.verdict.disconnected, "group_lost": r.group_lost,
                       "problems": r.verdict.problems + r.problems, "secs": round(time.monotonic() - started, 1)}
            log_file.write(json.dumps(summary) + "\n")
            log_file.flush()
            print(f"{PROG}: {r.shape}: {r.survived} of {r.injected} faults survived, {r.verdict.acknowledged} "
                  f"operations acknowledged, {r.verdict.lost} lost, {r.verdict.duplicated} duplicated"
                  + ("" if r.ok else f"; FAILED ({r.group_lost or '; '.join(summary['problems'][:3])}), run "
                     f"dir {r.run_dir} kept; again with --shapes {r.shape} --seed {seed}"), flush=True)
    injected = sum(r.injected for r in results)
    survived = sum(r.survived for r in results)
    lost = sum(r.verdict.lost for r in results)
    duplicated = sum(r.verdict.duplicated for r in results)
    groups_lost = sum(1 for r in results if r.group_lost)
    print(f"{PROG}: seed {seed}: {injected} faults injected, {survived} survived; {sum(r.verdict.acknowledged for r in results)} "
          f"operations acknowledged, {lost} lost, {duplicated} duplicated; {groups_lost} groups lost")
    return 0 if all(r.ok for r in results) else 1


def fuzz_main(args, seed: int) -> int:
    from llft.nemesis import fuzz_run
    print(f"{PROG}: seed {seed}, {args.fuzz} bad datagrams at {args.fuzz_rate:g}/s against a group across hosts",
          flush=True)
    started = time.monotonic()
    r = fuzz_run.run(args.fuzz, seed, args.work_dir, args.examples, rate=args.fuzz_rate, clients=args.clients,
                     keep=args.keep)
    sent = sum(r.sent.values())
    record = {"fuzz": True, "seed": seed, "sent": r.sent, "counted": r.counted, "kernel_drops": r.kernel_drops,
              "uncounted": r.uncounted,
              "crashed": r.crashed, "view_changed": r.view_changed, "stolen": r.stolen,
              "acknowledged": r.verdict.acknowledged, "problems": r.verdict.problems, "group_lost": r.group_lost,
              "secs": round(time.monotonic() - started, 1)}
    args.work_dir.mkdir(parents=True, exist_ok=True)
    with open(args.work_dir / "nemesis.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"{PROG}: sent {sent:,} ({', '.join(f'{k} {v:,}' for k, v in sorted(r.sent.items()))}); counted as dropped "
          f"{sum(r.counted.values()):,} ({', '.join(f'{k} {v:,}' for k, v in sorted(r.counted.items()))}); dropped "
          f"unread by the kernels {r.kernel_drops:,}; bad ones neither: {r.uncounted:,}")
    print(f"{PROG}: {len(r.crashed)} crashed, view {'changed: ' + r.view_changed if r.view_changed else 'unchanged'}, "
          f"forged write {'APPLIED' if r.stolen else 'never applied'}, {r.verdict.acknowledged:,} client operations "
          f"acknowledged, {r.verdict.lost} lost, {r.verdict.duplicated} duplicated"
          + ("" if r.ok else f"; FAILED ({r.group_lost or '; '.join(r.crashed + r.verdict.problems[:3])}), run dir "
             f"{r.run_dir} kept"))
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main())
