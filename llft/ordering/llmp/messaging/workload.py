"""A deterministic client/server application run at every member of two
groups, used by the simulated-network tests, the multi-process netns test
and the benchmark.  Clients send numbered requests; servers reply to each.
Every member runs the same code; backups' sends are only logged by the
endpoint, exactly as an application under LLFT would behave."""
from __future__ import annotations

import random

from llft.ordering.llmp.messaging.history import make_payload, parse_payload

REPLY_STREAM = 100


def mixed_sizes(n: int, seed: int, large: int = 1 << 20) -> list[int]:
    """Mostly small messages, 3% that need a few dozen fragments, and (from
    1000 messages on) one of `large` bytes in the middle."""
    r = random.Random(seed)
    out = [r.randint(2000, 64 << 10) if r.random() < 0.03 else r.randint(16, 1200) for _ in range(n)]
    if n >= 1000:
        out[n // 2] = large
    return out


class ReplicaApp:
    def __init__(self, ep, name: str, requests=(), reply_size: int | None = 40,
                 consume_per_step: int | None = None, order_info: bool = True):
        self.ep, self.name = ep, name
        self.todo = list(requests)            # (conn, payload, order blob) still to send
        self.reply_size = reply_size
        self.consume = consume_per_step
        self.order_info = order_info
        self.history: list[tuple[int, int]] = []
        self.orders: list[bytes] = []         # ordering blobs delivered (backups)
        self.attached: list[bytes] = []       # ordering blobs attached (primary)
        self.peak: dict[str, int] = {}
        self.on_delivery = None               # fn(stream, index, conn, payload) for logs

    @staticmethod
    def requests(conns, sizes) -> list:
        """Request i goes on conns[i % len(conns)] as stream i % len(conns)."""
        k = len(conns)
        return [(conns[i % k], make_payload(i % k, i // k, size), b"c%d" % i) for i, size in enumerate(sizes)]

    def step(self) -> None:
        ep = self.ep
        budget = self.consume if self.consume is not None else 1 << 30
        while budget > 0:
            got = ep.recv()
            if got is None:
                break
            budget -= 1
            conn, payload = got
            stream, index = parse_payload(payload)
            self.history.append((stream, index))
            if self.on_delivery is not None:
                self.on_delivery(stream, index, conn, payload)
            if stream < REPLY_STREAM and self.reply_size is not None:
                self.todo.append((conn, make_payload(REPLY_STREAM + stream, index, self.reply_size),
                                  b"s%d.%d" % (stream, index)))
        self.orders.extend(ep.recv_order())
        i = 0
        while i < len(self.todo) and ep.writable(self.todo[i][0]):
            conn, payload, oi = self.todo[i]
            i += 1
            ep.send(conn, payload, order_info=oi if self.order_info else b"")
            if ep.is_primary and self.order_info:
                self.attached.append(oi)
        del self.todo[:i]
        bufs = ep.buffers()
        bufs["held"] = bufs["received"] + bufs["delivered"]
        for k, v in bufs.items():
            self.peak[k] = max(self.peak.get(k, 0), v)
