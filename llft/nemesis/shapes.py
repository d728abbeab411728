"""The servers the nemesis runs, each with the protocol its clients speak:
the project's example servers (blocking, poll, epoll, a worker pool, a
thread per connection, one that daemonizes first), Debian's redis and
memcached, and Python's ThreadingHTTPServer."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from llft.nemesis.protocols import HttpProtocol, KvProtocol, LineProtocol, MemcachedProtocol, RedisProtocol


@dataclass(frozen=True)
class Shape:
    name: str
    protocol: type
    needs: str             # an example program's name, or a command on PATH ("" for Python)

    def argv(self, port: int, examples: Path) -> list[str]:
        if self.name in EXAMPLE_SHAPES:
            return [str(examples / self.needs), str(port)]
        if self.name == "redis":
            return [shutil.which("redis-server"), "--port", str(port), "--save", "", "--appendonly", "no"]
        if self.name == "memcached":
            # Its LRU threads share item state through atomics outside any
            # lock: off here (docs/serving.md, "memcached").
            root = ["-u", "root"] if os.geteuid() == 0 else []   # (it refuses to run as root otherwise)
            return [shutil.which("memcached"), "-A", "-p", str(port), "-U", "0", "-t", "4", *root,
                    "-o", "no_lru_crawler,no_lru_maintainer"]
        return [sys.executable, "-m", "llft.nemesis.http_counter", str(port)]

    def missing(self, examples: Path) -> str | None:
        """Why this shape cannot run here, or None."""
        if self.name in EXAMPLE_SHAPES:
            return None if (examples / self.needs).is_file() else f"{examples / self.needs} not built (make -C examples)"
        if self.needs and not shutil.which(self.needs):
            return f"{self.needs} not installed"
        return None


EXAMPLE_SHAPES = {"echo": "echo_server", "poll": "poll_server", "epoll": "epoll_server", "pool": "pool_server",
                  "kv": "kv_server", "daemon": "daemon_server"}
SHAPES = {s.name: s for s in [
    Shape("echo", LineProtocol, "echo_server"),
    Shape("poll", LineProtocol, "poll_server"),
    Shape("epoll", LineProtocol, "epoll_server"),
    Shape("pool", LineProtocol, "pool_server"),
    Shape("kv", KvProtocol, "kv_server"),
    Shape("daemon", LineProtocol, "daemon_server"),
    Shape("redis", RedisProtocol, "redis-server"),
    Shape("memcached", MemcachedProtocol, "memcached"),
    Shape("http", HttpProtocol, ""),
]}
