"""Seeded fault injection for datagrams: drop, duplicate, delay, reorder and
targeted drops.  The same policy drives the simulated network and the
`LossyTransport` wrapper around real sockets."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

# A targeted drop: (datagram, destination group) -> drop it?
Target = Callable[[bytes, int], bool]


@dataclass
class LossPolicy:
    seed: int = 0
    drop: float = 0.0           # probability a copy is lost
    duplicate: float = 0.0      # probability of one extra copy
    delay: float = 0.0          # base one-way delay, seconds
    reorder: float = 0.0        # extra uniform random delay in [0, reorder): reorders within that window
    targets: list[Target] = field(default_factory=list)
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.stats = {"dropped": 0, "duplicated": 0, "targeted": 0}

    def plan(self, datagram: bytes, dst_group: int) -> list[float]:
        """Delays of the copies to deliver (empty: dropped)."""
        for t in self.targets:
            if t(datagram, dst_group):
                self.stats["targeted"] += 1
                return []
        r = self.rng
        copies = 2 if self.duplicate and r.random() < self.duplicate else 1
        if copies == 2:
            self.stats["duplicated"] += 1
        out = []
        for _ in range(copies):
            if self.drop and r.random() < self.drop:
                self.stats["dropped"] += 1
                continue
            out.append(self.delay + (r.random() * self.reorder if self.reorder else 0.0))
        return out


def message_matches(predicate: Callable) -> Target:
    """A target that decodes unfragmented datagrams and applies `predicate`
    to the message, e.g. drop every Nack: `message_matches(lambda m: m.TYPE == MsgType.NACK)`."""
    import struct

    from llft.ordering.llmp import wire

    def target(datagram: bytes, dst_group: int) -> bool:
        try:
            hs = wire.FRAME_HEADER.size
            _, _, _, _, _, _, count = wire.FRAME_HEADER.unpack_from(datagram)
            if count != 1:
                return False
            return bool(predicate(wire.decode_message(datagram[hs:-wire.MAC_LEN])))
        except (wire.DropError, struct.error):
            return False
    return target


class LossyTransport:
    """Wraps anything with `send_group(group, datagrams)` (a UdpTransport,
    a SimNetwork) and applies a LossPolicy to each datagram, delaying with
    the given clock.  On real sockets this adds the duplication and
    reordering the kernel here cannot (no netem)."""

    def __init__(self, inner, policy: LossPolicy, clock):
        self.inner, self.policy, self.clock = inner, policy, clock

    def send_group(self, group: int, datagrams: list[bytes]) -> None:
        for d in datagrams:
            for delay in self.policy.plan(d, group):
                if delay <= 0:
                    self.inner.send_group(group, [d])
                else:
                    self.clock.call_later(delay, self.inner.send_group, group, [d])
