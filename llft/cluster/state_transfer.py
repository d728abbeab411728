"""A newcomer's state, from the primary to the newcomer alone, over TCP.

AcceptBackup goes to every member (each learns of the newcomer and
acknowledges); the state it admits the newcomer with (megabytes of
history) does not: multicast to every member, its fragments kept every
member's event loop busy reassembling and authenticating them, backups
went unheard past their fault timeouts and were suspected.  So the
primary offers the state on a TCP port of its own, AcceptBackup names
the port, a one-time token and the state's SHA-256, and the newcomer
fetches it; TCP paces it, and nobody else sees it.

The port is open only while an admission is pending, and gives nothing
without a token from an authenticated AcceptBackup; what the newcomer
receives is checked against the digest that AcceptBackup carries, so a
forged or damaged state is refused, not replayed."""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
import struct

TOKEN_BYTES = 16
LENGTH = struct.Struct("!Q")
TOKEN_WAIT_S = 5.0       # a connection that sends no token this soon is closed
DROP_REFUSED = "state-transfer-refused"


class StateTransferError(Exception):
    pass


class StateOffers:
    """At the primary: the states of pending admissions, one token each."""

    def __init__(self, interface: str, drops):
        self.interface = interface
        self.drops = drops
        self.offers: dict[bytes, bytes] = {}      # token -> state
        self.sock: socket.socket | None = None
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.served = 0

    def open(self) -> None:
        """Listens, once (synchronously: the port goes into the
        AcceptBackup being built; a connection that comes before the
        server runs waits in the backlog)."""
        if self.sock is not None:
            return
        self.sock = socket.create_server((self.interface, 0), backlog=16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._starting = asyncio.get_running_loop().create_task(self._start(self.sock))

    async def _start(self, sock: socket.socket) -> None:
        self.server = await asyncio.start_server(self._serve, sock=sock)

    def offer(self, state: bytes, sha256: bytes | None = None) -> dict:
        """Offers one state (its SHA-256 computed already, or here); returns
        what AcceptBackup says of it."""
        token = secrets.token_bytes(TOKEN_BYTES)
        self.offers[token] = state
        return {"port": self.port, "token": token, "size": len(state),
                "sha256": sha256 or hashlib.sha256(state).digest()}

    def withdraw(self, description: dict) -> None:
        self.offers.pop(description.get("token"), None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), TOKEN_WAIT_S)
            state = self.offers.get(token)
            if state is None:
                self.drops.count(DROP_REFUSED)
                return
            writer.write(LENGTH.pack(len(state)))
            writer.write(state)
            await writer.drain()
            self.served += 1
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            self.drops.count(DROP_REFUSED)
        finally:
            writer.close()

    def close(self) -> None:
        self.offers.clear()
        if self.sock is None:
            return
        self._starting.cancel()
        if self.server is not None:
            self.server.close()
        self.sock.close()
        self.sock = self.server = None


async def fetch_state(host: str, description, timeout: float) -> bytes:
    """At the newcomer: the state an AcceptBackup describes, from the
    primary at `host`, checked against its digest."""
    try:
        port, token = int(description["port"]), description["token"]
        size, digest = int(description["size"]), description["sha256"]
        if not (isinstance(token, bytes) and len(token) == TOKEN_BYTES and isinstance(digest, bytes)
                and 0 < port < 65536 and size >= 0):
            raise ValueError("bad field")
    except (KeyError, TypeError, ValueError) as e:
        raise StateTransferError(f"the state's description is malformed ({e})") from None

    async def get() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(token)
            await writer.drain()
            (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            if length != size:
                raise StateTransferError(f"the primary sent {length} bytes of state, not the {size} announced")
            return await reader.readexactly(size)
        finally:
            writer.close()

    try:
        state = await asyncio.wait_for(get(), timeout)
    except asyncio.TimeoutError:
        raise StateTransferError(f"the state did not arrive from {host} port {port} within {timeout:g} s") from None
    except (asyncio.IncompleteReadError, OSError) as e:
        raise StateTransferError(f"the state could not be fetched from {host} port {port}: {e}") from None
    if hashlib.sha256(state).digest() != digest:
        raise StateTransferError(f"the state from {host} port {port} does not match its digest")
    return state
