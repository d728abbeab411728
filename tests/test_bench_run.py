"""The whole chain as a user runs it: a smoke `bench run` on the real
servers, `bench analyze` over its logs, and the overview notebook
executed headless over the same logs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "bench" / "notebooks" / "overview.ipynb"


def bench(*args, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_logs(tmp_path_factory, examples) -> Path:
    out = tmp_path_factory.mktemp("smoke") / "res"
    p = bench("run", "--suite", "smoke", "--out", out, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_smoke_run_writes_schema_records_for_every_workload(smoke_logs):
    files = {f.stem: f for f in smoke_logs.glob("*.jsonl")}
    assert {"determinizer", "messaging", "latency", "throughput", "replicas", "nondet", "view_change",
            "recovery", "detect", "orders", "order_failover"} <= set(files)
    runs = set()
    for f in files.values():
        recs = [json.loads(line) for line in f.read_text().splitlines()]
        assert recs, f
        assert all(r["schema"] == 1 and r["suite"] == "smoke" for r in recs)
        assert all(r["outcome"] == "ok" for r in recs), [r for r in recs if r["outcome"] != "ok"][:3]
        runs |= {r["run"] for r in recs}
    assert len(runs) == 1
    def backends(name):
        return {json.loads(line)["backend"] for line in files[name].read_text().splitlines()}
    assert backends("throughput") == {"plain", "llft", "ceiling"}
    # Issue 19: each ordering backend side by side in one run.
    assert backends("orders") == {"plain", "llft", "mailbox"}
    assert backends("order_failover") == {"llft", "mailbox"}


def test_analyze_turns_smoke_logs_into_tables_and_plots(smoke_logs, tmp_path):
    p = bench("analyze", smoke_logs, "--out", tmp_path / "report", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| backend |" in report or "| size | replicas | backend |" in report
    assert (tmp_path / "report" / "latency.csv").read_text().count("\n") > 1
    plots = {f.name for f in (tmp_path / "report").glob("*.png")}
    assert "fig12_latency_vs_size_loopback.png" in plots, plots
    assert len(plots) >= 5


def test_overview_notebook_executes_headless(smoke_logs, monkeypatch):
    import nbclient
    import nbformat
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("BENCH_LOGS", str(smoke_logs))      # the kernel inherits them
    monkeypatch.setenv("BENCH_MASTER", "local[2]")
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 2


def test_ctrl_c_keeps_every_record_and_stops_the_servers(tmp_path, examples):
    import signal
    import time

    import psutil
    out = tmp_path / "res"
    # SIGINT as a terminal sends it (a runner started in the background may have it ignored)
    proc = subprocess.Popen([sys.executable, "-m", "bench", "run", "--suite", "paper", "--only", "throughput",
                             "--out", out], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = out / "throughput.jsonl"
    deadline = time.monotonic() + 60
    while (not log.exists() or log.read_text().count("\n") < 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    started = psutil.Process(proc.pid).children(recursive=True)
    assert any("llft-run" in " ".join(p.cmdline()) for p in started)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted in throughput" in err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) >= 3 and all(r["kind"] == "window" for r in records)
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline() for p in alive]
