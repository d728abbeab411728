"""Shared harness for messaging tests: two groups on a simulated network,
a deterministic client/server workload at every member, and the checks."""
from __future__ import annotations

from dataclasses import dataclass, field

from llft.auth import Keyring
from llft.messaging.clock import SimClock
from llft.messaging.config import Config
from llft.messaging.endpoint import GroupEndpoint
from llft.messaging.history import CheckFailed, check_streams, make_payload, parse_payload
from llft.messaging.lossy import LossPolicy
from llft.messaging.simnet import SimNetwork, make_group

CLIENT, SERVER = 10, 20
KEY = Keyring(b"k" * 32)


@dataclass
class Workload:
    sizes: list[int]                  # request i has size sizes[i]
    conns: int = 1
    reply_size: int | None = 40       # None: one-way
    consume_per_tick: int | None = None  # slow receiver: messages consumed per app tick
    backup_lag: float = 0.0           # backups' application runs this much later
    order_info: bool = True


@dataclass
class Member:
    ep: GroupEndpoint
    name: str
    todo: list = field(default_factory=list)     # (conn, payload, order_info) still to send
    history: list = field(default_factory=list)  # (stream, index) delivered
    orders: list = field(default_factory=list)   # ordering blobs delivered (backups)
    attached: list = field(default_factory=list)  # ordering blobs attached (primary)
    peak: dict = field(default_factory=dict)


class SimCluster:
    APP_TICK = 0.001

    def __init__(self, seed: int, policy: LossPolicy, work: Workload, config: Config | None = None,
                 sizes=(3, 3), endpoint_cls=None):
        self.clock = SimClock()
        self.net = SimNetwork(self.clock, policy)
        self.config = config or Config()
        self.work = work
        mk = lambda g, n: make_group(self.net, g, n, KEY, self.config, endpoint_cls)
        self.clients = [Member(ep, f"C{i}") for i, ep in enumerate(mk(CLIENT, sizes[0]))]
        self.servers = [Member(ep, f"S{i}") for i, ep in enumerate(mk(SERVER, sizes[1]))]
        n = len(work.sizes)
        for m in self.clients:
            cids = [m.ep.connect(SERVER, k + 1) for k in range(work.conns)]
            for i, size in enumerate(work.sizes):
                k = i % work.conns
                m.todo.append((cids[k], make_payload(k, i // work.conns, size), b"c%d" % i))
        # expected deliveries per stream: requests on stream k, replies on stream 100+k
        self.expected = {k: len(range(k, n, work.conns)) for k in range(work.conns)}
        if work.reply_size is not None:
            self.expected.update({100 + k: v for k, v in self.expected.items()})
        for m in self.members:
            lag = work.backup_lag if not m.ep.is_primary else 0.0
            self.clock.call_later(lag, self._app, m)

    @property
    def members(self) -> list[Member]:
        return self.clients + self.servers

    def _app(self, m: Member) -> None:
        ep, w = m.ep, self.work
        budget = w.consume_per_tick if w.consume_per_tick is not None else 1 << 30
        while budget > 0:
            got = ep.recv()
            if got is None:
                break
            budget -= 1
            conn, payload = got
            stream, index = parse_payload(payload)
            m.history.append((stream, index))
            if ep.group == SERVER and w.reply_size is not None:
                m.todo.append((conn, make_payload(100 + stream, index, w.reply_size), b"s%d.%d" % (stream, index)))
        m.orders.extend(ep.recv_order())
        while m.todo and ep.writable(m.todo[0][0]):
            conn, payload, oi = m.todo.pop(0)
            ep.send(conn, payload, order_info=oi if w.order_info else b"")
            if ep.is_primary and w.order_info:
                m.attached.append(oi)
        for k, v in ep.buffers().items():
            m.peak[k] = max(m.peak.get(k, 0), v)
        self.clock.call_later(self.APP_TICK, self._app, m)

    def delivered_all(self) -> bool:
        return (all(len(m.history) == sum(self.expected[k] for k in range(self.work.conns)) for m in self.servers)
                and all(len(m.history) == sum(v for k, v in self.expected.items() if k >= 100) for m in self.clients)
                and not any(m.todo for m in self.members))

    def drained(self) -> bool:
        return all(not any(m.ep.buffers().values()) for m in self.members)

    def run(self, limit: float = 120.0, settle: float = 1.0) -> None:
        """Run until everything is delivered, then until buffers drain."""
        step, t = 0.05, 0.0
        while t < limit and not self.delivered_all():
            t += step
            self.clock.run_until(t)
        while t < limit and not self.drained():
            t += step
            self.clock.run_until(t)
        self.clock.run_until(t + settle)

    def check(self) -> None:
        """Exactly once, in order, at every member; ordering info intact;
        every buffer empty."""
        streams = {m.name: set(k for k in self.expected if k < 100) for m in self.servers}
        streams.update({m.name: set(k for k in self.expected if k >= 100) for m in self.clients})
        check_streams(self.expected, {m.name: m.history for m in self.members}, streams)
        for group in (self.clients, self.servers):
            want = group[0].attached
            for b in group[1:]:
                if b.orders != want:
                    raise CheckFailed(f"{b.name} ordering info: {len(b.orders)} blobs, primary attached {len(want)}")
        for m in self.members:
            left = {k: v for k, v in m.ep.buffers().items() if v}
            if left:
                raise CheckFailed(f"{m.name} buffers not drained: {left}")
