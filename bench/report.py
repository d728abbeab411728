"""The report's Markdown: report.md in the output directory, and the same
tables and plots between the markers of a README (--readme), each table
naming the host, commit and run it came from."""
from __future__ import annotations

import os
import re
from pathlib import Path

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

FIGURE = {"serving/latency": "LLFT Fig. 12", "serving/throughput": "LLFT Fig. 13", "serving/replicas": "LLFT Fig. 14",
          "serving/nondet": "LLFT Fig. 15", "failover/view_change": "LLFT Fig. 16",
          "failover/recovery": "LLFT Fig. 17"}
# Failover figures shown in the Markdown (every one is in events.csv).
EVENT_METRICS = ["detection_ms", "view_change_ms", "recovery_ms", "crash_to_reply_ms", "stall_ms", "max_gap_ms",
                 "steady_gap_us", "server_kib", "controller_kib", "primary_kib", "backup_kib", "held_connections",
                 "join_ms", "primary_held_ms", "census_ms", "source_frozen_ms", "dump_ms", "restore_ms", "image_mib",
                 "backup_rss_mib", "primary_worst_rtt_before_ms", "primary_worst_rtt_during_ms"]


def num(v, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, int) or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(v) -> str:
    return "–" if v is None else f"{v:.3f}" if v < 1 else f"{v:.2f}"


def table(header: list[str], body: list[list[str]], right_from: int = 0) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return "\n".join("| " + " | ".join(r) + " |" for r in [header, align, *body])


BACKENDS = ("plain", "llft", "llft-serialize", "ceiling")


def in_order(r: dict) -> tuple:
    """A table's row order: by configuration, the baseline first within one."""
    return tuple((v is None, v if v is not None else 0) for v in
                 (r.get("variant") or "", r.get("size"), r.get("clients"), r.get("nondet"))) + (
        BACKENDS.index(r["backend"]) if r["backend"] in BACKENDS else len(BACKENDS), r["backend"],
        r.get("replicas") or 0)


