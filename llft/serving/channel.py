"""A replica's private channel to its controller (native/channel.c).

The controller makes a SOCK_SEQPACKET socketpair per replica and hands one
end down at start (LLFT_CHANNEL).  Through it the replica's shim hands over
the controller's end of each socket the program serves or connects with: a
TCP listener (a stream pair: one byte and the connection's fd per client
connection), a UDP port (a datagram pair), an outgoing connection (a stream
pair).  Under --fork replicate a process the program forks hands over
its record stream the same way, and asks here for its ephemeral ports.
Nothing is named, so no other process on the host can reach the
program's sockets, nor pose as the controller to it.  Anything on the
channel that is not one well-formed message with one socket is counted
and dropped."""
from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct

from llft.native import CHAN_CONNECT, CHAN_DGRAM, CHAN_INBOX, CHAN_LISTEN, CHAN_PORT, CHAN_STREAM, \
    CHANNEL_MSG_SIZE, EPHEMERAL_COUNT, EPHEMERAL_FIRST, EPHEMERAL_OWN, ChannelMessage, parse_channel_message

log = logging.getLogger("llft.channel")

BACKLOG_RETRY_S = 0.001     # a listener's queue is full: the program accepts, so room comes soon
WRONG_PORT_NOTICE_S = 3.0
MAX_FDS = 4                 # fds a malformed message may carry (all closed)


def received_fds(anc) -> list[int]:
    """The fds an SCM_RIGHTS message carried (recvmsg's ancillary data)."""
    fds = array.array("i")
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[:len(raw) - len(raw) % 4])
    return list(fds)


def hand_over(listener: socket.socket, fd: int):
    """Hands a connection (fd, the program's end) over on a replica's
    listener as the shim takes it: one byte and the fd."""
    listener.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


class EphemeralPorts:
    """The ephemeral ports a replica's forked processes get (CHAN_PORT):
    from the range above the one its first process numbers itself, in
    turn, passing over every port the replica's processes hold (in_use).
    Given in turn, a port comes again only once the range has gone round,
    so that one given and not yet listed is not given twice."""

    def __init__(self):
        self.in_use = lambda: set()   # the ports the replica's processes list
        self._next = 0

    def give(self) -> int:
        """A port, or 0 when every one is held."""
        held, span = self.in_use(), EPHEMERAL_COUNT - EPHEMERAL_OWN
        for _ in range(span):
            port = EPHEMERAL_FIRST + EPHEMERAL_OWN + self._next
            self._next = (self._next + 1) % span
            if port not in held:
                return port
        return 0


