"""Shared harness for messaging tests: two groups on a simulated network,
the deterministic client/server workload at every member, and the checks."""
from __future__ import annotations

from dataclasses import dataclass

from llft.auth import Keyring
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.history import CheckFailed, check_streams
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.messaging.workload import REPLY_STREAM, ReplicaApp

CLIENT, SERVER = 10, 20
KEY = Keyring(b"k" * 32)


@dataclass
class Workload:
    sizes: list[int]                     # request i has size sizes[i]
    conns: int = 1
    reply_size: int | None = 40          # None: one-way
    consume_per_tick: int | None = None  # slow receiver: messages consumed per app tick
    backup_lag: float = 0.0              # backups' application starts this much later
    order_info: bool = True


class SimCluster:
    APP_TICK = 0.001

    def __init__(self, seed: int, policy: LossPolicy, work: Workload, config: Config | None = None,
                 sizes=(3, 3), endpoint_cls=None):
        self.clock = SimClock()
        self.net = SimNetwork(self.clock, policy)
        self.config = config or Config()
        self.work = work

        def group(g, n, prefix):
            eps = make_group(self.net, g, n, KEY, self.config, endpoint_cls)
            return [ReplicaApp(ep, f"{prefix}{i}", reply_size=work.reply_size,
                               consume_per_step=work.consume_per_tick, order_info=work.order_info)
                    for i, ep in enumerate(eps)]
        self.clients = group(CLIENT, sizes[0], "C")
        self.servers = group(SERVER, sizes[1], "S")
        for m in self.clients:
            m.todo = ReplicaApp.requests([m.ep.connect(SERVER, k + 1) for k in range(work.conns)], work.sizes)
        n = len(work.sizes)
        self.expected = {k: len(range(k, n, work.conns)) for k in range(work.conns)}
        if work.reply_size is not None:
            self.expected.update({REPLY_STREAM + k: v for k, v in self.expected.items()})
        for m in self.members:
            self.clock.call_later(0.0 if m.ep.is_primary else work.backup_lag, self._app, m)

    @property
    def members(self) -> list[ReplicaApp]:
        return self.clients + self.servers

    def _app(self, m: ReplicaApp) -> None:
        m.step()
        self.clock.call_later(self.APP_TICK, self._app, m)

    def _streams(self, m: ReplicaApp) -> set[int]:
        replies = m in self.clients
        return {k for k in self.expected if (k >= REPLY_STREAM) == replies}

    def delivered_all(self) -> bool:
        return all(len(m.history) == sum(self.expected[k] for k in self._streams(m)) and not m.todo
                   for m in self.members)

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
        check_streams(self.expected, {m.name: m.history for m in self.members},
                      {m.name: self._streams(m) for m in self.members})
        for group in (self.clients, self.servers):
            want = group[0].attached
            for b in group[1:]:
                if b.orders != want:
                    raise CheckFailed(f"{b.name} ordering info: {len(b.orders)} blobs, primary attached {len(want)}")
        for m in self.members:
            left = {k: v for k, v in m.ep.buffers().items() if v}
            if left:
                raise CheckFailed(f"{m.name} buffers not drained: {left}")


# --- real-socket runs: specs for llft.ordering.llmp.messaging.node and their checks ---------

def member_specs(tmpdir, addresses: dict, *, mode: str, n: int, key: bytes = b"k" * 32,
                 conns: int = 2, reply_size: int = 40, lossy: dict | None = None,
                 deadline: float = 150, linger: float = 3.0, port: int = 17400) -> list[dict]:
    """One spec per member.  addresses: {(group, member): (ip, port)}."""
    groups = []
    for g in (CLIENT, SERVER):
        members = {str(m): list(a) for (gg, m), a in addresses.items() if gg == g}
        groups.append({"group": g, "port": port + g, "members": members})
    specs = []
    done_dir = tmpdir / "done"     # members leave once all are drained (llft/ordering/llmp/messaging/node.py)
    done_dir.mkdir(exist_ok=True)
    for (g, m), (ip, _) in sorted(addresses.items()):
        spec = {"mode": mode, "groups": groups, "key": key.hex(), "group": g, "member": m,
                "interface": ip, "n": n, "conns": conns, "reply_size": reply_size,
                "sizes_seed": 7, "history": str(tmpdir / f"g{g}m{m}.jsonl"),
                "deadline": deadline, "linger": linger, "done_dir": str(done_dir), "done_count": len(addresses)}
        if g == CLIENT:
            spec["peer"] = SERVER
        if lossy:
            spec["lossy"] = dict(lossy, seed=lossy.get("seed", 0) * 100 + g + m)
        specs.append(spec)
    return specs


def check_histories(specs: list[dict]) -> dict:
    """Read every member's history and check it: each server member got
    requests 0..n-1 of each stream exactly once in order, each client member
    the replies, the ordering information is the same at every member."""
    import json
    histories, finals, streams, expected = {}, {}, {}, {}
    for spec in specs:
        name = f"g{spec['group']}m{spec['member']}"
        with open(spec["history"]) as f:
            lines = [json.loads(line) for line in f]
        if not lines or not lines[-1].get("final"):
            raise CheckFailed(f"{name}: no final line (crashed?)")
        finals[name] = lines[-1]
        histories[name] = [(x["s"], x["i"]) for x in lines[:-1]]
        n, k = spec["n"], spec["conns"]
        for s in range(k):
            expected[s] = expected[REPLY_STREAM + s] = len(range(s, n, k))
        streams[name] = {REPLY_STREAM + s if spec["group"] == CLIENT else s for s in range(k)}
    check_streams(expected, histories, streams)
    for g in (CLIENT, SERVER):
        digests = {name: f["order_digest"] for name, f in finals.items() if name.startswith(f"g{g}m")}
        if len(set(digests.values())) != 1:
            raise CheckFailed(f"group {g} ordering information differs: {digests}")
    return finals
