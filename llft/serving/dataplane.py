"""The native data plane (native/dataplane.c, llft._dataplane) seen from
Python: the byte path of the client connections on one host runs on its own
thread, without the GIL.  Python hands it sockets (a client's, and each
replica's connection to the program, header written) and keeps the control:
numbering, the primary, failovers, the state file."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from llft._dataplane import ffi, lib

QUEUE_LIMIT = 8 << 20   # input bytes queued for one replica beyond which clients wait
LEG_WAITING, LEG_LIVE, LEG_ENDED = lib.LLFT_DP_LEG_WAITING, lib.LLFT_DP_LEG_LIVE, lib.LLFT_DP_LEG_ENDED


def _pidfd(pid: int | None) -> int:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError, TypeError):
        return -1   # the plane then tells a death from /proc alone


class DataPlane:
    def __init__(self, input_dir: Path | None = None, queue_limit: int = QUEUE_LIMIT):
        d = ffi.new("char[]", os.fsencode(input_dir)) if input_dir is not None else ffi.NULL
        dp = lib.llft_dp_new(d, queue_limit)
        if dp == ffi.NULL:
            raise OSError(ffi.errno, f"cannot create the data plane: {os.strerror(ffi.errno)}")
        self._dp = ffi.gc(dp, lib.llft_dp_free)
        if lib.llft_dp_start(self._dp) != 0:
            raise OSError(ffi.errno, f"cannot start the data plane's thread: {os.strerror(ffi.errno)}")

    def stop(self):
        """Stops the thread and closes every socket; summaries stay readable."""
        lib.llft_dp_stop(self._dp)

    def add_replica(self, replica, log_dir: Path | None) -> int:
        pidfd = _pidfd(replica.pid)
        d = ffi.new("char[]", os.fsencode(log_dir)) if log_dir is not None else ffi.NULL
        slot = lib.llft_dp_add_replica(self._dp, replica.pid or 0, pidfd, d)
        if slot < 0:
            if pidfd >= 0:
                os.close(pidfd)
            raise OSError(ffi.errno, f"replica {replica.index}: cannot add it to the data plane")
        return slot

    def clone_replica(self, src: int, log_dir: Path | None, max_legs: int = 1 << 16) -> tuple[int, list[tuple]]:
        """src's process is frozen for a checkpoint: src's input is held
        from now on, and a new slot continues src's connections (see
        native/dataplane.h).  Returns the slot and, per connection of src,
        (conn_id, inode of the plane's end of src's leg, state)."""
        out = ffi.new("llft_dp_leg_info_t[]", max_legs)
        slot = ffi.new("int *", -1)
        d = ffi.new("char[]", os.fsencode(log_dir)) if log_dir is not None else ffi.NULL
        n = lib.llft_dp_clone_replica(self._dp, src, d, out, max_legs, slot)
        if n < 0:
            err = ffi.errno
            if slot[0] >= 0:
                self.remove_replica(slot[0])
            self.release(src)
            raise OSError(err, f"cannot clone the data plane's replica {src}: {os.strerror(err)}")
        return slot[0], [(out[i].conn_id, out[i].ino, out[i].state) for i in range(n)]

    def clone_attach(self, slot: int, conn_id: int, sock: socket.socket, prefix: bytes):
        """A clone's socket for a LIVE connection; prefix goes to it first."""
        if lib.llft_dp_clone_attach(self._dp, slot, conn_id, sock.detach(), prefix, len(prefix)) != 0:
            raise OSError(ffi.errno, f"connection {conn_id}: cannot attach the clone's socket")

    def set_pid(self, slot: int, pid: int):
        lib.llft_dp_set_pid(self._dp, slot, pid, _pidfd(pid))

    def release(self, src: int):
        """src takes its input again (after llft_dp_clone_replica)."""
        lib.llft_dp_release(self._dp, src)

    def park(self, slot: int) -> int:
        """slot becomes a stored checkpoint's: no input until wake (see
        native/dataplane.h); returns the last connection id now."""
        after = ffi.new("uint64_t *", 0)
        if lib.llft_dp_park(self._dp, slot, after) != 0:
            raise OSError(ffi.errno, f"cannot park the data plane's replica {slot}")
        return after[0]

    def wake(self, slot: int, log_dir: Path | None):
        """The parked slot joins: its legs resume from the input log, and
        the connections since get legs fed from theirs."""
        d = ffi.new("char[]", os.fsencode(log_dir)) if log_dir is not None else ffi.NULL
        if lib.llft_dp_wake(self._dp, slot, d) != 0:
            raise OSError(ffi.errno, f"cannot wake the data plane's replica {slot}")

    def forget_through(self, conn_id: int) -> int:
        """Connections done up to conn_id: no replica joining later needs
        their input (deleted); returns how many."""
        return lib.llft_dp_forget_through(self._dp, conn_id)

    def remove_replica(self, slot: int):
        lib.llft_dp_remove_replica(self._dp, slot)

    def set_primary(self, slot: int):
        lib.llft_dp_set_primary(self._dp, slot)

    def open_conn(self, conn_id: int, client: socket.socket) -> bool:
        """The plane owns client's socket from now on."""
        fd = client.detach()
        if lib.llft_dp_open_conn(self._dp, conn_id, fd) != 0:
            os.close(fd)
            return False
        return True

    def attach(self, slot: int, conn_id: int, sock: socket.socket | None):
        """slot's connection for conn_id (None: it could not be made)."""
        lib.llft_dp_attach(self._dp, slot, conn_id, sock.detach() if sock is not None else -1)

    def summary(self, slot: int) -> dict[str, dict]:
        """Per connection of slot not done yet: bytes the program sent, their
        SHA-256, closed; and "closed": the connections done, summed up (how
        many, bytes, and a digest equal at replicas that sent the same)."""
        cap = 1 << 16
        while True:
            buf = ffi.new("char[]", cap)
            n = lib.llft_dp_summary(self._dp, slot, buf, cap)
            if n <= cap:
                break
            cap = n + 4096   # connections opened meanwhile
        out = {}
        for line in ffi.buffer(buf, n)[:].decode().splitlines():
            conn, count, nbytes, sha = line.split()
            if conn == "closed":   # every connection done, summed up
                out[conn] = {"connections": int(count), "bytes": int(nbytes), "sha256": sha, "closed": True}
            else:
                out[conn] = {"bytes": int(count), "sha256": sha, "closed": nbytes == "1"}
        return out

    def accepting(self, max_waiting: int) -> bool:
        """False while a live replica lags max_waiting connections behind."""
        return bool(lib.llft_dp_accepting(self._dp, max_waiting))

    def open_legs(self, slot: int) -> int:
        return lib.llft_dp_open_legs(self._dp, slot)

    def close_clients(self):
        lib.llft_dp_close_clients(self._dp)

    def stats(self) -> dict[str, int]:
        s = ffi.new("llft_dp_stats_t *")
        lib.llft_dp_stats(self._dp, s)
        return {"connections": s.connections, "bytes_in": s.bytes_in, "bytes_out": s.bytes_out,
                "open_clients": s.open_clients, "held": s.held}
