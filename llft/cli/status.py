"""llft-status: show a replica group: members, roles, progress, divergence."""
from __future__ import annotations

import json
import sys
import time

from llft import rundir
from llft.cli.common import Parser, UsageError, fail, reader_may_stop
from llft.members import member_view, output_differs, output_digest

PROG = "llft-status"


def build_parser():
    p = Parser(prog=PROG, description="Show the members of a group started by llft-run: role, pid, "
               "view number, precedence and rank, whether it is alive, OrderInfo records written (primary) or replayed (backups), "
               "threads, divergence.  Finds the group through its run dir.")
    p.add_argument("--run-dir", metavar="DIR", help="the run dir (default: ./llft-runs/latest or the newest)")
    p.add_argument("--group", metavar="NAME", help="pick the newest run of this group")
    p.add_argument("--json", action="store_true", help="print JSON with a \"members\" list, for scripts")
    return p


@reader_may_stop
def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        where = rundir.find(args.run_dir, args.group)
        state = rundir.read_state(where)
    except (UsageError, rundir.RunDirError) as e:
        return fail(PROG, str(e))
    replicas = [member_view(m) for m in state.get("replicas", [])]
    add_output_views(replicas)
    report = {"group": state.get("group"), "run_dir": str(where), "phase": state.get("phase"),
              "controller_pid": state.get("controller_pid"), "argv": state.get("argv"), "members": replicas,
              "gateway": state.get("gateway"), "view": state.get("view"), "outgoing": state.get("outgoing"),
              "order": state.get("order") or {"backend": "llft"}, "stored_checkpoint": state.get("stored_checkpoint"),
              "history": state.get("history"), "forked": state.get("forked")}
    messaging = state.get("messaging")
    if messaging is not None:   # a member or gateway of a group across hosts
        report.update(member=state.get("member"), replicas=replicas,
                      members=state.get("members", []), messaging=messaging,
                      drops=messaging.get("drops", {}), generated=state.get("generated", {}),
                      history=state.get("history"), last_checkpoint=state.get("last_checkpoint"))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"group {report['group']}  ({report['phase']})  run dir {where}"
          + (f"  (--keep {state['keep']})" if state.get("keep") else "  (--respawn)" if state.get("respawn") else ""))
    if messaging is not None:
        print_cluster(report)
    elif report["view"]:
        print(f"view {report['view']['pvn']}  primary {report['view']['primary']}  "
              f"order {order_text(report['order'])}")
    forked = report.get("forked")
    if forked and forked.get("streams"):
        # (each has its own record stream and, over --order mailbox, its own mailbox)
        print(f"forked processes replicated: {forked['streams']}"
              + (f"  ({forked['drops']} streams refused)" if forked.get("drops") else ""))
    if replicas:
        print(f"{'replica':>7}  {'role':8} {'prec':>4} {'rank':>4} {'pid':>8}  {'state':8} {'records':>10} "
              f"{'threads':>7}  {'sent (bytes, digest)':>26}  problem")
    for m in replicas:
        sent = m.get("sent")
        sent_text = f"{sent['bytes']} {sent['digest']}" if sent else "-"
        print(f"{m['index']:>7}  {m['role']:8} {dash(m.get('precedence')):>4} {dash(m.get('rank')):>4} "
              f"{m['pid'] or '-':>8}  {m['state']:8} "
              f"{m['records'] if m['records'] is not None else '-':>10} "
              f"{m['threads'] if m['threads'] is not None else '-':>7}  "
              f"{sent_text:>26}  "
              f"{m['divergence'] or follow_problem(m) or output_problem(m) or rejoin_note(m)}")
    print_files(replicas)
    last = report.get("last_checkpoint")
    if last and last.get("restored"):
        print(f"this replica: restored from the {last.get('source', 'primary')}'s checkpoint at "
              f"{time.strftime('%H:%M:%S', time.localtime(last['at']))}, image {last['image_bytes'] // 1024} KiB, "
              f"restored in {last['restore_ms']:.0f} ms")
    elif last:
        paused = "the primary" if last.get("source", "primary") == "primary" else "this backup (the primary not paused)"
        print(f"last checkpoint: of this replica for newcomer {last['newcomer']} at "
              f"{time.strftime('%H:%M:%S', time.localtime(last['at']))}, image {last['image_bytes'] // 1024} KiB, "
              f"{paused} frozen {last['frozen_ms']:.1f} ms ({last['took_ms']:.0f} ms in all)")
    stored = report.get("stored_checkpoint")
    if stored:
        print(f"stored checkpoint {stored['number']}: of replica {stored['source']} at "
              f"{time.strftime('%H:%M:%S', time.localtime(stored['at']))}, image {stored['image_bytes'] // 1024} KiB, "
              f"the source frozen {stored['frozen_ms']:.1f} ms; history since: "
              f"{(report.get('history') or {}).get('bytes', 0) // 1024} KiB")
    gw = report["gateway"]
    if gw:
        print(f"clients: {gw['connections']} connections, {gw['bytes_in']} bytes in, {gw['bytes_out']} bytes out, "
              f"{gw.get('failovers', 0)} failovers" + (f"; errors: {'; '.join(gw['errors'])}" if gw["errors"] else ""))
        udp = gw.get("udp") or {}
        if udp.get("datagrams_in") or udp.get("datagrams_out"):
            print(f"UDP: {udp['datagrams_in']} datagrams in, {udp['datagrams_out']} out, "
                  f"{udp.get('dropped', 0)} dropped")
        for notice in gw.get("notices") or []:
            print(f"notice: {notice}")
    out = report["outgoing"]
    if out and (out["connections"] or out["failed"] or out["dropped"]):
        print(f"outgoing: {out['connections']} connections ({out['failed']} connects failed), "
              f"{out['bytes_in']} bytes in, {out['bytes_out']} bytes out"
              + (f"; {out['dropped']} dropped: {'; '.join(out['errors'][-3:])}" if out["dropped"] else ""))
    return 0