class ProgramChannel:
    def __init__(self, index: int):
        self.index = index
        self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ours.setblocking(False)
        self.listeners: dict[tuple[int, int], socket.socket] = {}   # (port, family) -> stream socket
        self.datagrams: dict[tuple[int, int], socket.socket] = {}   # (port, family) -> datagram socket
        self.inboxes: dict[int, socket.socket] = {}   # --fork replicate, a backup: stream id -> its process's inbox
        self.on_connect = None     # (socket) -> None: an outgoing connection, its request first on it
        self.connects: list[socket.socket] = []   # those that came before on_connect was set
        self.on_stream = None      # (message, fd) -> None: a forked process's record stream (we own the fd)
        self.drops = 0
        self.closed = False
        self.changed: asyncio.Event | None = None
        self.attached = False
        self.tasks: set[asyncio.Task] = set()
        self.handing_held = False   # no connection is handed over meanwhile (a checkpoint drains the listeners)
        self.ports = EphemeralPorts()

    # -- the replica's side, at its start ------------------------------------
    def child_fd(self) -> int:
        """The fd to hand down (pass_fds); LLFT_CHANNEL names it."""
        return self.theirs.fileno()

    def started(self):
        """The replica has it: the controller keeps only its own end."""
        self.theirs.close()

    # -- reading -----------------------------------------------------------------
    def attach(self):
        """Starts reading, on the running event loop (once)."""
        if self.attached:
            return
        self.attached = True
        self.changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(self.ours.fileno(), self._readable)
        self._readable()

    def read_pending(self):
        """Takes every message the replica sent that is not read yet (a
        failed replica's last ones: the streams its processes handed over)."""
        if self.attached and not self.closed:
            self._readable()

    def _readable(self):
        while not self.closed:
            try:
                data, anc, flags, _ = self.ours.recvmsg(CHANNEL_MSG_SIZE + 1,
                                                         socket.CMSG_SPACE(MAX_FDS * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.debug("replica %d channel: %s", self.index, e)
                data, anc, flags = b"", [], 0
            if not data and not anc:
                self._close()
                return
            fds = received_fds(anc)
            try:
                if len(fds) != 1 or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise ValueError(f"{len(fds)} fds")
                msg = parse_channel_message(data)
                if msg.kind == CHAN_STREAM and self.on_stream is None:
                    raise ValueError("a forked process's stream, without --fork replicate")
            except ValueError as e:
                for fd in fds:
                    os.close(fd)
                self.drops += 1
                log.warning("replica %d: dropped a malformed message on its channel (%s)", self.index, e)
                continue
            if msg.kind == CHAN_STREAM:
                self.on_stream(msg, fds[0])
                continue
            if msg.kind == CHAN_PORT:
                self._give_port(fds[0])
                continue
            try:
                sock = socket.socket(fileno=fds[0])
            except OSError:
                os.close(fds[0])
                self.drops += 1
                log.warning("replica %d: dropped a message on its channel that came without a socket", self.index)
                continue
            self._take(msg, sock)

    def _give_port(self, fd: int):
        """A forked process waits on fd for an ephemeral port."""
        with socket.socket(fileno=fd) as s:
            s.setblocking(False)
            try:
                s.send(struct.pack("=I", self.ports.give()))
            except OSError as e:
                self.drops += 1
                log.warning("replica %d: could not give a process its ephemeral port: %s", self.index, e)

    def _take(self, msg: ChannelMessage, sock: socket.socket):
        sock.setblocking(False)
        if msg.kind == CHAN_LISTEN:
            old = self.listeners.pop((msg.port, msg.family), None)
            if old is not None:
                old.close()   # the program closed that listener and listens again
            self.listeners[(msg.port, msg.family)] = sock
        elif msg.kind == CHAN_DGRAM:
            old = self.datagrams.pop((msg.port, msg.family), None)
            if old is not None:
                old.close()
            self.datagrams[(msg.port, msg.family)] = sock
        elif msg.kind == CHAN_INBOX:
            old = self.inboxes.pop(msg.stream, None)
            if old is not None:
                old.close()   # the process exec'd: its new image has an inbox of its own
            self.inboxes[msg.stream] = sock
        elif msg.kind == CHAN_CONNECT:
            if self.on_connect is not None:
                self.on_connect(sock)
            else:
                self.connects.append(sock)
        self.changed.set()

    def _close(self):
        self.closed = True
        try:
            asyncio.get_running_loop().remove_reader(self.ours.fileno())
        except (RuntimeError, ValueError):
            pass
        if self.changed is not None:
            self.changed.set()

    def close(self):
        """The controller is done with the replica."""
        if self.attached and not self.closed:
            self._close()
        self.closed = True
        for s in [*self.listeners.values(), *self.datagrams.values(), *self.inboxes.values(), *self.connects]:
            s.close()
        for t in self.tasks:
            t.cancel()
        self.listeners.clear()
        self.datagrams.clear()
        self.inboxes.clear()
        self.connects.clear()
        self.ours.close()
        if self.theirs.fileno() >= 0:
            self.theirs.close()

    # -- what the relays and the datagram services ask for -----------------------
    def serve_connects(self, handler):
        """handler(reader, writer) for each outgoing connection, those that
        came already first, as asyncio.start_unix_server would call it."""
        self.attach()

        def opened(sock):
            async def run():
                reader, writer = await asyncio.open_unix_connection(sock=sock)
                await handler(reader, writer)
            task = asyncio.create_task(run())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        self.on_connect = opened
        pending, self.connects = self.connects, []
        for s in pending:
            opened(s)

    def take_datagram(self, port: int) -> socket.socket | None:
        """The controller's end of UDP port `port`, once the program has
        bound it (each is taken once)."""
        self.attach()
        for key in [k for k in self.datagrams if k[0] == port]:
            return self.datagrams.pop(key)
        return None

    async def _changed(self, timeout: float):
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def hand_connection(self, port: int, header: bytes, alive, stream: int | None = None
                              ) -> socket.socket | None:
        """A new connection to the program's listener for `port` (or, with
        stream, to that process's inbox: --fork replicate at a backup): the
        program's end handed over with its first byte, the header written on
        it first; our end, non-blocking.  Waits until the program listens,
        and while its queue is full; None if the replica is gone first."""
        self.attach()
        since, told = asyncio.get_running_loop().time(), False
        while alive() and not self.closed:
            if self.handing_held:
                await asyncio.sleep(BACKLOG_RETRY_S)
                continue
            if stream is not None:
                lsock = self.inboxes.get(stream)
            else:
                lsock = next((s for (p, _f), s in self.listeners.items() if p == port), None)
            if lsock is None:
                if (stream is None and self.listeners and not told
                        and asyncio.get_running_loop().time() - since > WRONG_PORT_NOTICE_S):
                    told = True   # (a gateway's --program-port, most likely)
                    log.warning("a client connection for port %d waits: the program listens on %s, not on %d",
                                port, ", ".join(str(p) for p, _f in self.listeners), port)
                await self._changed(0.05)
                continue
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                ours.sendall(header)   # first on the connection: there when the program accepts it
                hand_over(lsock, theirs.fileno())
            except (BlockingIOError, InterruptedError):
                ours.close()
                await asyncio.sleep(BACKLOG_RETRY_S)   # its queue is full: the program accepts, room comes soon
                continue
            except OSError:
                ours.close()
                self._forget(lsock)   # the program closed that listener (the process, that inbox)
                lsock.close()
                continue
            finally:
                theirs.close()
            ours.setblocking(False)
            return ours
        return None

    def _forget(self, sock):
        for table in (self.listeners, self.inboxes):
            for key in [k for k, s in table.items() if s is sock]:
                del table[key]
