"""The report's plots (matplotlib, no display): LLFT Figs. 12-17 with this
project's numbers, and the determinizer's cost per call.  Each figure is
drawn from the newest run in the input that has its scenario, once per
network (loopback, netns) that run measured; a figure without data is not
drawn."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"plain": "tab:gray", "llft": "tab:blue", "ceiling": "tab:green", "tcp": "tab:orange"}


def newest(tables: dict, table: str, **where) -> dict[str, list[dict]]:
    """{net: rows} of `table` matching `where`, each net's rows from the newest run that has any."""
    order = [r["run"] for r in tables["runs"]]
    found = [r for r in tables[table] if all(r.get(k) == v for k, v in where.items())]
    by_net: dict[str, list[dict]] = {}
    for net in sorted({r["net"] for r in found}):
        rs = [r for r in found if r["net"] == net]
        run = max((r["run"] for r in rs), key=order.index)
        by_net[net] = [r for r in rs if r["run"] == run]
    return by_net


def caption(rows: list[dict]) -> str:
    r = rows[0]
    return f"{r['host']}, {r['commit']}, run {r['run']}"


def series(rows: list[dict], x: str, y: str, **where):
    pts = sorted((r[x], r[y]) for r in rows if all(r.get(k) == v for k, v in where.items())
                 and r.get(x) is not None and r.get(y) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def save(fig, out: Path, name: str, title: str, rows: list[dict], figures: list):
    fig.suptitle(title, fontsize=11)
    fig.text(0.99, 0.01, caption(rows), ha="right", va="bottom", fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    figures.append({"name": name, "title": title, "path": path, "net": rows[0]["net"]})


def latency_lines(ax, rows, x: str, backends=("plain", "llft")):
    for b in backends:
        xs, p50 = series(rows, x, "p50_us", backend=b)
        if xs:
            ax.plot(xs, p50, "o-", color=COLORS.get(b), label=f"{b} p50")
            ax.plot(*series(rows, x, "p99_us", backend=b), "x--", color=COLORS.get(b), alpha=0.6,
                    label=f"{b} p99")
    ax.set_ylabel("round trip (µs)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def fig12(tables, out, figures):
    for net, rows in newest(tables, "latency", scenario="serving/latency").items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        latency_lines(ax, rows, "size")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("request and reply size (bytes)")
        save(fig, out, f"fig12_latency_vs_size_{net}", f"Fig. 12: end-to-end latency vs message size ({net})",
             rows, figures)


def fig13(tables, out, figures):
    for net, rows in newest(tables, "throughput", scenario="serving/throughput").items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for b in ("plain", "llft", "ceiling"):
            xs, ys = series(rows, "clients", "rps", backend=b)
            if xs:
                ax.plot(xs, ys, "o-", color=COLORS[b], label=b + (" (zero-cost replication)" if b == "ceiling"
                                                                  else ""))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (1 KiB requests)")
        ax.set_ylabel("requests / s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, out, f"fig13_throughput_vs_clients_{net}", f"Fig. 13: throughput vs concurrent clients ({net})",
             rows, figures)


def fig14(tables, out, figures):
    for net, rows in newest(tables, "latency", scenario="serving/replicas").items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        latency_lines(ax, rows, "replicas", backends=("llft",))
        for r in rows:
            if r["backend"] == "plain":
                ax.axhline(r["p50_us"], color=COLORS["plain"], ls=":", label="plain p50")
        ax.legend(fontsize=8)
        ax.set_xlabel("replicas (1 KiB)")
        save(fig, out, f"fig14_latency_vs_replicas_{net}", f"Fig. 14: end-to-end latency vs replicas ({net})",
             rows, figures)


def fig15(tables, out, figures):
    for net, rows in newest(tables, "latency", scenario="serving/nondet").items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        latency_lines(ax, rows, "nondet")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("gettimeofday calls per request (1 KiB)")
        save(fig, out, f"fig15_latency_vs_nondet_{net}",
             f"Fig. 15: end-to-end latency vs non-deterministic operations ({net})", rows, figures)


def event_lines(ax, rows, x: str, metric: str, label):
    groups = sorted({(r["replicas"], r["variant"]) for r in rows if r["metric"] == metric} if x != "replicas"
                    else {(None, r["variant"]) for r in rows if r["metric"] == metric}, key=str)
    for replicas, variant in groups:
        where = {"metric": metric, "variant": variant, **({"replicas": replicas} if replicas else {})}
        xs, p50 = series(rows, x, "p50", **where)
        _, p99 = series(rows, x, "p99", **where)
        if xs:
            ax.errorbar(xs, p50, yerr=[[0] * len(xs), [b - a for a, b in zip(p50, p99)]], fmt="o-", capsize=3,
                        label=label(replicas, variant))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def fig16(tables, out, figures):
    for net, rows in newest(tables, "events", scenario="failover/view_change").items():
        fig, ax = plt.subplots(figsize=(6.4, 4))
        event_lines(ax, rows, "replicas", "view_change_ms", lambda n, v: f"p50, bar to p99 ({v})")
        ax.set_xlabel("replicas (no clients)")
        ax.set_ylabel("primary view change (ms)")
        save(fig, out, f"fig16_view_change_vs_replicas_{net}", f"Fig. 16: primary view change ({net})", rows,
             figures)


def fig17(tables, out, figures):
    for net, rows in newest(tables, "events", scenario="failover/recovery").items():
        metrics = {r["metric"] for r in rows}
        left = "recovery_ms" if "recovery_ms" in metrics else "crash_to_reply_ms"
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, metric, what in ((axes[0], left, "recovery" if left == "recovery_ms" else "crash to every "
                                  "client's next reply"), (axes[1], "stall_ms", "client-visible stall")):
            event_lines(ax, rows, "clients", metric, lambda n, v: f"{n} replicas" + (f" ({v})" if "timeout" in
                                                                                      str(v) else ""))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients (1 KiB)")
            ax.set_ylabel(f"{what} (ms), p50, bar to p99")
        save(fig, out, f"fig17_recovery_vs_clients_{net}", f"Fig. 17: recovery and stall vs clients ({net})", rows,
             figures)


def determinizer(tables, out, figures):
    for net, rows in newest(tables, "events", metric="ns_per_op").items():
        calls = sorted({r["scenario"].split("/", 1)[1] for r in rows})
        fig, ax = plt.subplots(figsize=(7.5, 4))
        width = 0.27
        for k, (backend, variant, label) in enumerate((("plain", None, "plain"), ("llft", "primary", "primary"),
                                                       ("llft", "backup", "backup"))):
            vals = [next((r["p50"] for r in rows if r["scenario"] == f"determinizer/{c}" and r["backend"] == backend
                          and r["variant"] == variant), 0) for c in calls]
            ax.bar([i + (k - 1) * width for i in range(len(calls))], vals, width, label=label)
        ax.set_xticks(range(len(calls)), [c.replace("_", " ") for c in calls], fontsize=8)
        ax.set_ylabel("ns per call (median)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, out, "determinizer_cost_per_call", "Determinizer: cost per call", rows, figures)


def draw(tables: dict, out: Path) -> list[dict]:
    """Every figure the tables have data for: [{name, title, path, net}]."""
    figures: list[dict] = []
    for fig in (fig12, fig13, fig14, fig15, fig16, fig17, determinizer):
        fig(tables, out, figures)
    return figures
