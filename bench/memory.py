"""Memory per connection (issue 15, defect 4): short connections one after
another, each one request, against a server under llft-run and the same
server unreplicated, in the same run.  After every `step` connections it
records the anonymous resident memory (RssAnon: the shared record rings
are left out, they are touched once and bounded) of llft-run and of its
primary and backups, and of the plain server; and how many connections
the data plane still holds.  Flat after warm-up is the target: nothing
kept per connection once it is done at every replica.

Servers: examples/kv_server (a thread per connection: the backups' thread
queues are reused) and examples/pool_server (an epoll front thread)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.serving import end, free_port, wait_port

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "bin"
REQUEST = {"kv_server": b"INCR memory\n", "pool_server": b"memory\n"}


def anon_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def one(port: int, request: bytes):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        if not s.recv(100):
            raise RuntimeError("the server closed the connection without an answer")


def sizes(backend: str, proc: subprocess.Popen, run_dir: Path | None) -> dict:
    if backend == "plain":
        return {"server_kib": anon_kib(proc.pid)}
    state = json.loads((run_dir / "llft-run.json").read_text())
    live = [r for r in state["replicas"] if r["role"] in ("primary", "backup")]
    return {"controller_kib": anon_kib(proc.pid),
            "primary_kib": sum(anon_kib(r["pid"]) for r in live if r["role"] == "primary"),
            "backup_kib": max((anon_kib(r["pid"]) for r in live if r["role"] == "backup"), default=0),
            "held_connections": (state.get("gateway") or {}).get("held")}


def memory(ctx, programs=("kv_server", "pool_server"), connections: int = 100_000, step: int = 10_000,
           replicas: int = 3):
    ctx.plan(len(programs) * 2 * (connections // step))
    for program in programs:
        for backend in ("plain", "llft"):
            port = free_port()
            run_dir = ctx.tmp / f"memory-{program}-{backend}"
            argv = [str(EXAMPLES / program), str(port)]
            if backend == "llft":
                argv = [str(Path(sys.executable).with_name("llft-run")), "--replicas", str(replicas), "--run-dir",
                        str(run_dir), "--", *argv]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            fields = dict(backend=backend, replicas=replicas if backend == "llft" else 1, clients=1, net="loopback")
            try:
                wait_port(port, proc)
                done = 0
                while done < connections:
                    for _ in range(step):
                        one(port, REQUEST[program])
                    done += step
                    time.sleep(1.5)   # the state file is written every second
                    ctx.rec.event("memory/short-connections", sizes(backend, proc, run_dir if backend == "llft"
                                                                    else None),
                                  variant=f"{program}, {done:,} connections", **fields)
                    ctx.step()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                ctx.rec.failed("memory/short-connections", "event", repr(e), variant=program, **fields)
            finally:
                end(proc, 15)
