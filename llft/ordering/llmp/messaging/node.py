"""One group member as a process on real sockets, running the client/server
workload and writing a JSON-lines delivery history:

    python -m llft.ordering.llmp.messaging.node SPEC.json

SPEC (JSON): mode ("multicast"|"unicast"), groups ([{group, port,
multicast?, members: {id: [ip, port]}}]), key (hex), group, member,
interface (ip), peer (server group, for clients), n, conns, sizes_seed,
reply_size, lossy ({seed, drop, duplicate, delay, reorder}, optional),
config (Config overrides), history (path), deadline and linger (seconds),
done_dir and done_count (optional: a drained member marks itself done in
done_dir, and stays until done_count members have, since a lagging backup of
the other group still needs our acknowledgments to free what it logged).

Each delivery is a line {"s": stream, "i": index, "n": size, "t": seconds}; the last line is
{"final": true, "drained": ..., "timeout": ..., "stats": ...}.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path

from llft.auth import Keyring
from llft.ordering.llmp.messaging.clock import LoopClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.lossy import LossPolicy, LossyTransport
from llft.ordering.llmp.messaging.workload import ReplicaApp, mixed_sizes
from llft.transport import Directory, GroupAddress, UdpTransport, loop_name, new_event_loop


def directory_from(spec: dict) -> Directory:
    return Directory([GroupAddress(g["group"], g["port"], g.get("multicast"),
                                   {int(k): tuple(v) for k, v in g["members"].items()})
                      for g in spec["groups"]], spec["mode"])


async def open_member(spec: dict) -> GroupEndpoint:
    """A started endpoint for spec's (group, member) on real sockets."""
    loop = asyncio.get_running_loop()
    clock = LoopClock(loop)
    directory = directory_from(spec)
    group, member = spec["group"], spec["member"]
    ids = sorted(directory.groups[group].members)
    view = View(group, primary=ids[0], precedences={m: i + 1 for i, m in enumerate(ids)})
    ep = GroupEndpoint(view, member, clock, None, Keyring(bytes.fromhex(spec["key"])),
                       Config(**spec.get("config", {})))
    udp = await UdpTransport.open(directory, group, member, ep.datagram_received,
                                  spec.get("interface", "0.0.0.0"), loop)
    lossy = spec.get("lossy")
    ep.transport = LossyTransport(udp, LossPolicy(**lossy), clock) if lossy else udp
    ep.udp = udp
    return ep.start()


def everyone_done(spec: dict) -> bool:
    if "done_dir" not in spec:
        return True
    return len(list(Path(spec["done_dir"]).iterdir())) >= spec["done_count"]


async def run_member(spec: dict) -> dict:
    ep = await open_member(spec)
    loop = asyncio.get_running_loop()
    n, conns, reply = spec["n"], spec.get("conns", 1), spec.get("reply_size", 40)
    app = ReplicaApp(ep, f"{spec['group']}.{spec['member']}", reply_size=reply)
    if "peer" in spec:
        cids = [ep.connect(spec["peer"], k + 1) for k in range(conns)]
        app.todo = ReplicaApp.requests(cids, mixed_sizes(n, spec.get("sizes_seed", 1)))
        expected = n if reply is not None else 0
    else:
        expected = n
    out = open(spec["history"], "w")
    t0 = time.monotonic()
    app.on_delivery = lambda s, i, conn, p: out.write(
        f'{{"s":{s},"i":{i},"n":{len(p)},"t":{time.monotonic() - t0:.4f}}}\n')

    wake = asyncio.Event()
    ep.on_ready = wake.set
    ep.on_writable = lambda conn: wake.set()
    start = time.monotonic()
    deadline = start + spec.get("deadline", 120)
    done_at = None
    while time.monotonic() < deadline:
        app.step()
        finished = len(app.history) >= expected and not app.todo
        drained = finished and not any(ep.buffers().values())
        if drained and done_at is None:
            done_at = time.monotonic()
            if "done_dir" in spec:
                Path(spec["done_dir"], f"{spec['group']}-{spec['member']}").touch()
        if done_at is not None and time.monotonic() - done_at >= spec.get("linger", 3.0) and everyone_done(spec):
            break   # stay a while: peers may still need our acks and retransmissions
        wake.clear()
        try:
            await asyncio.wait_for(wake.wait(), 0.002)
        except asyncio.TimeoutError:
            pass
    result = {"final": True, "drained": not any(ep.buffers().values()),
              "timeout": time.monotonic() >= deadline, "delivered": len(app.history),
              "elapsed": (done_at or time.monotonic()) - start, "loop": loop_name(loop),
              "orders": len(app.orders), "attached": len(app.attached),
              "order_digest": hash_blobs(app.orders if not ep.is_primary else app.attached),
              "stats": ep.stats(), "udp_errors": ep.udp.errors}
    out.write(json.dumps(result) + "\n")
    out.close()
    ep.close()
    ep.udp.close()
    return result


def hash_blobs(blobs: list[bytes]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for b in blobs:
        h.update(len(b).to_bytes(4, "big") + b)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(run_member(spec))
    finally:
        loop.close()
    return 0 if result["drained"] and not result["timeout"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
