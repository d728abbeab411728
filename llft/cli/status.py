"""llft-status: show a replica group: members, roles, progress, divergence."""
from __future__ import annotations

import argparse
import json
import sys

from llft import rundir
from llft.cli.common import Parser, UsageError, fail
from llft.members import member_view

PROG = "llft-status"


def build_parser():
    p = Parser(prog=PROG, description="Show the members of a group started by llft-run: role, pid, "
               "whether it is alive, OrderInfo records written (primary) or replayed (backups), "
               "threads, divergence.  Finds the group through its run dir.")
    p.add_argument("--run-dir", metavar="DIR", help="the run dir (default: ./llft-runs/latest or the newest)")
    p.add_argument("--group", metavar="NAME", help="pick the newest run of this group")
    p.add_argument("--json", action="store_true", help="print JSON with a \"members\" list, for scripts")
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        where = rundir.find(args.run_dir, args.group)
        state = rundir.read_state(where)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    members = [member_view(m) for m in state.get("replicas", [])]
    report = {"group": state.get("group"), "run_dir": str(where), "phase": state.get("phase"),
              "controller_pid": state.get("controller_pid"), "argv": state.get("argv"), "members": members,
              "gateway": state.get("gateway")}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"group {report['group']}  ({report['phase']})  run dir {where}")
    print(f"{'replica':>7}  {'role':8} {'pid':>8}  {'state':8} {'records':>10} {'threads':>7}  problem")
    for m in members:
        print(f"{m['index']:>7}  {m['role']:8} {m['pid'] or '-':>8}  {m['state']:8} "
              f"{m['records'] if m['records'] is not None else '-':>10} "
              f"{m['threads'] if m['threads'] is not None else '-':>7}  {m['divergence'] or ''}")
    gw = report["gateway"]
    if gw:
        print(f"clients: {gw['connections']} connections, {gw['bytes_in']} bytes in, {gw['bytes_out']} bytes out, "
              f"{gw.get('failovers', 0)} failovers" + (f"; errors: {'; '.join(gw['errors'])}" if gw["errors"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
