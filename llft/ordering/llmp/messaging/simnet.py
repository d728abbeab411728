"""A simulated network with a virtual clock: every member of every group on
one SimClock, datagrams multicast to a group's members with independent,
seeded loss, duplication, delay and reordering per receiver.  Runs the real
protocol code (GroupEndpoint, Codec) unchanged; only sockets are replaced."""
from __future__ import annotations

from typing import Callable

from llft.auth import Keyring
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.ids import View
from llft.ordering.llmp.messaging.lossy import LossPolicy


class SimNetwork:
    def __init__(self, clock: SimClock, policy: LossPolicy | None = None):
        self.clock = clock
        self.policy = policy or LossPolicy(delay=0.0005)
        self.members: dict[int, list[Callable[[bytes], None]]] = {}
        self.datagrams = 0

    def join(self, group: int, receive: Callable[[bytes], None]) -> None:
        self.members.setdefault(group, []).append(receive)

    def send_group(self, group: int, datagrams: list[bytes]) -> None:
        for receive in self.members.get(group, ()):
            for d in datagrams:
                self.datagrams += 1
                for delay in self.policy.plan(d, group):
                    self.clock.call_later(delay, receive, d)


def make_group(net: SimNetwork, group: int, size: int, keyring: Keyring,
               config: Config | None = None, endpoint_cls=None) -> list:
    """`size` members of `group`, member 0 the primary, precedences 1..size."""
    from llft.ordering.llmp.messaging.endpoint import GroupEndpoint
    cls = endpoint_cls or GroupEndpoint
    members = []
    for m in range(size):
        view = View(group, primary=0, precedences={i: i + 1 for i in range(size)})
        ep = cls(view, m, net.clock, net, keyring, config)
        net.join(group, ep.datagram_received)
        members.append(ep.start())
    return members
