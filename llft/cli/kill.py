"""llft-kill: break a replica group on purpose (fault injection)."""
from __future__ import annotations

import argparse
import os
import signal
import sys

from llft import rundir
from llft.cli.common import Parser, UsageError, fail
from llft.members import owns

PROG = "llft-kill"

DESCRIPTION = """\
Inject a fault into a group started by llft-run: send a signal to the
primary, a backup, or any replica (by default SIGKILL, a crash fault; STOP
freezes it, a timing fault; CONT wakes it).  Prints what it did.

Network faults (--partition, --loss, --heal) act on replicas placed on
network-namespace hosts; they come with the membership protocol and are
refused for now."""


def build_parser():
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--primary", action="store_true", help="the current primary")
    target.add_argument("--backup", type=int, metavar="K", help="backup replica K")
    target.add_argument("--replica", type=int, metavar="K", help="replica K, whatever its role")
    target.add_argument("--partition", metavar="A/B", help="partition the group, e.g. '0 / 1,2' (not yet)")
    target.add_argument("--loss", metavar="PCT", help="random message loss, e.g. 20%% (not yet)")
    target.add_argument("--heal", action="store_true", help="undo partitions and loss (not yet)")
    p.add_argument("--signal", default="KILL", metavar="SIG", help="signal name or number (default KILL)")
    p.add_argument("--run-dir", metavar="DIR", help="the run dir (default: ./llft-runs/latest or the newest)")
    p.add_argument("--group", metavar="NAME", help="pick the newest run of this group")
    return p


def parse_signal(name: str) -> signal.Signals:
    text = name.upper().removeprefix("SIG")
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals["SIG" + text]
    except (KeyError, ValueError):
        raise UsageError(f"unknown signal {name!r}") from None


def pick(state: dict, args) -> dict:
    members = state.get("replicas", [])
    if args.primary:
        chosen = [m for m in members if m.get("role") == "primary"]
        what = "a primary"
    elif args.backup is not None:
        chosen = [m for m in members if m.get("index") == args.backup and m.get("role") == "backup"]
        what = f"backup {args.backup}"
    else:
        chosen = [m for m in members if m.get("index") == args.replica]
        what = f"replica {args.replica}"
    if not chosen:
        known = ", ".join(f"{m['index']} ({m['role']})" for m in members) or "none"
        raise UsageError(f"the group has no {what}; its replicas: {known}")
    return chosen[0]


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.partition or args.loss or args.heal:
            raise UsageError("network faults (--partition, --loss, --heal) are not available yet")
        sig = parse_signal(args.signal)
        where = rundir.find(args.run_dir, args.group)
        member = pick(rundir.read_state(where), args)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    pid = member.get("pid")
    if not owns(pid, member.get("started")):
        return fail(PROG, f"replica {member['index']} ({member['role']}) is not running (pid {pid})", 1)
    os.kill(pid, sig)
    print(f"{PROG}: sent {sig.name} to replica {member['index']} ({member['role']}, pid {pid}) of group "
          f"{rundir.read_state(where).get('group')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
