"""python -m bench run | analyze: see --help of each."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.suites import SUITES, WORKLOADS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a suite of workloads, writing JSON lines (bench/SCHEMA.md)")
    r.add_argument("--suite", choices=SUITES, default="paper",
                   help="paper: the README's figures (as root, the cross-host part too); smoke: tiny, one host")
    r.add_argument("--out", type=Path, default=Path("bench/results"), help="directory for WORKLOAD.jsonl")
    r.add_argument("--only", nargs="+", metavar="WORKLOAD",
                   help=f"these workloads of the suite only: {', '.join(WORKLOADS)}")
    r.add_argument("--gzip", action="store_true", help="compress each workload's log once it is complete "
                   "(WORKLOAD.jsonl.gz; bench analyze reads either)")
    a = sub.add_parser("analyze", help="PySpark: tables (CSV, Markdown) and plots from JSON-lines logs")
    a.add_argument("inputs", nargs="+", help="files, directories (their *.jsonl) or globs")
    a.add_argument("--out", type=Path, default=Path("bench/report"), help="directory for the report")
    a.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    a.add_argument("--readme", type=Path, help="rewrite the block between <!-- bench:begin --> and "
                   "<!-- bench:end --> in this Markdown file with the report's tables and plots")
    args = ap.parse_args(argv)
    if args.command == "run":
        from bench.runner import run
        return run(args.suite, args.out, args.only, args.gzip)
    from bench.analyze import main as analyze
    return analyze(args.inputs, args.out, args.master, args.readme)


if __name__ == "__main__":
    sys.exit(main())