def sections(rows: list[dict]) -> dict[tuple, list[dict]]:
    """{(scenario, net, run): rows}, each in in_order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["scenario"], r["net"], r["run"]), []).append(r)
    return {k: sorted(v, key=in_order) for k, v in out.items()}


def varying(rows: list[dict], keys: list[str]) -> list[str]:
    """The keys whose value differs between rows (the table's first columns)."""
    return [k for k in keys if len({r.get(k) for r in rows}) > 1]


def title(scenario: str, net: str, rows: list[dict]) -> str:
    fig = FIGURE.get(scenario)
    r = rows[0]
    return (f"**{scenario}** ({net}{', ' + fig if fig else ''}): {r['host']}, commit {r['commit']}, "
            f"run {r['run']}")


def latency_md(rows: list[dict]) -> str:
    keys = varying(rows, ["variant", "size", "clients", "nondet", "replicas"]) + ["backend"]
    body = [[str(r.get(k)) for k in keys] + [f"{r['count']:,}", num(r["mean_us"]), num(r["p50_us"]),
                                              num(r["p90_us"]), num(r["p99_us"]), num(r["p999_us"]),
                                              num(r["added_p50_us"]) if r["backend"] != "plain" else "",
                                              ratio(r["ratio_p50"]) if r["backend"] != "plain" else "",
                                              ratio(r["ratio_p99"]) if r["backend"] != "plain" else ""]
            for r in rows]
    return table(keys + ["n", "mean µs", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "added p50 µs", "× p50",
                         "× p99"], body, len(keys))


def throughput_md(rows: list[dict]) -> str:
    keys = varying(rows, ["size", "clients", "replicas"]) + ["backend"]
    body = [[str(r.get(k)) for k in keys] + [num(r["rps"]), f"{r['windows']}", num(r["rps_min"]), num(r["rps_max"]),
                                              ratio(r["ratio_rps"]) if r["backend"] != "plain" else "",
                                              ratio(r["ratio_ceiling"]) if r.get("ceiling_rps") and
                                              r["backend"] != "ceiling" else ""]
            for r in rows]
    return table(keys + ["requests/s", "windows", "min /s", "max /s", "× plain", "× ceiling"], body, len(keys))


def events_md(rows: list[dict]) -> str:
    metrics = [m for m in EVENT_METRICS if any(r["metric"] == m for r in rows)]
    keys = ["variant", "replicas", "clients"] + varying(rows, ["backend"])
    configs: dict[tuple, dict] = {}
    for r in rows:
        configs.setdefault(tuple(r[k] for k in keys), {})[r["metric"]] = r
    body = []
    for cfg in sorted(configs, key=lambda c: (str(c[0]), c[1] or 0, c[2] or 0, *map(str, c[3:]))):
        got = configs[cfg]
        n = max(r["count"] for r in got.values())
        failed = max(r["failed"] for r in got.values())
        body.append([str(v) for v in cfg] + [f"{n}" + (f" ({failed} failed)" if failed else "")]
                    + [f"{num(got[m]['p50'], 2)} / {num(got[m]['p99'], 2)} / {num(got[m]['max'], 2)}"
                       if m in got else "–" for m in metrics])
    return table(keys + ["trials"] + [f"{m} p50 / p99 / max" for m in metrics], body, len(keys))


def determinizer_md(rows: list[dict]) -> str:
    def p50(call, backend, variant, metric="ns_per_op"):
        return next((r["p50"] for r in rows if r["scenario"] == f"determinizer/{call}" and r["backend"] == backend
                     and r["variant"] == variant and r["metric"] == metric), None)
    calls = sorted({r["scenario"].split("/", 1)[1] for r in rows if r["metric"] == "ns_per_op"})
    body = []
    for c in calls:
        plain, prim, back = p50(c, "plain", None), p50(c, "llft", "primary"), p50(c, "llft", "backup")
        sprim, sback = p50(c, "llft-serialize", "primary"), p50(c, "llft-serialize", "backup")
        body.append([f"`{c}`", num(plain, 1), num(prim, 1), num(prim - plain if None not in (prim, plain) else None),
                     num(back, 1), ratio(back / plain if back and plain else None), num(sprim, 1), num(sback, 1),
                     ratio(sprim / prim if sprim and prim else None)])
    plain, prim, back, sprim, sback = (p50("total", b, v, "elapsed_ms") for b, v in (
        ("plain", None), ("llft", "primary"), ("llft", "backup"), ("llft-serialize", "primary"),
        ("llft-serialize", "backup")))
    if prim:
        body.append(["whole run (ms)", num(plain), num(prim), "", num(back),
                     f"backup/primary **{ratio(back / prim if back else None)}**", num(sprim), num(sback),
                     ratio(sprim / prim if sprim else None)])
    n = max(r["count"] for r in rows)
    return (f"Medians of {n} rounds, ns per call (`plain` no llft, `primary` recording, `backup` replaying; "
            f"`serialized` the same with `--serialize`):\n\n"
            + table(["call", "plain", "primary", "added", "backup", "backup/plain", "serialized primary",
                     "serialized backup", "serialized/primary"], body, 1))


def targets(tables: dict) -> list[list[str]]:
    """The project's targets (issues #2, #4, #5), checked against the newest rows that measure them."""
    def newest(rows):
        order = [r["run"] for r in tables["runs"]]
        return [r for r in rows if r["run"] == max((x["run"] for x in rows), key=order.index)] if rows else []
    out = []

    def check(what, value, target, ok):
        out.append([what, value, target, "**met**" if ok else "not met"])
    ev, lat, thr = tables["events"], tables["latency"], tables["throughput"]
    det = newest([r for r in ev if r["scenario"].startswith("determinizer/") and r["backend"] in ("plain", "llft")])
    added = [r["added_p50"] for r in det if r["variant"] == "primary" and r["metric"] == "ns_per_op"
             and r["added_p50"] is not None]
    if added:
        check("determinizer: most added per recorded call at the primary", f"{max(added):.1f} ns", "≤ 100 ns",
              max(added) <= 100)
    total = {r["variant"]: r["p50"] for r in det if r["metric"] == "elapsed_ms"}
    if total.get("primary") and total.get("backup"):
        v = total["backup"] / total["primary"]
        check("determinizer: backup replaying a run / the primary's time", f"{v:.2f}×", "≤ 1.5×", v <= 1.5)
    for net in ("loopback", "netns"):
        one = newest([r for r in lat if r["scenario"] == "serving/latency" and r["net"] == net and r["size"] == 1024
                      and r["backend"] == "llft" and r["added_p50_us"] is not None])
        if one:
            v = one[0]["added_p50_us"]
            check(f"1 KiB added p50 latency, 3 replicas ({net})", f"{v:.1f} µs", "≤ 100 µs", v <= 100)
        t16 = newest([r for r in thr if r["scenario"] == "serving/throughput" and r["net"] == net
                      and r["clients"] == 16 and r["backend"] == "llft" and r["ratio_rps"] is not None])
        if t16:
            r = t16[0]
            ceiling = f" (ceiling {r['ceiling_rps'] / r['base_rps']:.3f})" if r.get("ceiling_rps") else ""
            check(f"throughput with 16 clients / plain ({net})", f"{r['ratio_rps']:.3f}{ceiling}", "≥ 0.5",
                  r["ratio_rps"] >= 0.5)
        vc = newest([r for r in ev if r["scenario"] == "failover/view_change" and r["net"] == net
                     and r["replicas"] == 2 and r["metric"] == "view_change_ms"])
        if vc:
            v = vc[0]["p50"]
            check(f"view change, 2 replicas, p50 ({net})", f"{v:.2f} ms", "< 1 ms", v < 1)
        st = newest([r for r in ev if r["scenario"] == "failover/recovery" and r["net"] == net
                     and r["metric"] == "stall_ms" and "fault-timeout" not in str(r["variant"])])
        if st:
            v = max(r["p99"] for r in st)
            check(f"client-visible stall, default timeouts, worst p99 over clients ({net})", f"{v:.1f} ms", "< 50 ms",
                  v < 50)
    join = newest([r for r in ev if r["scenario"] == "checkpoint/clone" and r["variant"] == "100 MiB"
                   and r["metric"] == "join_ms"])
    if join:
        v = join[0]["p50"]
        check("a 100 MiB server's new backup (clone), end to end, p50", f"{v:.0f} ms", "< 1 s", v < 1000)
    for source in ("backup", "primary"):
        across = newest([r for r in ev if r["scenario"] == "checkpoint/join_across_hosts"
                         and r["variant"] == f"100 MiB, {source}" and r["metric"] == "join_ms"])
        if across:
            v = across[0]["p50"]
            check(f"a 100 MiB server's newcomer across hosts (a checkpoint of the {source}), end to end, p50",
                  f"{v:.0f} ms", "< 1 s", v < 1000)
    for scenario, variant, source in (
            ("checkpoint/clone", "100 MiB", "a backup"), ("checkpoint/primary", "100 MiB", "the primary"),
            ("checkpoint/join_across_hosts", "100 MiB, backup", "a backup, for a newcomer across hosts"),
            ("checkpoint/join_across_hosts", "100 MiB, primary", "the primary, for a newcomer across hosts")):
        pause = newest([r for r in ev if r["scenario"] == scenario and r["variant"] == variant
                        and r["metric"] == "primary_worst_rtt_during_ms"])
        if pause:
            v = pause[0]["p50"]
            limit = 20 if source.startswith("a backup") else 100
            check(f"the primary's slowest reply while a 100 MiB server is cloned from {source}, p50", f"{v:.1f} ms",
                  f"< {limit} ms", v < limit)
    return out


def markdown(tables: dict, figures: list[dict], image_dir: str, depth: int = 3) -> str:
    h = "#" * depth
    parts = []
    runs = tables["runs"]
    parts.append("Runs: " + "; ".join(f"{r['run']} on {r['host']} at commit {r['commit']} ({r['suite']}, "
                                      f"{r['records']:,} records)" for r in runs) + ".")
    goals = targets(tables)
    if goals:
        parts.append(f"{h} Targets\n\n" + table(["what", "measured", "target", ""], goals, 1))
    det = [r for r in tables["events"] if r["scenario"].startswith("determinizer/")]
    if det:
        by_run: dict[tuple, list[dict]] = {}
        for r in det:
            by_run.setdefault((r["net"], r["run"]), []).append(r)
        for (net, run), rows in by_run.items():
            parts.append(f"{h} Determinizer\n\n{title('determinizer', net, rows)}\n\n{determinizer_md(rows)}")
    for name, rows_of, fmt in (("Latency", "latency", latency_md), ("Throughput", "throughput", throughput_md),
                               ("Failover", "events", events_md)):
        rows = [r for r in tables[rows_of] if not r["scenario"].startswith("determinizer/")]
        if not rows:
            continue
        body = [f"{title(s, net, rs)}\n\n{fmt(rs)}" for (s, net, run), rs in sections(rows).items()]
        parts.append(f"{h} {name}\n\n" + "\n\n".join(body))
    if figures:
        parts.append(f"{h} Plots\n\n" + "\n\n".join(f"![{f['title']}]({image_dir}/{f['path'].name})"
                                                     for f in figures))
    return "\n\n".join(parts) + "\n"


def write(tables: dict, figures: list[dict], out: Path, readme: Path | None):
    (out / "report.md").write_text("# llft benchmark report\n\n" + markdown(tables, figures, ".", 2))
    if readme is None:
        return
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block to fill")
    rel = os.path.relpath(out.resolve(), readme.resolve().parent)
    block = f"{BEGIN}\n<!-- generated by python -m bench analyze --readme: do not edit by hand -->\n\n" \
            f"{markdown(tables, figures, rel, 3)}\n{END}"
    readme.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))
