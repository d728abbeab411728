"""A newcomer's state, from the primary to the newcomer alone, over TCP.

AcceptBackup goes to every member (each learns of the newcomer and
acknowledges); the state it admits the newcomer with (megabytes of
history) does not: multicast to every member, its fragments kept every
member's event loop busy reassembling and authenticating them, backups
went unheard past their fault timeouts and were suspected.  So the
primary offers the state on a TCP port of its own, AcceptBackup names
the port, a one-time token and how the state is checked, and the
newcomer fetches it; TCP paces it, and nobody else sees it.

The port is open only while an admission is pending, and gives nothing
without a token from an authenticated AcceptBackup; what the newcomer
receives is checked end to end, so a forged or damaged state is refused,
not replayed.

A state in memory (a history) is checked against the SHA-256 that
AcceptBackup carries.  A state with files (a checkpoint's image, hundreds
of megabytes: FileState) is never held in memory at either end, and is
not read once more to be hashed before it is offered: the source sends
the files from disk a piece at a time, computing an HMAC-SHA256 of the
token and everything it sends with the group's key as it goes, and sends
the MAC last; the newcomer writes the files into a directory of its own as
they come, computing the same, and uses nothing it received unless the
MACs match.  Only a holder of the group's key makes a state that passes,
and the token ties it to this one offer.  On the wire:

    length of all that follows but the MAC
    length of the file table, the table (msgpack: [[name, size], ...])
    length of the header, the header (the state without the files)
    each file's bytes, in the table's order
    the MAC (32 bytes; files only)"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import shutil
import socket
import struct
import time
from pathlib import Path

import msgpack

TOKEN_BYTES = 16
LENGTH = struct.Struct("!Q")
TOKEN_WAIT_S = 5.0       # a connection that sends no token this soon is closed
DROP_REFUSED = "state-transfer-refused"
CHUNK = 1 << 20          # files are sent, received and written in pieces this big
MAC = "hmac-sha256"      # how a state with files is authenticated (its description says)
MAC_BYTES = 32


class StateTransferError(Exception):
    pass


class SpoolFailed(Exception):
    """The newcomer could not write a state's files where it keeps them (its
    disk is full, say): not the transfer's fault, and trying the same
    again would fail the same way."""


class FileState:
    """A state offered as a header and files sent from disk: the files'
    directory is the offer's until it is withdrawn (discard())."""

    def __init__(self, header: bytes, directory: Path, names: list[str]):
        self.header, self.directory, self.names = header, Path(directory), names
        sizes = [(self.directory / n).stat().st_size for n in names]
        self.table = msgpack.packb([[n, s] for n, s in zip(names, sizes)])
        self.size = 2 * LENGTH.size + len(self.table) + len(header) + sum(sizes)

    def _prefix(self) -> bytes:
        return LENGTH.pack(len(self.table)) + self.table + LENGTH.pack(len(self.header)) + self.header

    async def send(self, writer: asyncio.StreamWriter, mac) -> None:
        """The files read and MACed aside, a piece at a time, at the pace TCP
        takes them (uvloop, the members' loop, has no loop.sendfile); then
        the MAC."""
        prefix = self._prefix()
        mac.update(prefix)
        writer.write(prefix)
        await writer.drain()
        for n in self.names:
            with open(self.directory / n, "rb") as f:
                while chunk := await asyncio.to_thread(_read_and_mac, f, mac):
                    writer.write(chunk)
                    await writer.drain()
        writer.write(mac.digest())

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _read_and_mac(f, mac) -> bytes:
    chunk = f.read(CHUNK)
    mac.update(chunk)
    return chunk


def _mac(key: bytes, token: bytes):
    """The MAC of one offer's state with files: keyed by the group, bound to the token."""
    return hmac.new(key, token, hashlib.sha256)


def discard(state) -> None:
    """A state no offer holds any more: its files go."""
    if isinstance(state, FileState):
        state.discard()


class StateOffers:
    """At the primary (or the backup checkpointed for a newcomer): the
    states of pending admissions, one token each; key: the group's, which
    authenticates states with files."""

    def __init__(self, interface: str, drops, key: bytes | None = None):
        self.interface = interface
        self.drops = drops
        self.key = key
        self.offers: dict[bytes, bytes | FileState] = {}      # token -> state
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

    def offer(self, state: bytes | FileState) -> dict:
        """Offers one state; returns what AcceptBackup says of it (a state
        in memory: with its SHA-256; with files: how it is MACed)."""
        if isinstance(state, FileState) and not self.key:
            raise ValueError("a state with files is offered only with the group's key")
        token = secrets.token_bytes(TOKEN_BYTES)
        self.offers[token] = state
        if isinstance(state, FileState):
            return {"port": self.port, "token": token, "size": state.size, "files": True, "mac": MAC}
        return {"port": self.port, "token": token, "size": len(state),
                "sha256": hashlib.sha256(state).digest()}

    def withdraw(self, description: dict) -> None:
        discard(self.offers.pop(description.get("token"), None))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), TOKEN_WAIT_S)
            state = self.offers.get(token)
            if state is None:
                self.drops.count(DROP_REFUSED)
                return
            if isinstance(state, FileState):
                writer.write(LENGTH.pack(state.size))
                await state.send(writer, _mac(self.key, token))
            else:
                writer.write(LENGTH.pack(len(state)))
                writer.write(state)
            await writer.drain()
            self.served += 1
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            self.drops.count(DROP_REFUSED)
        finally:
            writer.close()

    def close(self) -> None:
        for state in self.offers.values():
            discard(state)
        self.offers.clear()
        if self.sock is None:
            return
        self._starting.cancel()
        if self.server is not None:
            self.server.close()
        self.sock.close()
        self.sock = self.server = None


