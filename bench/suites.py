"""Every workload of `python -m bench run`, and its settings in each suite.

paper: the sizes, client counts, rounds and trials the README's figures
come from (tens of minutes on a 2-core machine, the cross-host part
included).  smoke: every workload that runs on one host, tiny, in about a
minute, to see that the whole chain (workloads, records, analysis)
works; the cross-host workload is left out of it (it takes minutes even
when tiny)."""
from __future__ import annotations

import importlib

# name: ("module:function", {suite: keyword arguments}); a workload absent from a
# suite is not run in it.  Modules are imported when their workload runs: the
# cross-host one needs the tests' network-namespace harness, the others do not.
WORKLOADS = {
    "determinizer": ("determinizer:determinizer", {
        "paper": dict(ops=100_000, reps=5, rounds=9),
        "smoke": dict(ops=2_000, reps=1, rounds=1)}),
    "messaging": ("messaging:messaging", {
        "paper": dict(sizes=[16, 256, 1024, 4096, 16384, 65536], replicas=[1, 3], count=1000),
        "smoke": dict(sizes=[16, 1024], replicas=[1], count=50)}),
    "latency": ("serving:latency", {
        "paper": dict(sizes=[16, 256, 1024, 4096, 16384, 65536], replicas=3, rounds=5, count=1000),
        "smoke": dict(sizes=[16, 1024], replicas=3, rounds=1, count=100)}),
    "throughput": ("serving:throughput", {
        "paper": dict(clients=[1, 2, 4, 8, 16, 32], replicas=3, rounds=5, secs=1.0),
        "smoke": dict(clients=[1, 4], replicas=3, rounds=1, secs=0.3)}),
    "replicas": ("serving:replicas", {
        "paper": dict(counts=[1, 2, 3, 4, 5], rounds=5, count=1000),
        "smoke": dict(counts=[2, 3], rounds=1, count=100)}),
    "nondet": ("serving:nondet", {
        "paper": dict(ops=[0, 1, 10, 100, 1000], replicas=3, rounds=5, count=1000),
        "smoke": dict(ops=[0, 100], replicas=3, rounds=1, count=100)}),
    "redis": ("serving:redis_sets", {
        "paper": dict(replicas=3, rounds=5, requests=20000),
        "smoke": dict(replicas=3, rounds=1, requests=2000)}),
    "memcached": ("serving:memcached_sets", {
        "paper": dict(replicas=3, rounds=5, requests=2000),
        "smoke": dict(replicas=3, rounds=1, requests=100)}),
    "view_change": ("failover:failovers", {
        "paper": dict(plan="view_change", trials=5, replicas=[2, 3, 4, 5]),
        "smoke": dict(plan="view_change", trials=1, replicas=[2])}),
    "recovery": ("failover:failovers", {
        "paper": dict(plan="recovery", trials=5, replicas=[2, 3], clients=[1, 2, 4, 8, 16]),
        "smoke": dict(plan="recovery", trials=1, replicas=[2], clients=[2])}),
    "detect": ("failover:failovers", {
        "paper": dict(plan="detect", trials=5),
        "smoke": dict(plan="detect", trials=1)}),
    "orders": ("serving:orders", {
        "paper": dict(replicas=3, rounds=5, count=1000),
        "smoke": dict(replicas=3, rounds=1, count=100)}),
    "fork_modes": ("serving:fork_modes", {
        "paper": dict(replicas=3, rounds=5, count=1000),
        "smoke": dict(replicas=3, rounds=1, count=100)}),
    "order_failover": ("failover:failovers", {
        "paper": dict(plan="orders", trials=5, replicas=[3], clients=[2]),
        "smoke": dict(plan="orders", trials=1, replicas=[3], clients=[1])}),
    "memory": ("memory:memory", {
        "paper": dict(connections=100_000, step=10_000),
        "smoke": dict(programs=("pool_server",), connections=400, step=200)}),
    "checkpoint": ("checkpoint:checkpoint", {
        "paper": dict(sizes_mib=(10, 100, 1024), trials=3),
        "smoke": dict(sizes_mib=(10,), trials=1)}),
    "semi_passive": ("semi_passive:semi_passive", {
        "paper": dict(intervals=(0.2, 0.5, 1.0, 2.0), clients=4, rounds=3, secs=2.0, trials=3),
        "smoke": dict(intervals=(0.5,), clients=2, rounds=1, secs=0.3, trials=1)}),
    "cluster_join": ("cluster_join:cluster_join", {
        "paper": dict(sizes_mib=(10, 100), trials=3)}),
    "cluster": ("cluster:cluster", {
        "paper": dict(quick=False, trials=5, other_timeout=60.0)}),
}
SUITES = ("paper", "smoke")


def plan(suite: str, only: list[str] | None = None) -> list[tuple[str, object, dict]]:
    """[(workload, function, arguments)] of a suite, in the order they run."""
    unknown = set(only or ()) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workload {', '.join(sorted(unknown))}; known: {', '.join(WORKLOADS)}")
    return [(name, function(fn), settings[suite]) for name, (fn, settings) in WORKLOADS.items()
            if suite in settings and (not only or name in only)]


def function(name: str):
    module, fn = name.split(":")
    return getattr(importlib.import_module(f"bench.{module}"), fn)
