"""The control block's listening slots (native/listeners.c), with threads
publishing and closing ports at once while another reads, as a program's
threads bind and the controller watches: every published port is seen,
with its own address, until it is closed.  (cffi lets go of the GIL for each
call, so the threads really run the C code at once.)"""
from __future__ import annotations

import socket
import threading

from llft.native import StreamFile, lib

DGRAM_ANY = socket.SOCK_DGRAM | lib.LLFT_LISTENER_ANY_PORT
ROUNDS = 20000


def addr_of(port: int) -> bytes:
    """A 16-byte address as the shim keeps it, 127.0.hi.lo for port."""
    return bytes([127, 0, port >> 8, port & 0xff]) + bytes(12)


def text_of(port: int) -> str:
    return f"127.0.{port >> 8}.{port & 0xff}"


def test_threads_publishing_at_once_each_get_a_slot_and_a_reader_sees_them_whole(tmp_path):
    stream = StreamFile(tmp_path / "stream", create=True, slots=8192)
    ctl = stream.ctl
    nthreads = 8
    problems: list[str] = []
    stop = threading.Event()

    def binder(k: int):
        for r in range(ROUNDS):
            port = 1024 + k * 7000 + r % 7000   # distinct among the threads
            if lib.llft_listener_publish(ctl, port, socket.AF_INET, DGRAM_ANY, addr_of(port)) != 0:
                problems.append(f"no slot for port {port}")
                return
            if not any(p == port for p, _, _ in stream.any_port_datagram_listeners()):
                problems.append(f"port {port} published but not listed")
                return
            lib.llft_listener_close(ctl, port, socket.AF_INET, socket.SOCK_DGRAM)

    def reader():
        while not stop.is_set():
            for port, family, addr in stream.any_port_datagram_listeners():
                if addr != text_of(port) or family != socket.AF_INET:
                    problems.append(f"port {port} listed as {addr!r}, family {family}")

    watch = threading.Thread(target=reader)
    watch.start()
    threads = [threading.Thread(target=binder, args=(k,)) for k in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert not problems, problems[:5]
    assert stream.any_port_datagram_listeners() == [], "every port closed"
    assert ctl.nlisteners <= nthreads, "closed slots are taken again"
    stream.close()


def test_a_full_table_refuses_and_other_types_are_not_listed(tmp_path):
    stream = StreamFile(tmp_path / "stream", create=True, slots=8192)
    ctl = stream.ctl
    for i in range(lib.LLFT_MAX_LISTENERS):
        assert lib.llft_listener_publish(ctl, 7000 + i, socket.AF_INET, socket.SOCK_STREAM, addr_of(7000 + i)) == 0
    assert lib.llft_listener_publish(ctl, 9999, socket.AF_INET, socket.SOCK_STREAM, addr_of(9999)) == -1
    assert [p for p, _, _ in stream.listeners()] == list(range(7000, 7000 + lib.LLFT_MAX_LISTENERS))
    assert stream.listeners(socket.SOCK_DGRAM) == []
    lib.llft_listener_close(ctl, 7003, socket.AF_INET, socket.SOCK_STREAM)
    v6 = bytes(15) + b"\x01"
    assert lib.llft_listener_publish(ctl, 9999, socket.AF_INET6, socket.SOCK_STREAM, v6) == 0
    listed = {p: (f, a) for p, f, a in stream.listeners()}
    assert 7003 not in listed and listed[9999] == (socket.AF_INET6, "::1"), "a freed slot is taken again"
    assert listed[7000] == (socket.AF_INET, text_of(7000))
    stream.close()
