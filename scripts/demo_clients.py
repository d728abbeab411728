"""Clients for the demo's failover part (scripts/demo.sh): CLIENTS
connections to examples/kv_server through llft, each sending INCR counter
COUNT times, one request at a time; AFTER seconds in, `llft-kill
--primary` crashes the primary.  Then it checks what a client of a fault
tolerant server may expect: every connection stayed up, and the counter
values the clients were answered are 1..CLIENTS*COUNT, each exactly once
(no acknowledged increment lost, none applied twice).

usage: python scripts/demo_clients.py PORT RUN_DIR [CLIENTS COUNT AFTER]"""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def client(port: int, count: int, seen: list, errors: list):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            f = s.makefile("rwb")
            for _ in range(count):
                f.write(b"INCR counter\n")
                f.flush()
                seen.append(int(f.readline().split()[1]))
                time.sleep(0.001)
    except (OSError, IndexError, ValueError) as e:
        errors.append(repr(e))


def main() -> int:
    port, run_dir = int(sys.argv[1]), Path(sys.argv[2])
    clients, count, after = (int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 \
        else (4, 500, 0.2)
    seen: list[list[int]] = [[] for _ in range(clients)]
    errors: list[str] = []
    threads = [threading.Thread(target=client, args=(port, count, seen[i], errors)) for i in range(clients)]
    print(f"{clients} clients connected to port {port}, each sending 'INCR counter' {count} times")
    for t in threads:
        t.start()
    time.sleep(after)
    kill = subprocess.run([str(Path(sys.executable).with_name("llft-kill")), "--run-dir", str(run_dir),
                           "--primary"], capture_output=True, text=True)
    print(f"after {after} s, {sum(map(len, seen))} replies in: {(kill.stdout or kill.stderr).strip()}")
    for t in threads:
        t.join()
    values = sorted(v for vs in seen for v in vs)
    expected = list(range(1, clients * count + 1))
    if errors:
        print(f"FAILED: a client lost its connection: {errors[0]}")
        return 1
    if values != expected:
        print(f"FAILED: the clients saw {len(values)} values, {len(set(values))} distinct, not 1..{len(expected)}")
        return 1
    print(f"every client kept its connection; the answers were 1..{len(expected)}, each exactly once:"
          " nothing acknowledged was lost or applied twice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
