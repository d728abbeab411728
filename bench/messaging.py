"""Group-to-group request/reply over the LLFT messaging protocol, against raw
UDP (backend plain) and TCP (backend tcp) echo measured in the same run.

Every member of both groups is its own process on loopback (unicast
fan-out).  For each size: a closed-loop latency phase (one request
outstanding; p50/p99 of the round trip at the client primary) and a
pipelined throughput phase (requests as fast as flow control allows).
Client backups run the same client code (their sends are only logged),
server backups the same echo code, as under LLFT.  Records: one per round
trip (scenario messaging/latency) and one window per throughput phase
(messaging/throughput).  A UDP datagram carries at most 65,507 bytes: the
UDP baseline of a larger size sends that many.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import time

from llft.ordering.llmp.messaging.node import open_member
from llft.transport import new_event_loop

CLIENT, SERVER = 10, 20
WARMUP = 20
UDP_MAX = 65507


def free_ports(k: int, kind: int = socket.SOCK_DGRAM) -> list[int]:
    """k ports free on loopback for sockets of `kind` (a free UDP port may be a busy TCP one)."""
    socks = [socket.socket(socket.AF_INET, kind) for _ in range(k)]
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
            lat.append((t0, time.perf_counter() - t0))
        out.append({"size": size, "mode": "latency", **samples(lat[WARMUP:])})
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
        out.append({"size": size, "mode": "throughput", "count": n, "seconds": time.perf_counter() - t0,
                    "start_s": time.time() - (time.perf_counter() - t0)})
    if ep.is_primary:
        results.send({"phases": out})
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
        for attempt in range(100):      # until the server process listens
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except ConnectionRefusedError:
                if attempt == 99:
                    raise
                await asyncio.sleep(0.05)

        async def rt(payload):
            writer.write(payload)
            await reader.readexactly(len(payload))
    for size in sizes:
        payload = os.urandom(min(size, UDP_MAX) if kind == "udp" else size)
        lat = []
        for _ in range(count + WARMUP):
            t0 = time.perf_counter()
            await rt(payload)
            lat.append((t0, time.perf_counter() - t0))
        out.append({"size": size, "mode": "latency", **samples(lat[WARMUP:])})
    return out


def run_baseline(kind: str, sizes: list[int], count: int) -> list[dict]:
    port = free_ports(1, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)[0]
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


def samples(lat: list[tuple[float, float]]) -> dict:
    """perf_counter (start, duration) pairs as the records' wall-clock start
    and [offset, latency] pairs, both in microseconds."""
    first = lat[0][0]
    return {"start_s": time.time() - (time.perf_counter() - first),
            "samples": [(round((t - first) * 1e6, 1), round(d * 1e6, 1)) for t, d in lat]}


def messaging(ctx, sizes: list[int], replicas: list[int], count: int):
    ctx.plan(2 + len(replicas))
    for kind, backend in (("udp", "plain"), ("tcp", "tcp")):
        for p in run_baseline(kind, sizes, count):
            ctx.rec.requests("messaging/latency", p["start_s"], p["samples"], backend=backend, replicas=1,
                             clients=1, size=p["size"], net="loopback")
        ctx.step()
    for r in replicas:
        for p in run_llft(r, sizes, count)["phases"]:
            fields = dict(backend="llft", replicas=r, clients=1, size=p["size"], net="loopback")
            if p["mode"] == "latency":
                ctx.rec.requests("messaging/latency", p["start_s"], p["samples"], **fields)
            else:
                ctx.rec.window("messaging/throughput", p["count"], p["seconds"], ts=p["start_s"], **fields)
        ctx.step()
