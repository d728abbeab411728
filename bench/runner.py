"""`python -m bench run`: the workloads of a suite, in turn, each writing
its records to OUT/WORKLOAD.jsonl (replacing that workload's log from an
earlier run; with --gzip compressed once complete), with a progress bar
per workload.

Ctrl-C (or SIGTERM) stops the run where it is: every record written so
far stays (each is flushed as it is written), the servers the workload
started are stopped by its own clean-up, and the exit status is 130."""
from __future__ import annotations

import gzip
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tqdm import tqdm

from bench.records import Recorder, new_run
from bench.suites import plan


class Context:
    """What a workload gets: the recorder, a scratch directory, and its progress bar."""

    def __init__(self, rec: Recorder, tmp: Path, bar: tqdm):
        self.rec, self.tmp, self.bar = rec, tmp, bar
        self.skipped: str | None = None

    def plan(self, steps: int):
        """Announces `steps` more steps of work (the bar's length)."""
        self.bar.total = (self.bar.total or 0) + steps
        self.bar.refresh()

    def step(self):
        self.bar.update(1)

    def skip(self, reason: str):
        self.skipped = reason


RUNNER = os.getpid()


def interrupt(signum, frame):
    if os.getpid() != RUNNER:
        # A worker process a workload forked (messaging's members) ends as SIGTERM ends it by default.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    raise KeyboardInterrupt


def compress(path: Path) -> Path:
    """WORKLOAD.jsonl -> WORKLOAD.jsonl.gz, once it is complete (a log kept in git)."""
    gz = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return gz


def run(suite: str, out: Path, only: list[str] | None = None, gz: bool = False) -> int:
    # SIGTERM ends a run as Ctrl-C does: the servers a workload started are
    # in sessions of their own, out of reach of a signal to this process group.
    signal.signal(signal.SIGTERM, interrupt)
    try:
        todo = plan(suite, only)
    except ValueError as e:
        print(f"bench run: {e}", file=sys.stderr)
        return 2
    if not todo:
        print(f"bench run: suite {suite} has none of {', '.join(only)}", file=sys.stderr)
        return 2
    info = new_run(suite)
    print(f"run {info['run']} on {info['host']} at {info['commit']}: {', '.join(n for n, _, _ in todo)} -> {out}/")
    failed = []
    started = time.monotonic()
    for name, fn, kwargs in todo:
        # A workload's new log replaces its old one, plain or compressed: one log per workload in `out`.
        (out / f"{name}.jsonl.gz").unlink(missing_ok=True)
        rec = Recorder(out / f"{name}.jsonl", info)
        bar = tqdm(desc=f"{name:13}", unit="step", dynamic_ncols=True, leave=True)
        ctx = Context(rec, None, bar)
        try:
            with tempfile.TemporaryDirectory(prefix=f"llft-bench-{name}-") as tmp:
                ctx.tmp = Path(tmp)
                fn(ctx, **kwargs)
        except KeyboardInterrupt:
            bar.close()
            rec.close()
            print(f"\ninterrupted in {name}: {rec.count} records of it kept in "
                  f"{compress(rec.path) if gz else rec.path}; "
                  f"the workloads before it are complete", file=sys.stderr)
            return 130
        except Exception:   # one workload failing leaves the others' records to measure
            bar.close()
            failed.append(name)
            tqdm.write(f"{name} failed after {rec.count} records:\n{traceback.format_exc()}", file=sys.stderr)
        else:
            bar.close()
        rec.close()
        if ctx.skipped and rec.count == 0:
            rec.path.unlink()
            tqdm.write(f"{name}: skipped: {ctx.skipped}")
        else:
            tqdm.write(f"{name}: {rec.count} records in {compress(rec.path) if gz else rec.path}"
                       + (f" (then skipped: {ctx.skipped})" if ctx.skipped else ""))
    print(f"done in {time.monotonic() - started:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
