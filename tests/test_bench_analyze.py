"""bench analyze (PySpark) against a log generated here, whose statistics
the test computes again in plain Python; malformed lines; no input."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import analyze  # noqa: E402

BASE = {"schema": 1, "host": "h", "commit": "c0ffee", "cpus": 2, "suite": "paper", "net": "loopback"}
MALFORMED = [
    "this is not JSON",
    '{"schema": 1, "run": "r1", "kind": "request", "scenario": "serving/latency", "backe',  # cut short
    json.dumps({**BASE, "schema": 2, "run": "r1", "kind": "request", "scenario": "serving/latency",
                "backend": "plain", "outcome": "ok", "latency_us": 1.0}),
    json.dumps({**BASE, "run": "r1", "kind": "request", "scenario": "serving/latency", "backend": "plain",
                "outcome": "ok", "size": 1024}),                                    # no latency_us
    json.dumps({**BASE, "run": "r1", "kind": "bogus", "scenario": "x", "backend": "plain", "outcome": "ok"}),
]


def pct(xs: list[float], q: float) -> float:
    """Exact percentile, linear between the closest ranks (numpy's default)."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def generate(path: Path) -> dict:
    """A log of two runs (each with its own baseline) and malformed lines;
    returns what was written, by configuration, for the checks."""
    rnd = random.Random(18)
    lines, truth = [], {"lat": {}, "win": {}, "ev": {}}
    for run, slow in (("r1", 1.0), ("r2", 1.7)):
        for size in (16, 1024):
            for backend, replicas, mean, n in (("plain", 1, 40, 500), ("llft", 3, 95, 701)):
                lat = [round(rnd.lognormvariate(math.log(mean * slow * (1 + size / 4096)), 0.4), 1)
                       for _ in range(n)]
                t = 1_700_000_000.0 + rnd.random()
                for x in lat:
                    lines.append({**BASE, "run": run, "kind": "request", "scenario": "serving/latency",
                                  "backend": backend, "replicas": replicas, "clients": 1, "size": size, "ts": t,
                                  "latency_us": x, "outcome": "ok"})
                    last = t + x / 1e6
                    t += x / 1e6 + 2e-6
                truth["lat"][(run, size, backend)] = {"lat": lat, "last": last}
            lines.append({**BASE, "run": run, "kind": "request", "scenario": "serving/latency", "backend": "llft",
                          "replicas": 3, "clients": 1, "size": size, "ts": 1_700_000_000.0, "outcome": "timeout",
                          "error": "timed out"})
        for backend, replicas, rate in (("plain", 1, 50_000), ("llft", 3, 9_000), ("ceiling", 3, 15_000)):
            wins = [(int(rate * slow * rnd.uniform(0.8, 1.2)), rnd.uniform(0.9, 1.1)) for _ in range(5)]
            for req, dur in wins:
                lines.append({**BASE, "run": run, "kind": "window", "scenario": "serving/throughput",
                              "backend": backend, "replicas": replicas, "clients": 16, "size": 1024,
                              "ts": 1_700_000_100.0, "requests": req, "duration_s": dur, "outcome": "ok"})
            truth["win"][(run, backend)] = wins
        vc = [round(rnd.uniform(0.1, 0.6) * slow, 3) for _ in range(7)]
        for v in vc:
            lines.append({**BASE, "run": run, "kind": "event", "scenario": "failover/view_change",
                          "backend": "llft", "variant": "SIGKILL", "replicas": 2, "clients": 0,
                          "ts": 1_700_000_200.0, "metrics": {"view_change_ms": v, "detection_ms": 1.0},
                          "outcome": "ok"})
        lines.append({**BASE, "run": run, "kind": "event", "scenario": "failover/view_change", "backend": "llft",
                      "variant": "SIGKILL", "replicas": 2, "clients": 0, "ts": 1_700_000_200.0,
                      "outcome": "error", "error": "no takeover"})
        truth["ev"][run] = vc
        for backend, variant, ns in (("plain", None, [20.0, 22.0, 21.0]), ("llft", "primary", [60.0, 66.0, 63.0])):
            for k, v in enumerate(ns):
                lines.append({**BASE, "run": run, "kind": "event", "scenario": "determinizer/gettimeofday",
                              "backend": backend, "variant": variant, "replicas": 1, "ops": 1000, "round": k,
                              "ts": 1_700_000_300.0, "metrics": {"ns_per_op": v * slow}, "outcome": "ok"})
    text = [json.dumps(r) for r in lines]
    for k, bad in enumerate(MALFORMED):
        text.insert(37 * (k + 1), bad)
    path.write_text("\n".join(text) + "\n")
    return truth


@pytest.fixture(scope="module")
def spark():
    s = analyze.session("local[2]")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def generated(tmp_path_factory, spark):
    d = tmp_path_factory.mktemp("gen")
    truth = generate(d / "gen.jsonl")
    tables = analyze.analyze(spark, [str(d / "gen.jsonl")], d / "report")
    return truth, tables, d


def one(rows, **where):
    got = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    assert len(got) == 1, (where, got)
    return got[0]


def test_latency_percentiles_and_ratios_agree_with_plain_python(generated):
    truth, tables, _ = generated
    for run in ("r1", "r2"):
        for size in (16, 1024):
            plain = truth["lat"][(run, size, "plain")]["lat"]
            for backend in ("plain", "llft"):
                t = truth["lat"][(run, size, backend)]
                row = one(tables["latency"], run=run, size=size, backend=backend, scenario="serving/latency")
                assert row["count"] == len(t["lat"])
                assert row["failed"] == (1 if backend == "llft" else 0)
                assert row["mean_us"] == pytest.approx(sum(t["lat"]) / len(t["lat"]), rel=1e-12)
                for q, name in zip((0.5, 0.9, 0.99, 0.999), ("p50_us", "p90_us", "p99_us", "p999_us")):
                    assert row[name] == pytest.approx(pct(t["lat"], q), rel=1e-12), (run, size, backend, name)
                assert row["max_us"] == max(t["lat"])
                assert row["ratio_p50"] == pytest.approx(pct(t["lat"], 0.5) / pct(plain, 0.5), rel=1e-12)
                assert row["ratio_p99"] == pytest.approx(pct(t["lat"], 0.99) / pct(plain, 0.99), rel=1e-12)
                assert row["added_p50_us"] == pytest.approx(pct(t["lat"], 0.5) - pct(plain, 0.5), abs=1e-9)


def test_request_throughput_spans_first_start_to_last_reply(generated):
    truth, tables, _ = generated
    t = truth["lat"][("r1", 1024, "llft")]
    row = one(tables["latency"], run="r1", size=1024, backend="llft")
    # the timed-out request's ts is earlier than every other: it opens the span
    assert row["rps"] == pytest.approx(len(t["lat"]) / (t["last"] - 1_700_000_000.0), rel=1e-9)


def test_throughput_ratios_to_baseline_and_ceiling(generated):
    truth, tables, _ = generated
    for run in ("r1", "r2"):
        rate = {b: sum(r for r, _ in w) / sum(d for _, d in w)
                for (rn, b), w in truth["win"].items() if rn == run}
        for backend in ("plain", "llft", "ceiling"):
            row = one(tables["throughput"], run=run, backend=backend)
            assert row["rps"] == pytest.approx(rate[backend], rel=1e-12)
            assert row["windows"] == 5
            assert row["rps_p50"] == pytest.approx(pct([r / d for r, d in truth["win"][(run, backend)]], 0.5),
                                                   rel=1e-12)
            assert row["ratio_rps"] == pytest.approx(rate[backend] / rate["plain"], rel=1e-12)
        assert one(tables["throughput"], run=run, backend="llft")["ratio_ceiling"] == pytest.approx(
            rate["llft"] / rate["ceiling"], rel=1e-12)


def test_event_distributions_and_determinizer_ratio(generated):
    truth, tables, _ = generated
    for run, slow in (("r1", 1.0), ("r2", 1.7)):
        vc = truth["ev"][run]
        row = one(tables["events"], run=run, scenario="failover/view_change", metric="view_change_ms")
        assert (row["count"], row["failed"]) == (7, 1)
        for q, name in zip((0.5, 0.9, 0.99, 0.999), ("p50", "p90", "p99", "p999")):
            assert row[name] == pytest.approx(pct(vc, q), rel=1e-12)
        assert (row["min"], row["max"]) == (min(vc), max(vc))
        det = one(tables["events"], run=run, scenario="determinizer/gettimeofday", variant="primary")
        assert det["p50"] == pytest.approx(63.0 * slow)
        assert det["ratio_p50"] == pytest.approx(63.0 / 21.0)
        assert det["added_p50"] == pytest.approx(42.0 * slow)


def test_malformed_lines_are_counted_by_reason(generated):
    _, tables, _ = generated
    reasons = {r["malformed"]: r["count"] for r in tables["malformed"]}
    assert sum(reasons.values()) == len(MALFORMED)
    assert reasons["not a JSON object of the schema's types"] == 2
    assert reasons["schema version 2, not 1"] == 1
    assert reasons["request without latency_us"] == 1
    assert reasons["kind not one of request/window/event"] == 1


def test_whole_job_reports_malformed_lines_and_writes_tables_and_plots(generated, spark, tmp_path, capsys):
    _, _, d = generated
    assert analyze.main([str(d / "*.jsonl")], tmp_path / "rep", spark=spark) == 0
    err = capsys.readouterr().err
    assert f"{len(MALFORMED)} malformed lines skipped" in err
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "serving/latency" in report and "| × p50 |" in report
    assert {p.name for p in (tmp_path / "rep").glob("*.png")} >= {"fig12_latency_vs_size_loopback.png",
                                                                   "fig13_throughput_vs_clients_loopback.png",
                                                                   "fig16_view_change_vs_replicas_loopback.png"}


def test_empty_input_is_one_clear_error(spark, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert analyze.main([str(tmp_path / "empty.jsonl")], tmp_path / "rep", spark=spark) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench analyze: no record in 1 file"]


def test_glob_matching_nothing_exits_non_zero_with_one_message(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench", "analyze", str(tmp_path / "logs/*/*.jsonl"), "--out",
                        str(tmp_path / "rep")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"bench analyze: no input: '{tmp_path}/logs/*/*.jsonl' matches no file of JSON lines"]
    assert not (tmp_path / "rep").exists()
