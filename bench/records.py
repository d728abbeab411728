"""The JSON-lines records every workload writes (bench/SCHEMA.md).

A Recorder owns one output file; each record is the run's identity
(run id, host, commit, suite), the scenario's settings, and what was
measured, written and flushed as soon as it is known, so that a run
stopped with Ctrl-C keeps every record measured before the stop."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

SCHEMA_VERSION = 1
KINDS = ("request", "window", "event")
OUTCOMES = ("ok", "error", "timeout")
# The backend of every unreplicated baseline: ratios are taken against the
# rows of this backend with the same run, scenario, net, size, clients and nondet.
BASELINE = "plain"

REPO = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The commit measured, with "+dirty" when tracked files differ from it."""
    try:
        r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty=+dirty", "--abbrev=7"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return r.stdout.strip() or "unknown"


def new_run(suite: str) -> dict:
    """The fields that name one `bench run`: the same in every record it writes."""
    started = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    return {"schema": SCHEMA_VERSION, "run": f"{stamp}-{secrets.token_hex(3)}", "host": socket.gethostname(),
            "commit": commit(), "cpus": os.cpu_count(), "suite": suite}


class Recorder:
    """Appends records to one JSON-lines file; `fields` go into each."""

    def __init__(self, path: Path, run: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.run = run
        self.count = 0
        self._f = open(path, "w")

    def _write(self, lines: list[str]):
        self._f.write("".join(lines))
        self._f.flush()
        self.count += len(lines)

    def event(self, scenario: str, metrics: dict[str, float | None], outcome: str = "ok", **fields):
        """One event (a failover, a determinizer measurement): named figures."""
        self._write([self._line("event", scenario, fields, outcome=outcome, ts=time.time(),
                                metrics={k: v for k, v in metrics.items() if v is not None})])

    def window(self, scenario: str, requests: int, duration_s: float, ts: float | None = None,
               outcome: str = "ok", **fields):
        """One throughput window: `requests` completed in `duration_s`."""
        self._write([self._line("window", scenario, fields, outcome=outcome,
                                ts=ts if ts is not None else time.time() - duration_s,
                                requests=requests, duration_s=round(duration_s, 6))])

    def requests(self, scenario: str, start_s: float, samples, **fields):
        """One record per request: samples are [start offset µs, latency µs]
        from start_s (wall clock, seconds), in the order they were made."""
        self._write([self._line("request", scenario, fields, outcome="ok", ts=round(start_s + at / 1e6, 6),
                                latency_us=lat) for at, lat in samples])

    def failed(self, scenario: str, kind: str, error: str, outcome: str = "error", **fields):
        """A measurement that produced nothing: counted as such, never dropped."""
        self._write([self._line(kind, scenario, fields, outcome=outcome, ts=time.time(), error=error[:500])])

    def _line(self, kind: str, scenario: str, fields: dict, **measured) -> str:
        return json.dumps({**self.run, "kind": kind, "scenario": scenario, **fields, **measured},
                          separators=(",", ":")) + "\n"

    def close(self):
        self._f.close()
