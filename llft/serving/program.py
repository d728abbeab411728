"""Reaching the program's virtual listener: the abstract AF_UNIX name the
preload library publishes in a replica's control block for each port the
program listens on."""
from __future__ import annotations

import asyncio
import socket

CONNECT_RETRY_S = 0.005


async def listener_name(replica, port: int) -> str | None:
    """The name replica's program listens on for port, once it does; None
    if the replica is gone first."""
    while replica.alive():
        for p, _family, name in replica.stream.listeners():
            if p == port:
                return name
        await asyncio.sleep(CONNECT_RETRY_S)
    return None


async def connect_to_program(replica, port: int) -> socket.socket | None:
    """A non-blocking AF_UNIX stream socket connected to replica's listener
    for port (waiting until the program listens), or None if the replica is
    gone first."""
    while True:
        name = await listener_name(replica, port)
        if name is None:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            # Connected here, not by open_unix_connection: uvloop takes a
            # path as a C string, which cuts an abstract name short.
            await asyncio.get_running_loop().sock_connect(sock, "\0" + name)
            return sock
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            await asyncio.sleep(CONNECT_RETRY_S)  # not listening yet at this replica