def order_text(order: dict) -> str:
    """The ordering backend and its own counters."""
    if order.get("backend") != "mailbox":
        return order.get("backend", "llft")
    return (f"mailbox (protocol {order['protocol']}, {order['copies'] - order['copies_failed']} of "
            f"{order['copies']} copies intact; {order['messages']} messages carrying {order['chunks']} "
            f"chunks, {order['resent']} sent again, {order['full']} waits for room)")


def print_files(replicas: list[dict]):
    """Where each replica's writes went (llft/private_files.py)."""
    private = [m for m in replicas if m.get("files")]
    if private:
        print("files: each replica writes into its own overlay, above the machine's unchanged files:")
        for m in private:
            print(f"  replica {m['index']}: {m['files']}/<mount>/upper")
    elif replicas:
        print("files: the replicas share this machine's files (--shared-files, or llft-run without root)")


def add_output_views(replicas: list[dict]):
    """Each replica's output summed up ("sent"), and the connections on
    which it sent other bytes than the primary ("output_differs")."""
    primary = next((m for m in replicas if m.get("role") == "primary"), None)
    for m in replicas:
        outputs = m.get("outputs")
        if outputs:
            m["sent"] = output_digest(outputs)
            if primary is not None and m is not primary and primary.get("outputs"):
                m["output_differs"] = output_differs(primary["outputs"], outputs)


def follow_problem(m: dict) -> str:
    """A backup that has stopped replaying while records wait for it."""
    f = m.get("follow") or {}
    if not f.get("stalled"):
        return ""
    return (f"STALLED: no record replayed for {f['still_s']:.0f} s, {f['behind']} waiting; "
            "the group cannot fail over to it")


def output_problem(m: dict) -> str:
    differs = m.get("output_differs")
    return f"sent other bytes than the primary on connections {', '.join(differs[:5])}" if differs else ""


def dash(value) -> str:
    return "-" if value is None else str(value)


def rejoin_note(m: dict) -> str:
    """What llft-run --respawn or --keep did: this replica replaces a failed
    one, replaying the history or cloned from a live backup."""
    if m.get("replaces") is None:
        return ""
    ck = m.get("checkpoint")
    if ck and ck.get("stored"):
        c = m.get("catch_up") or {}
        return (f"replaces replica {m['replaces']}; restored from the checkpoint of replica {ck['source']} taken "
                f"at {time.strftime('%H:%M:%S', time.localtime(ck['at']))}, "
                + (f"caught up after {c['records']} records in {c['ms']:.0f} ms" if c.get("done") else "catching up"))
    if ck:
        when = time.strftime(" at %H:%M:%S", time.localtime(ck["at"])) if ck.get("at") else ""
        return (f"replaces replica {m['replaces']}; cloned from replica {ck['source']}{when}: the source was frozen "
                f"{ck['frozen_ms']:.1f} ms, image {ck['image_bytes'] // 1024} KiB, restored in "
                f"{ck['restore_ms']:.0f} ms")
    c = m.get("catch_up") or {}
    done = f"caught up after {c['records']} records in {c['ms']:.0f} ms" if c.get("done") else "catching up"
    return f"replaces replica {m['replaces']}; {done}"


def print_cluster(report: dict):
    """Group-wide view of a member (or a gateway) of a group across hosts."""
    view = report.get("view")
    if view:
        print(f"view {view['pvn']}  primary {view['primary']}  this member {report['member']}")
        print(f"{'member':>11}  {'role':8} {'precedence':>10} {'rank':>4}")
        for m in report["members"]:
            here = "  (this host)" if m.get("here") else ""
            print(f"{m['member']:>11}  {m['role']:8} {m['precedence']:>10} {m['rank']:>4}{here}")
    c = report["messaging"].get("counters", {})
    drops = report["drops"]
    print(f"messages: {c.get('app_sent', 0)} sent, {c.get('delivered', 0)} delivered, "
          f"{report['messaging'].get('connections', 0)} connections; dropped: {sum(drops.values())}"
          + (f" ({', '.join(f'{k} {v}' for k, v in sorted(drops.items()))})" if drops else ""))
    h = report.get("history")
    if h:
        print(f"history for newcomers: {h['bytes'] / (1 << 20):.1f} of {h['limit'] >> 20} MiB"
              + ("" if h["complete"] else "  (passed the limit: no new member can join)"))


if __name__ == "__main__":
    sys.exit(main())
