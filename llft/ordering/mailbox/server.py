"""The mailbox server (§2.2): creates a mailbox's n copies, each a
segment of its own under /dev/shm (one segment stands for one memory
module), hands processes their handle on it, fails a copy on purpose
(fail-silent, as the failure hypothesis has it), and removes it."""
from __future__ import annotations

import contextlib
import os

from llft.ordering.mailbox.config import Timing
from llft.ordering.mailbox.mailbox import Mailbox
from llft.ordering.mailbox.segment import Copy
from llft.ordering.mailbox.steps import Clock

SHM = "/dev/shm"


def copy_path(directory: str, name: str, index: int) -> str:
    return os.path.join(directory, f"llft-mbx-{name}.{index}")


def create(name: str, copies: int, protocol: int, timing: Timing, receivers: int = 8,
           slots: int = 256, message_bytes: int = 4096, directory: str = SHM) -> None:
    timing.check(copies, protocol)
    made = []
    try:
        for i in range(copies):
            made.append(Copy.create(copy_path(directory, name, i), i, copies, protocol,
                                    receivers, slots, message_bytes))
    except BaseException:
        for c in made:
            c.close()
            os.unlink(c.path)
        raise
    for c in made:
        c.close()


def connect(name: str, timing: Timing, pid: int, clock: Clock | None = None,
            directory: str = SHM) -> Mailbox:
    first = Copy.open(copy_path(directory, name, 0), 0)
    copies = [first] + [Copy.open(copy_path(directory, name, i), i) for i in range(1, first.copies)]
    return Mailbox(copies, timing, pid, clock or Clock())


def fail_copy(name: str, index: int, directory: str = SHM) -> None:
    c = Copy.open(copy_path(directory, name, index), index)
    try:
        c.crash()
    finally:
        c.close()


def remove(name: str, copies: int, directory: str = SHM) -> None:
    for i in range(copies):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(copy_path(directory, name, i))
