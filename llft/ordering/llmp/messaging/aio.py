"""asyncio conveniences over a GroupEndpoint: await writability and delivery."""
from __future__ import annotations

import asyncio

from llft.ordering.ids import ConnId


class AsyncMember:
    def __init__(self, ep):
        self.ep = ep
        self._ready = asyncio.Event()
        self._writable = asyncio.Event()
        ep.on_ready = self._ready.set
        ep.on_writable = lambda conn: self._writable.set()

    async def send(self, conn: ConnId, payload: bytes, order_info: bytes = b"") -> int:
        while not self.ep.writable(conn):
            self._writable.clear()
            await self._writable.wait()
        return self.ep.send(conn, payload, order_info)

    async def recv(self) -> tuple[ConnId, bytes]:
        while True:
            got = self.ep.recv()
            if got is not None:
                return got
            self._ready.clear()
            await self._ready.wait()
