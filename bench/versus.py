"""Two installations of llft side by side: the same 1 KiB round trips
through a group of each, and through the unreplicated server, in turn,
round after round, so that a difference between two commits is told
apart from this machine's drift (its speed changes from hour to hour by
more than most changes cost).

    git worktree add /tmp/old COMMIT && scripts/venv-of.sh /tmp/old /tmp/oldvenv
    .venv/bin/python -m bench.versus /tmp/oldvenv/bin/llft-run .venv/bin/llft-run

Prints, per installation, the p50 of every round and their median."""
from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench import serving


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__.split("\n\n")[0])
    ap.add_argument("llft_runs", nargs="+", metavar="LLFT_RUN", help="the llft-run of each installation")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--count", type=int, default=2000, help="round trips per round")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--replicas", type=int, default=3)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="llft-versus-"))
    with ExitStack() as stack:
        servers = {"plain": serving.Server(serving.msg_server, None, tmp)}
        for run in a.llft_runs:
            serving.LLFT_RUN = str(Path(run).absolute())
            servers[run] = serving.Server(serving.msg_server, a.replicas, tmp)
        for srv in servers.values():
            stack.callback(srv.stop)
        p50s: dict[str, list[float]] = {name: [] for name in servers}
        for srv in servers.values():   # warm-up
            serving.client("latency", srv.port, a.size, 200, "samples", timeout=60)
        for _ in range(a.rounds):
            for name, srv in servers.items():
                got = serving.client("latency", srv.port, a.size, a.count, "samples", timeout=60 + a.count * 0.05)
                p50s[name].append(statistics.median(lat for _at, lat in got["samples"]))
    for name, rounds in p50s.items():
        print(f"{name}: median {statistics.median(rounds):.0f} µs; p50 per round "
              + " ".join(f"{x:.0f}" for x in rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
