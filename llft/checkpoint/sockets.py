"""What a checkpoint needs to know of a replica's sockets and files, read
from outside while it is frozen: which of its sockets lead to this
controller (NETLINK_SOCK_DIAG gives each AF_UNIX socket's peer), what it
has not read of them (a dup taken with pidfd_getfd, read with MSG_PEEK,
so the replica still finds it), and the connections handed to it and not
accepted yet (taken out of its listener's queue, which CRIU cannot dump
while it carries sockets, and put back once the dump is done)."""
from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import os
import select
import socket
import struct
import time

from llft.serving.channel import hand_over, received_fds

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_PEER = 0x4
UNIX_DIAG_PEER = 2
SYS_PIDFD_GETFD = 438
FIONREAD = 0x541B
MAX_FDS = 4
_NLMSG = struct.Struct("=IHHII")
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")   # family, protocol, pad, states, ino, show, cookie[2]
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")    # family, type, state, pad, ino, cookie[2]

_libc = ctypes.CDLL(None, use_errno=True)


def _align4(n: int) -> int:
    return (n + 3) & ~3


def inode(sock_or_fd) -> int:
    fd = sock_or_fd if isinstance(sock_or_fd, int) else sock_or_fd.fileno()
    return os.fstat(fd).st_ino


def unix_peers(inodes: set[int]) -> dict[int, int]:
    """inode -> its peer's inode (0: none) for each AF_UNIX socket of
    inodes, in this network namespace; others are left out."""
    req = _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_PEER, 0xFFFFFFFF, 0xFFFFFFFF)
    out: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.sendto(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req,
                  (0, 0))
        while True:
            data = nl.recv(1 << 16)
            off = 0
            while off + _NLMSG.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
                if kind == NLMSG_DONE or length < _NLMSG.size:
                    return out
                if kind == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
                    raise OSError(err, f"sock_diag: {os.strerror(err)}")
                body = data[off + _NLMSG.size:off + length]
                ino = _UNIX_DIAG_MSG.unpack_from(body)[4]
                peer, a = 0, _UNIX_DIAG_MSG.size
                while a + 4 <= len(body):
                    alen, atype = struct.unpack_from("=HH", body, a)
                    if alen < 4:
                        break
                    if atype == UNIX_DIAG_PEER:
                        peer = struct.unpack_from("=I", body, a + 4)[0]
                    a += _align4(alen)
                if ino in inodes:
                    out[ino] = peer
                off += _align4(length)
            if not data:
                return out


def fd_inodes(pid: int) -> dict[int, int]:
    """fd -> inode of each socket pid has open."""
    out = {}
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out[int(name)] = int(link[8:-1])
    return out


def foreign_peers(pid: int) -> list[tuple[int, int, int]]:
    """(fd, inode, peer's inode) of each AF_UNIX socket of pid whose other
    end is not pid's own: for a replica, those that lead to its controller."""
    socks = fd_inodes(pid)
    peers = unix_peers(set(socks.values()))
    own = set(socks.values())
    return [(fd, ino, peers[ino]) for fd, ino in sorted(socks.items()) if peers.get(ino) and peers[ino] not in own]


def file_key(pid: int, fd: int) -> str | None:
    """CRIU's name for the file pid has open as fd (file[mount id:inode],
    in hex), which --external and --inherit-fd take; None if it is gone."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            mnt = next(int(line.split()[1]) for line in f if line.startswith("mnt_id:"))
        ino = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
    except (OSError, StopIteration):
        return None
    return f"file[{mnt:x}:{ino:x}]"


@contextlib.contextmanager
def take_fd(pid: int, fd: int):
    """A socket object for a dup of pid's socket fd (pidfd_getfd)."""
    pidfd = os.pidfd_open(pid)
    try:
        dup = _libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if dup < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot take fd {fd} of process {pid}: {os.strerror(err)}")
    finally:
        os.close(pidfd)
    sock = socket.socket(fileno=dup)
    try:
        yield sock
    finally:
        sock.close()


_COPIED_OPTIONS = (socket.SO_RCVBUF, socket.SO_SNDBUF, socket.SO_RCVTIMEO, socket.SO_SNDTIMEO, socket.SO_PASSCRED)


def settings(sock: socket.socket) -> dict:
    """How the program set a stream socket up: O_NONBLOCK (a flag of the
    open file, which an inherited fd does not take from the image) and the
    socket options a program sets, each as the kernel reports it."""
    out = {"nonblock": bool(fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK)}
    for opt in _COPIED_OPTIONS:
        size = 16 if opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO) else 4
        try:
            out[int(opt)] = sock.getsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass
    return out


def apply_settings(sock: socket.socket, said: dict):
    """sock set up as settings() found another."""
    fl = fcntl.fcntl(sock.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(sock.fileno(), fcntl.F_SETFL, (fl & ~os.O_NONBLOCK) | (os.O_NONBLOCK if said.get("nonblock") else 0))
    for opt in _COPIED_OPTIONS:
        value = said.get(int(opt))
        if not isinstance(value, bytes):
            continue
        if opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):   # the kernel doubles what it is given
            value = struct.pack("i", struct.unpack("i", value)[0] // 2)
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, value)
        except OSError:
            pass


def same_settings(src: socket.socket, dst: socket.socket):
    """dst as the program set src up."""
    apply_settings(dst, settings(src))


def unread(sock: socket.socket) -> bytes:
    """What is queued on sock for its reader, left in place."""
    n = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), FIONREAD, n)
    data = sock.recv(n[0], socket.MSG_PEEK | socket.MSG_DONTWAIT) if n[0] else b""
    if len(data) != n[0]:
        raise OSError(f"{n[0]} bytes are queued and a peek read {len(data)}")
    return data


def take_handed(listener: socket.socket) -> list[socket.socket]:
    """Takes every connection queued on a replica's listener (one byte
    and one socket each, serving/channel.py's hand_over), in order."""
    out = []
    while True:
        try:
            data, anc, _flags, _ = listener.recvmsg(1, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return out
        fds = received_fds(anc)
        if not data and not fds:
            return out
        out.extend(socket.socket(fileno=fd) for fd in fds)


def send_handed(listener: socket.socket, conn: socket.socket, timeout: float):
    """hand_over, waiting up to timeout for room in the listener's queue."""
    end = time.monotonic() + timeout
    while True:
        try:
            hand_over(listener, conn.fileno())
            return
        except (BlockingIOError, InterruptedError):
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("the listener's queue stayed full") from None
            select.select([], [listener], [], left)


def give_back(taken: list[tuple[socket.socket, list[socket.socket]]], timeout: float) -> list[str]:
    """Connections taken out of listeners' queues (take_handed), each
    listener's (our end of it, its connections) put back in their order
    and closed here; returns what failed, for the log."""
    failed = []
    for ours, waiting in taken:
        for s in waiting:
            try:
                send_handed(ours, s, timeout)
            except OSError as e:
                failed.append(str(e))
            s.close()
    return failed


def namespace_child(helper_pid: int) -> int | None:
    """The restored program's pid here: the child of the namespace's init,
    which is the restore helper's child (llft/checkpoint/restore_init.py)."""
    def children(pid: int) -> list[int]:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []
    for init in children(helper_pid):
        kids = children(init)
        if kids:
            return kids[0]
    return None