async def fetch_state(host: str, description, timeout: float, spool: Path | None = None,
                      key: bytes | None = None) -> bytes:
    """At the newcomer: the state an AcceptBackup describes, from the
    member at `host`, checked end to end.  A state with files has them
    written into `spool` (made afresh; removed again if the fetch fails),
    and its header returned; SpoolFailed if they cannot be written there.
    key: the group's (states with files)."""
    try:
        port, token = int(description["port"]), description["token"]
        size, files = int(description["size"]), bool(description.get("files"))
        digest = None if files else description["sha256"]
        if not (isinstance(token, bytes) and len(token) == TOKEN_BYTES and 0 < port < 65536 and size >= 0
                and (isinstance(digest, bytes) or files and description.get("mac") == MAC)):
            raise ValueError("bad field")
    except (KeyError, TypeError, ValueError) as e:
        raise StateTransferError(f"the state's description is malformed ({e})") from None
    if files:
        if spool is None or not key:
            raise StateTransferError("the state has files, and this member keeps none")
        try:
            return await asyncio.to_thread(_fetch_files, host, port, token, size, key, Path(spool), timeout)
        except BaseException:
            shutil.rmtree(spool, ignore_errors=True)
            raise

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


def _fetch_files(host: str, port: int, token: bytes, size: int, key: bytes, spool: Path,
                 timeout: float) -> bytes:
    """fetch_state's for a FileState, in a thread of its own (blocking)."""
    deadline = time.monotonic() + timeout
    where = f"{host} port {port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise StateTransferError(f"the state could not be fetched from {where}: {e}") from None
    with sock:
        def exactly(n: int) -> bytes:
            got = bytearray()
            while len(got) < n:
                _bounded(sock, deadline, where)
                piece = sock.recv(min(n - len(got), CHUNK))
                if not piece:
                    raise StateTransferError(f"the state from {where} ended early")
                got += piece
            return bytes(got)

        try:
            sock.sendall(token)
            (length,) = LENGTH.unpack(exactly(LENGTH.size))
            if length != size:
                raise StateTransferError(f"the primary sent {length} bytes of state, not the {size} announced")
            h = _mac(key, token)
            left = size

            def part() -> bytes:
                nonlocal left
                raw = exactly(LENGTH.size)
                (n,) = LENGTH.unpack(raw)
                if n > left - LENGTH.size:
                    raise StateTransferError(f"the state from {where} is malformed (a part past its end)")
                data = exactly(n)
                h.update(raw)
                h.update(data)
                left -= LENGTH.size + n
                return data

            files = _file_table(part(), where)
            header = part()
            if sum(s for _n, s in files) != left:
                raise StateTransferError(f"the state from {where} is malformed (its files do not fill it)")
            shutil.rmtree(spool, ignore_errors=True)
            try:
                spool.mkdir(parents=True)
            except OSError as e:
                raise SpoolFailed(f"{spool}: {e}") from None
            buf = bytearray(CHUNK)
            for name, n in files:
                try:
                    out = open(spool / name, "wb")
                except OSError as e:
                    raise SpoolFailed(f"{spool / name}: {e}") from None
                with out:
                    while n:
                        _bounded(sock, deadline, where)
                        got = sock.recv_into(buf, min(n, CHUNK))
                        if not got:
                            raise StateTransferError(f"the state from {where} ended early")
                        piece = memoryview(buf)[:got]
                        h.update(piece)
                        try:
                            out.write(piece)
                        except OSError as e:
                            raise SpoolFailed(f"{spool / name}: {e}") from None
                        n -= got
            mac = exactly(MAC_BYTES)
        except (socket.timeout, TimeoutError):
            raise StateTransferError(f"the state did not arrive from {where} within {timeout:g} s") from None
        except OSError as e:
            raise StateTransferError(f"the state could not be fetched from {where}: {e}") from None
    if not hmac.compare_digest(h.digest(), mac):
        raise StateTransferError(f"the state from {where} does not match its MAC (altered, or not of this group)")
    return header


def _bounded(sock: socket.socket, deadline: float, where: str) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout()
    sock.settimeout(left)


def _file_table(data: bytes, where: str) -> list[tuple[str, int]]:
    """The files a state announces: plain names, sizes that are counts."""
    try:
        table = msgpack.unpackb(data, raw=False)
        files = [(str(n), int(s)) for n, s in table]
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise StateTransferError(f"the state from {where} is malformed ({e})") from None
    for name, n in files:
        if not name or "/" in name or name.startswith(".") or n < 0:
            raise StateTransferError(f"the state from {where} names a file {name!r} of {n} bytes")
    if len({n for n, _s in files}) != len(files):
        raise StateTransferError(f"the state from {where} names a file twice")
    return files
