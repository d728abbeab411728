"""The clients of a nemesis run: each on its own connection, one request
at a time, keeping what it was answered (history.ClientHistory).  The
nemesis can wait for their progress (faults come after the k-th reply,
not after a sleep), hold them idle, and make them close their
connections and open new ones."""
from __future__ import annotations

import threading
import time

from llft.nemesis.history import ClientHistory
from llft.nemesis.protocols import Connection

CLOCK_EVERY = 8          # a clock reading after every this many operations
REPLY_TIMEOUT_S = 60.0   # an answer that takes longer is never coming: the client fails


class Workload:
    def __init__(self, protocol: type, clients: int, host: str, port: int, pace_s: float = 0.0, setup=None):
        """setup(): run first on each client's thread (entering the
        gateway host's network namespace, across hosts)."""
        self.protocol, self.host, self.port, self.pace_s, self.setup = protocol, host, port, pace_s, setup
        self.histories = [ClientHistory(i) for i in range(clients)]
        self.cond = threading.Condition()
        self.replies = 0
        self.hold = False          # clients stop before their next request
        self.reconnect = False     # ...after closing their connection
        self.idle = 0              # clients holding
        self.stopping = False
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int):
        h = self.histories[i]
        proto = self.protocol(i)
        conn = None
        k = 0
        try:
            if self.setup is not None:
                self.setup()
            while True:
                with self.cond:
                    if self.hold:
                        if self.reconnect and conn is not None:
                            conn.close()
                            conn = None
                        self.idle += 1
                        self.cond.notify_all()
                        self.cond.wait_for(lambda: not self.hold or self.stopping)
                        self.idle -= 1
                    if self.stopping:
                        return
                if conn is None:
                    conn = Connection(self.host, self.port, REPLY_TIMEOUT_S)
                k += 1
                h.values.append(proto.op(conn, k))
                if proto.clock is not None and k % CLOCK_EVERY == 0:
                    h.clock.append(proto.clock(conn))
                with self.cond:
                    self.replies += 1
                    self.cond.notify_all()
                if self.pace_s:
                    time.sleep(self.pace_s)
        except Exception as e:   # noqa: BLE001 - any failure of a client is a finding, kept with its history
            h.errors.append(f"{type(e).__name__}: {e}")
            with self.cond:
                self.cond.notify_all()
        finally:
            if conn is not None:
                conn.close()

    def failed(self) -> bool:
        return any(h.errors for h in self.histories)

    def wait_replies(self, n: int, timeout: float) -> bool:
        """Until the clients have had n more replies (False: not in time,
        or a client failed)."""
        with self.cond:
            target = self.replies + n
            return self.cond.wait_for(lambda: self.replies >= target or self.failed(), timeout) and not self.failed()

    def pause(self, close_connections: bool, timeout: float) -> bool:
        """Every client holding, not in a request (and with its connection
        closed, if asked)."""
        with self.cond:
            self.hold, self.reconnect = True, close_connections
            live = sum(1 for t, h in zip(self.threads, self.histories) if t.is_alive() and not h.errors)
            return self.cond.wait_for(lambda: self.idle >= live or self.failed(), timeout)

    def resume(self):
        with self.cond:
            self.hold = self.reconnect = False
            self.cond.notify_all()

    def stop(self, timeout: float = REPLY_TIMEOUT_S) -> list[ClientHistory]:
        with self.cond:
            self.stopping = self.hold = True
            self.cond.notify_all()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                self.histories[self.threads.index(t)].errors.append("no answer at the end")
        return self.histories
