"""The real servers the benchmarks replicate (Debian's redis-server and
memcached) and their load tools (redis-benchmark, memcslap), for one host
(bench/serving.py) and across network-namespace hosts (bench/cluster.py:
`prefix` runs the tool in another namespace, `host` is the server's)."""
from __future__ import annotations

import re
import shutil
import subprocess
import time


def have_redis() -> bool:
    return bool(shutil.which("redis-server") and shutil.which("redis-benchmark"))


def have_memcached() -> bool:
    return bool(shutil.which("memcached") and shutil.which("memcslap"))


def redis(port, bind: str = "127.0.0.1") -> list[str]:
    return [shutil.which("redis-server"), "--port", str(port), "--save", "", "--appendonly", "no",
            "--bind", bind, "--protected-mode", "no"]


def memcached(port, bind: str = "127.0.0.1") -> list[str]:
    # Without its LRU background threads, which race on atomics (docs/serving.md, "memcached").
    return [shutil.which("memcached"), "-t", "4", "-p", str(port), "-U", "0", "-l", bind, "-u", "root",
            "-o", "no_lru_crawler,no_lru_maintainer"]


def redis_rps(port, clients: int, n: int, host: str = "127.0.0.1", prefix=()) -> dict[str, float]:
    """redis-benchmark SET and GET: requests per second of each."""
    out = subprocess.run([*prefix, "redis-benchmark", "-h", host, "-p", str(port), "-c", str(clients), "-n", str(n),
                          "-t", "set,get", "--csv"], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r'"(\w+)","([\d.]+)"', line)
        if m:
            rows[m.group(1)] = float(m.group(2))
    return rows


def memcslap_rps(port, clients: int, n: int, host: str = "127.0.0.1", prefix=()) -> float:
    """memcslap sets (binary protocol), n per client: sets per second."""
    start = time.monotonic()
    subprocess.run([*prefix, shutil.which("memcslap"), f"--servers={host}:{port}", f"--concurrency={clients}",
                    f"--execute-number={n}", "--test=set", "--binary"], capture_output=True, check=True)
    return clients * n / (time.monotonic() - start)
