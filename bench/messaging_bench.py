"""Group-to-group request/reply over the LLFT messaging protocol, against raw
UDP and TCP echo baselines measured in the same run.

    .venv/bin/python bench/messaging_bench.py [--sizes 16,256,...] [--replicas 1,3]
        [--count 1000] [--out bench/results/messaging.jsonl]

Every member of both groups is its own process on loopback (unicast
fan-out).  For each size: a closed-loop latency phase (one request
outstanding; p50/p99 of the round trip at the client primary) and a
pipelined throughput phase (requests as fast as flow control allows).
Client backups run the same client code (their sends are only logged),
server backups the same echo code, as under LLFT.  Output: one JSON line per
(transport, size, replicas, mode) with git rev, event loop, p50/p99 and the
ratio to the raw UDP / TCP baselines of the same size.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llft.messaging.node import open_member  # noqa: E402
from llft.transport import loop_name, new_event_loop  # noqa: E402

CLIENT, SERVER = 10, 20
WARMUP = 20
UDP_MAX = 65507


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def free_ports(k: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# --- LLFT members ---------------------------------------------------------------

def specs_for(replicas: int) -> list[dict]:
    ports = free_ports(2 * replicas)
    groups = [{"group": g, "port": 0, "members": {str(m): ["127.0.0.1", ports.pop()] for m in range(replicas)}}
              for g in (CLIENT, SERVER)]
    return [{"mode": "unicast", "groups": groups, "key": "6b" * 32, "group": g, "member": m,
             "interface": "127.0.0.1"} for g in (CLIENT, SERVER) for m in range(replicas)]


async def serve(spec: dict) -> None:
    """Echo every request back on its connection (primary sends, backups log)."""
    ep = await open_member(spec)
    wake = asyncio.Event()
    ep.on_ready = wake.set
    ep.on_writable = lambda c: wake.set()
    backlog = []
    while True:
        while (got := ep.recv()) is not None:
            backlog.append(got)
        while backlog and ep.writable(backlog[0][0]):
            ep.send(*backlog.pop(0))
        wake.clear()
        await wake.wait()


async def client(spec: dict, sizes: list[int], count: int, results) -> None:
    ep = await open_member(spec)
    await asyncio.sleep(0.3)   # let every member bind before the first request
    wake = asyncio.Event()
    ep.on_ready = wake.set
    ep.on_writable = lambda c: wake.set()

    async def wait():
        wake.clear()
        await wake.wait()

    async def reply():
        while (got := ep.recv()) is None:
            await wait()
        return got
    out = []
    for k, size in enumerate(sizes):
        payload = os.urandom(size)
        conn = ep.connect(SERVER, 2 * k + 1)
        lat = []
        for _ in range(count + WARMUP):
            while not ep.writable(conn):   # intra-group flow control: backups behind
                await wait()
            t0 = time.perf_counter()
            ep.send(conn, payload)
            await reply()
            lat.append(time.perf_counter() - t0)
        out.append({"size": size, "mode": "latency", "samples": lat[WARMUP:]})
        conn = ep.connect(SERVER, 2 * k + 2)
        n = max(200, count * 2) if size <= 4096 else count
        t0, sent, got = time.perf_counter(), 0, 0
        while got < n:
            while sent < n and ep.writable(conn):
                ep.send(conn, payload)
                sent += 1
            if ep.recv() is not None:
                got += 1
            else:
                await wait()   # a reply or the window reopening
        out.append({"size": size, "mode": "throughput", "count": n, "seconds": time.perf_counter() - t0})
    if ep.is_primary:
        results.send({"loop": loop_name(asyncio.get_running_loop()), "phases": out,
                      "stats": ep.stats()["counters"]})
    await asyncio.sleep(0.5)   # let the backups finish their logged copies


def member_process(role: str, spec: dict, sizes, count, results) -> None:
    loop = new_event_loop()
    coro = serve(spec) if role == "server" else client(spec, sizes, count, results)
    try:
        loop.run_until_complete(coro)
    except KeyboardInterrupt:
        pass


def run_llft(replicas: int, sizes: list[int], count: int) -> dict:
    specs = specs_for(replicas)
    parent, child = mp.Pipe()
    procs = []
    for spec in specs:
        role = "client" if spec["group"] == CLIENT else "server"
        procs.append(mp.Process(target=member_process, args=(role, spec, sizes, count, child), daemon=True))
    for p in procs:
        p.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("llft benchmark produced no result")
        return parent.recv()
    finally:
        for p in procs:
            p.terminate()
            p.join(5)


# --- baselines ---------------------------------------------------------------------

class UdpEcho(asyncio.DatagramProtocol):
    def connection_made(self, t):
        self.t = t

    def datagram_received(self, data, addr):
        self.t.sendto(data, addr)


async def tcp_echo(reader, writer):
    while data := await reader.read(1 << 20):
        writer.write(data)
        await writer.drain()


def baseline_server(kind: str, port: int) -> None:
    loop = new_event_loop()
    if kind == "udp":
        loop.run_until_complete(loop.create_datagram_endpoint(UdpEcho, local_addr=("127.0.0.1", port)))
    else:
        loop.run_until_complete(asyncio.start_server(tcp_echo, "127.0.0.1", port))
    loop.run_forever()


async def baseline_client(kind: str, port: int, sizes: list[int], count: int) -> list[dict]:
    loop = asyncio.get_running_loop()
    out = []
    if kind == "udp":
        q: asyncio.Queue = asyncio.Queue()

        class P(asyncio.DatagramProtocol):
            def datagram_received(self, data, addr):
                q.put_nowait(data)
        t, _ = await loop.create_datagram_endpoint(P, remote_addr=("127.0.0.1", port))

        async def rt(payload):
            t.sendto(payload)
            await q.get()
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def rt(payload):
            writer.write(payload)
            await reader.readexactly(len(payload))
    for size in sizes:
        payload = os.urandom(min(size, UDP_MAX) if kind == "udp" else size)
        lat = []
        for _ in range(count + WARMUP):
            t0 = time.perf_counter()
            await rt(payload)
            lat.append(time.perf_counter() - t0)
        out.append({"size": size, "mode": "latency", "samples": lat[WARMUP:], "sent_size": len(payload)})
    return out


def run_baseline(kind: str, sizes: list[int], count: int) -> list[dict]:
    port = free_ports(1)[0]
    server = mp.Process(target=baseline_server, args=(kind, port), daemon=True)
    server.start()
    time.sleep(0.3)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(baseline_client(kind, port, sizes, count))
    finally:
        loop.close()
        server.terminate()
        server.join(5)


# --- main ------------------------------------------------------------------------------

def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,256,1024,4096,16384,65536")
    ap.add_argument("--replicas", default="1,3")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "messaging.jsonl"))
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    common = {"bench": "messaging", "git_rev": git_rev(), "host_cpus": os.cpu_count(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    base = {kind: {p["size"]: p for p in run_baseline(kind, sizes, a.count)} for kind in ("udp", "tcp")}
    rows = []
    loop = loop_name(new_event_loop())
    for kind, by_size in base.items():
        for size, p in by_size.items():
            rows.append(dict(common, transport=kind, loop=loop, size=size, sent_size=p["sent_size"], replicas=1,
                             mode="latency", count=len(p["samples"]), p50_us=pct(p["samples"], .5) * 1e6,
                             p99_us=pct(p["samples"], .99) * 1e6, ratio_udp=None, ratio_tcp=None))
    for r in (int(x) for x in a.replicas.split(",")):
        res = run_llft(r, sizes, a.count)
        for p in res["phases"]:
            row = dict(common, transport="llft", loop=res["loop"], size=p["size"], replicas=r, mode=p["mode"])
            if p["mode"] == "latency":
                p50, p99 = pct(p["samples"], .5), pct(p["samples"], .99)
                row.update(count=len(p["samples"]), p50_us=p50 * 1e6, p99_us=p99 * 1e6,
                           ratio_udp=p50 / pct(base["udp"][p["size"]]["samples"], .5),
                           ratio_tcp=p50 / pct(base["tcp"][p["size"]]["samples"], .5),
                           p99_ratio_udp=p99 / pct(base["udp"][p["size"]]["samples"], .99))
            else:
                row.update(count=p["count"], msgs_per_s=p["count"] / p["seconds"],
                           mbytes_per_s=p["count"] * p["size"] / p["seconds"] / 1e6)
            rows.append(row)
        rows[-1]["llft_counters"] = res["stats"]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for row in rows:
        if row["mode"] == "latency":
            ratio = f" x{row['ratio_udp']:.1f} udp x{row['ratio_tcp']:.1f} tcp" if row["ratio_udp"] else ""
            print(f"{row['transport']:5} r={row['replicas']} {row['size']:6}B  p50 {row['p50_us']:8.1f}us"
                  f"  p99 {row['p99_us']:8.1f}us{ratio}")
        else:
            print(f"{row['transport']:5} r={row['replicas']} {row['size']:6}B  {row['msgs_per_s']:8.0f} msg/s"
                  f"  {row['mbytes_per_s']:6.1f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
