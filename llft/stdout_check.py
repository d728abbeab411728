"""What replicas wrote on their stdout, compared at the end of a run.

A program that is not a server (or a server's log on stdout) must write
the same at every replica: if a backup's stdout differs from the
primary's, the backup computed something else, and the run reports a
divergence (a data race outside the locks llft orders does this while
every recorded call matched)."""
from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20


def digest(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        pass
    return size, h.hexdigest()


def first_difference(a: Path, b: Path) -> int:
    """Offset of the first byte where a and b differ (or where one ends)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        offset = 0
        while True:
            ca, cb = fa.read(CHUNK), fb.read(CHUNK)
            if ca != cb:
                n = min(len(ca), len(cb))
                return offset + next((i for i in range(n) if ca[i] != cb[i]), n)
            if not ca:
                return offset
            offset += len(ca)


def stdout_problem(primary: Path, other: Path) -> str | None:
    """Why other's stdout is not the primary's, or None if it is."""
    (na, da), (nb, db) = digest(primary), digest(other)
    if da == db:
        return None
    at = first_difference(primary, other)
    return (f"its stdout differs from the primary's ({nb} bytes against {na}, first at byte {at}): it computed "
            f"something else")
