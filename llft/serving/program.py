"""Reaching the program's virtual listener: the abstract AF_UNIX name the
preload library publishes in a replica's control block for each port the
program listens on."""
from __future__ import annotations

import asyncio
import logging
import socket
import time

log = logging.getLogger("llft.program")

CONNECT_RETRY_S = 0.005
WRONG_PORT_NOTICE_S = 3.0
BACKLOG_RETRY_S = 0.001   # the program accepts: its queue has room again soon


async def listener_name(replica, port: int) -> str | None:
    """The name replica's program listens on for port, once it does; None
    if the replica is gone first."""
    since, told = time.monotonic(), False
    while replica.alive():
        ports = replica.stream.listeners()
        for p, _family, name in ports:
            if p == port:
                return name
        if ports and not told and time.monotonic() - since > WRONG_PORT_NOTICE_S:
            told = True   # (a gateway's --program-port, most likely)
            log.warning("a client connection for port %d waits: the program listens on %s, not on %d",
                        port, ", ".join(str(p) for p, _f, _n in ports), port)
        await asyncio.sleep(CONNECT_RETRY_S)
    return None


async def connect_to_program(replica, port: int) -> socket.socket | None:
    """A non-blocking AF_UNIX stream socket connected to replica's listener
    for port (waiting until the program listens, and while its accept queue
    is full), or None if the replica is gone first."""
    while True:
        name = await listener_name(replica, port)
        if name is None:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            # A stream AF_UNIX connect completes at once or fails with
            # EAGAIN: the program's accept queue is full (its listen
            # backlog; socketserver's is 5), as at a backup that lags.
            # Not the event loop's sock_connect: both asyncio's and
            # uvloop's take that EAGAIN for "in progress" and hand back a
            # socket that never connected, and the replica then missed the
            # connection and diverged at its next accept.
            sock.connect("\0" + name)
            return sock
        except BlockingIOError:
            sock.close()
            await asyncio.sleep(BACKLOG_RETRY_S)
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            await asyncio.sleep(CONNECT_RETRY_S)  # not listening yet at this replica
