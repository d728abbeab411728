"""The mailbox server (§2.2): creates a mailbox's n copies, each a
segment of its own under /dev/shm (one segment stands for one memory
module), hands processes their handle on it, fails a copy on purpose
(fail-silent, as the failure hypothesis has it), and removes it."""
from __future__ import annotations

import contextlib
import glob
import os

from llft.ordering.mailbox.config import Timing
from llft.ordering.mailbox.mailbox import Mailbox
from llft.ordering.mailbox.segment import Copy
from llft.ordering.mailbox.steps import Clock

SHM = "/dev/shm"
FORKED = "-fork-"   # between a group's mailbox name and a forked process's stream id


def copy_path(directory: str, name: str, index: int) -> str:
    return os.path.join(directory, f"llft-mbx-{name}.{index}")


def mailbox_name(group: str, stream: int) -> str:
    """The mailbox of a group's stream: its first processes' (stream 0)
    is the group's own, each forked process's is named after it."""
    return group if stream == 0 else f"{group}{FORKED}{stream:016x}"


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


def _crash(path: str, index: int) -> None:
    c = Copy.open(path, index)
    try:
        c.crash()
    finally:
        c.close()


def fail_copy(name: str, index: int, directory: str = SHM) -> int:
    """Copy index of the group's mailbox fails, and with it copy index of
    each of its forked processes' mailboxes: one memory module holds
    them all.  Returns how many copies failed."""
    paths = [copy_path(directory, name, index)]
    paths += sorted(glob.glob(copy_path(directory, glob.escape(name) + FORKED + "*", index)))
    for path in paths:
        _crash(path, index)
    return len(paths)


def failed_copies(name: str, copies: int, directory: str = SHM) -> list[int]:
    """Which copies of the mailbox have failed."""
    failed = []
    for i in range(copies):
        c = Copy.open(copy_path(directory, name, i), i)
        try:
            if c.failed():
                failed.append(i)
        finally:
            c.close()
    return failed


def fail_as(name: str, group: str, copies: int, directory: str = SHM) -> None:
    """A forked process's mailbox, made after copies of its group's had
    failed, has those copies failed too: they are in the failed modules."""
    for i in failed_copies(group, copies, directory):
        _crash(copy_path(directory, name, i), i)


def remove(name: str, copies: int, directory: str = SHM) -> None:
    for i in range(copies):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(copy_path(directory, name, i))
