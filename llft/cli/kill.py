"""llft-kill: break a replica group on purpose (fault injection)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from llft import rundir
from llft.cli.common import Parser, UsageError, fail, reader_may_stop
from llft.cluster import netfaults
from llft.members import live, owns
from llft.ordering.mailbox import server as mailbox_server

PROG = "llft-kill"
FAILOVER_WAIT_S = 5.0    # --primary while the group fails over: how long its new primary may take
FAILOVER_POLL_S = 0.02

DESCRIPTION = """\
Inject a fault into a group started by llft-run: send a signal to the
primary, a backup, or any replica (by default SIGKILL, a crash fault; STOP
freezes it, a timing fault; CONT wakes it).  Prints what it did.

Network faults act on groups whose members run on several hosts
(llft-run --join in each network namespace): --partition '0 / 1,2' makes
the replicas on each side deaf to the other side's group traffic, --loss
20% drops that share of the group traffic a member receives (all members,
or --replica K), --heal removes every such fault.  They are nftables
rules in each member's namespace; root is needed.  Give every member's
run dir with --run-dir (repeatable), or run where ./llft-runs holds them.

A group run with --order mailbox keeps its mailbox in several copies,
each a shared-memory segment of its own: --mailbox-copy I makes copy I
fail for good (every later access to it fails, as a failed memory
module's), and the group goes on through the others.  Each process the
program forks has a mailbox of its own, whose copy I is in the same
module: it fails too, now or when the mailbox is made.""" 


def build_parser():
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--primary", action="store_true",
                   help="the current primary (while the group fails over: the new one, once it has taken over)")
    p.add_argument("--backup", type=int, metavar="K", help="backup replica K")
    p.add_argument("--replica", type=int, metavar="K", help="replica K, whatever its role (with --loss: only "
                   "the traffic replica K's host receives)")
    p.add_argument("--partition", metavar="A/B", help="partition the group's hosts, e.g. '0 / 1,2' (replica indices)")
    p.add_argument("--loss", metavar="PCT", help="random loss of group traffic, e.g. 20%%")
    p.add_argument("--heal", action="store_true", help="undo every partition and loss")
    p.add_argument("--mailbox-copy", type=int, metavar="I",
                   help="with --order mailbox: fail copy I of the group's mailbox (0, 1, ...)")
    p.add_argument("--signal", default="KILL", metavar="SIG", help="signal name or number (default KILL)")
    p.add_argument("--run-dir", metavar="DIR", action="append",
                   help="the run dir (default: ./llft-runs/latest or the newest); repeat it for each member "
                        "of a group across hosts")
    p.add_argument("--group", metavar="NAME", help="pick the newest run of this group")
    return p


def parse_signal(name: str) -> signal.Signals:
    text = name.upper().removeprefix("SIG")
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals["SIG" + text]
    except (KeyError, ValueError):
        raise UsageError(f"unknown signal {name!r}") from None


def pick(members: list[dict], args) -> dict:
    if args.primary:
        chosen = [m for m in members if m.get("role") == "primary" and live(m.get("pid"), m.get("started"))]
        what = "running primary"
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


def pick_waiting(states: list[dict], args) -> dict:
    """pick(); with --primary while the group fails over (the state names
    a primary that has died, and a backup takes over), the new primary,
    once the state names it (FAILOVER_WAIT_S at most)."""
    end = time.monotonic() + FAILOVER_WAIT_S
    while True:
        members = [dict(r, _state=st) for st in states for r in st.get("replicas", [])]
        try:
            return pick(members, args)
        except UsageError:
            failing_over = args.primary and any(st.get("phase") == "running" for st in states) and any(
                m.get("role") == "primary" for m in members)
            if not failing_over or time.monotonic() > end:
                raise
        time.sleep(FAILOVER_POLL_S)
        states = group_states(args)


def group_states(args) -> list[dict]:
    """The state of every run dir meant: those given, else the newest run and,
    for a group across hosts, its sibling members' runs."""
    if args.run_dir:
        return [rundir.read_state(rundir.find(d, args.group)) for d in args.run_dir]
    where = rundir.find(None, args.group)
    state = rundir.read_state(where)
    if "member" not in state:
        return [state]
    siblings = [d for d in where.parent.glob("*") if (d / rundir.STATE_FILE).exists() and not d.is_symlink()]
    states = [rundir.read_state(d) for d in siblings]
    return [s for s in states if "member" in s and s.get("group") == state.get("group")
            and s.get("phase") == "running"]


def network_fault(states: list[dict], args) -> str:
    hosts = {}
    for st in states:
        for r in st.get("replicas", []):
            if "member" in st and st.get("phase") == "running":
                hosts[r["index"]] = st
    if not hosts:
        raise UsageError("network faults need a group across hosts (llft-run --join in each network namespace); "
                         "pass each member's --run-dir")
    if os.geteuid() != 0:
        raise UsageError("network faults need root (nftables rules in each member's namespace)")
    netfaults.check_tools()
    if args.heal:
        for st in hosts.values():
            netfaults.heal(st["controller_pid"])
        return f"healed: removed partitions and loss at replicas {sorted(hosts)}"
    if args.loss:
        text = args.loss.rstrip("%")
        if not text.isdigit() or not 0 < int(text) <= 100:
            raise UsageError(f"--loss {args.loss}: expected a percentage, e.g. 20%")
        targets = [args.replica] if args.replica is not None else sorted(hosts)
        for k in targets:
            if k not in hosts:
                raise UsageError(f"no running member has replica {k}; replicas: {sorted(hosts)}")
            netfaults.lose(hosts[k]["controller_pid"], hosts[k].get("group_port", 17400), int(text))
        return f"{text}% of the group traffic is now lost at replicas {targets}"
    sides = []
    for part in args.partition.split("/"):
        try:
            sides.append(sorted({int(x) for x in part.replace(" ", "").split(",") if x}))
        except ValueError:
            raise UsageError(f"--partition {args.partition!r}: expected e.g. '0 / 1,2'") from None
    if len(sides) != 2 or not sides[0] or not sides[1] or set(sides[0]) & set(sides[1]):
        raise UsageError(f"--partition {args.partition!r}: expected two disjoint sides, e.g. '0 / 1,2'")
    for k in sides[0] + sides[1]:
        if k not in hosts:
            raise UsageError(f"no running member has replica {k}; replicas: {sorted(hosts)}")
    for mine, other in ((sides[0], sides[1]), (sides[1], sides[0])):
        far = sorted({a for k in other for a in hosts[k].get("addresses", [])})
        for k in mine:
            netfaults.partition(hosts[k]["controller_pid"], hosts[k].get("group_port", 17400), far)
    return f"partitioned replicas {sides[0]} from {sides[1]}"


@reader_may_stop
def fail_mailbox_copy(state: dict, index: int) -> str:
    order = state.get("order") or {}
    if order.get("backend") != "mailbox" or state.get("phase") != "running":
        raise UsageError(f"group {state.get('group')} is not running over --order mailbox")
    if not 0 <= index < order["copies"]:
        raise UsageError(f"--mailbox-copy {index}: the mailbox has copies 0 to {order['copies'] - 1}")
    failed = mailbox_server.fail_copy(order["name"], index, order["directory"])
    forked = f" (and of its {failed - 1} forked processes' mailboxes)" if failed > 1 else ""
    return f"copy {index} of group {state.get('group')}'s mailbox has failed{forked}"


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        actions = [bool(args.primary), args.backup is not None, bool(args.partition), bool(args.loss), args.heal,
                   args.mailbox_copy is not None]
        if args.replica is not None and not args.loss:
            actions.append(True)
        if sum(actions) != 1:
            raise UsageError("say what to break: one of --primary, --backup K, --replica K, --partition A/B, "
                             "--loss PCT [--replica K], --heal, --mailbox-copy I")
        states = group_states(args)
        if args.mailbox_copy is not None:
            print(f"{PROG}: {fail_mailbox_copy(states[0], args.mailbox_copy)}")
            return 0
        if args.partition or args.loss or args.heal:
            print(f"{PROG}: {network_fault(states, args)}")
            return 0
        sig = parse_signal(args.signal)
        member = pick_waiting(states, args)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    except netfaults.NetFaultError as e:
        return fail(PROG, str(e), 1)
    pid = member.get("pid")
    if not owns(pid, member.get("started")):
        return fail(PROG, f"replica {member['index']} ({member['role']}) is not running (pid {pid})", 1)
    targets = [pid]
    controller = member["_state"].get("controller_pid")
    if "member" in member["_state"] and sig in (signal.SIGSTOP, signal.SIGCONT) and controller:
        # Across hosts a replica is its program and its member controller: a
        # timing fault freezes (and wakes) both, as a stalled host would.
        targets.insert(0, controller)
    for target in targets:
        os.kill(target, sig)
    print(f"{PROG}: sent {sig.name} to replica {member['index']} ({member['role']}, "
          f"pid{'s' if len(targets) > 1 else ''} {', '.join(map(str, targets))}) of group {states[0].get('group')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
