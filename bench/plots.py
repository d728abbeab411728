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
from matplotlib.ticker import MaxNLocator  # noqa: E402

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


def finish(ax, xlabel: str, ylabel: str, logx=None):
    """The axes every plot shares: from zero up, a light grid, a legend."""
    if logx == "log2":
        ax.set_xscale("log", base=2)
    elif logx == "symlog":
        ax.set_xscale("symlog", linthresh=1)
    elif xlabel:                    # counts (replicas): whole numbers only
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def latency_lines(ax, rows, x: str, backends=("plain", "llft")):
    for b in backends:
        xs, p50 = series(rows, x, "p50_us", backend=b)
        if xs:
            ax.plot(xs, p50, "o-", color=COLORS.get(b), label=f"{b} p50")
            ax.plot(*series(rows, x, "p99_us", backend=b), "x--", color=COLORS.get(b), alpha=0.6,
                    label=f"{b} p99")


def each_net(tables, out, figures, table: str, where: dict, name: str, title: str, draw, ncols: int = 1):
    """One figure per network of the newest run with rows of `table` matching `where`: draw(axes, rows)."""
    for net, rows in newest(tables, table, **where).items():
        fig, axes = plt.subplots(1, ncols, figsize=(6.4 * (1 + 0.6 * (ncols - 1)), 4))
        draw(axes, rows)
        save(fig, out, f"{name}_{net}", f"{title} ({net})", rows, figures)


def fig12(tables, out, figures):
    def draw(ax, rows):
        latency_lines(ax, rows, "size")
        finish(ax, "request and reply size (bytes)", "round trip (µs)", "log2")
    each_net(tables, out, figures, "latency", {"scenario": "serving/latency"}, "fig12_latency_vs_size",
             "Fig. 12: end-to-end latency vs message size", draw)


def fig13(tables, out, figures):
    def draw(ax, rows):
        for b in ("plain", "llft", "ceiling"):
            xs, ys = series(rows, "clients", "rps", backend=b)
            if xs:
                ax.plot(xs, ys, "o-", color=COLORS[b], label=b + (" (zero-cost replication)" if b == "ceiling"
                                                                  else ""))
        finish(ax, "concurrent clients (1 KiB requests)", "requests / s", "log2")
    each_net(tables, out, figures, "throughput", {"scenario": "serving/throughput"}, "fig13_throughput_vs_clients",
             "Fig. 13: throughput vs concurrent clients", draw)


def fig14(tables, out, figures):
    def draw(ax, rows):
        latency_lines(ax, rows, "replicas", backends=("llft",))
        for r in rows:
            if r["backend"] == "plain":
                ax.axhline(r["p50_us"], color=COLORS["plain"], ls=":", label="plain p50")
        finish(ax, "replicas (1 KiB)", "round trip (µs)")
    each_net(tables, out, figures, "latency", {"scenario": "serving/replicas"}, "fig14_latency_vs_replicas",
             "Fig. 14: end-to-end latency vs replicas", draw)


def fig15(tables, out, figures):
    def draw(ax, rows):
        latency_lines(ax, rows, "nondet")
        finish(ax, "gettimeofday calls per request (1 KiB)", "round trip (µs)", "symlog")
    each_net(tables, out, figures, "latency", {"scenario": "serving/nondet"}, "fig15_latency_vs_nondet",
             "Fig. 15: end-to-end latency vs non-deterministic operations", draw)


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


def fig16(tables, out, figures):
    def draw(ax, rows):
        event_lines(ax, rows, "replicas", "view_change_ms", lambda n, v: f"p50, bar to p99 ({v})")
        finish(ax, "replicas (no clients)", "primary view change (ms)")
    each_net(tables, out, figures, "events", {"scenario": "failover/view_change"}, "fig16_view_change_vs_replicas",
             "Fig. 16: primary view change", draw)


def fig17(tables, out, figures):
    def draw(axes, rows):
        # Across hosts the view change spans both phases of the takeover, virtual synchrony included:
        # the nearest figure there to LLFT's recovery.
        left = "recovery_ms" if any(r["metric"] == "recovery_ms" for r in rows) else "view_change_ms"
        for ax, metric, what in ((axes[0], left, "recovery" if left == "recovery_ms" else
                                  "view change, both phases"), (axes[1], "stall_ms", "client-visible stall")):
            event_lines(ax, rows, "clients", metric,
                        lambda n, v: f"{n} replicas" + (f" ({v})" if "timeout" in str(v) else ""))
            finish(ax, "concurrent clients (1 KiB)", f"{what} (ms), p50, bar to p99", "log2")
    each_net(tables, out, figures, "events", {"scenario": "failover/recovery"}, "fig17_recovery_vs_clients",
             "Fig. 17: recovery and stall vs clients", draw, ncols=2)


def determinizer(tables, out, figures):
    def draw(ax, rows):
        calls = sorted({r["scenario"].split("/", 1)[1] for r in rows})
        width = 0.27
        for k, (backend, variant, label) in enumerate((("plain", None, "plain"), ("llft", "primary", "primary"),
                                                       ("llft", "backup", "backup"))):
            vals = [next((r["p50"] for r in rows if r["scenario"] == f"determinizer/{c}" and r["backend"] == backend
                          and r["variant"] == variant), 0) for c in calls]
            ax.bar([i + (k - 1) * width for i in range(len(calls))], vals, width, label=label)
        ax.set_xticks(range(len(calls)), [c.replace("_", " ") for c in calls], fontsize=8, rotation=15,
                      ha="right")
        finish(ax, "", "ns per call (median)")
    each_net(tables, out, figures, "events", {"metric": "ns_per_op"}, "determinizer_cost_per_call",
             "Determinizer: cost per call", draw)


def draw(tables: dict, out: Path) -> list[dict]:
    """Every figure the tables have data for: [{name, title, path, net}]."""
    figures: list[dict] = []
    for fig in (fig12, fig13, fig14, fig15, fig16, fig17, determinizer):
        fig(tables, out, figures)
    return figures
