"""Each replica's private, writable view of the filesystem.

Replicas of one program on one machine would otherwise write the same
files: a log gets every line once per replica, and a data directory (redis
with appendonly) is created by the primary and then found, loaded and
appended to by the backups, which diverge.  So each replica runs in a mount
namespace of its own where every writable filesystem is an overlay: the
machine's files are the read-only lower layer, the same at every replica,
and whatever the replica writes goes to an upper layer under its run
directory (replica-N/files/<mount>/upper).  A backup replays the primary's
writes into its own upper layer, so a backup that takes over finds the data
files where the group left them.

The plan is made here, in the controller, from /proc/self/mountinfo; the
mounts are made between fork and exec by native/private_files.c.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from llft.native import lib as _lib

# Filesystems a program writes its files on.  Others (proc, sysfs, cgroup,
# devpts, nsfs, read-only mounts) stay as they are, bound again where an
# overlay above them would hide them.
WRITABLE_KINDS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs", "jfs", "reiserfs", "overlay"}
KERNEL_TREES = ("/proc", "/sys", "/dev")


class PrivateFilesUnavailable(Exception):
    """This machine cannot give replicas private files (not root, no overlayfs)."""


@dataclass(frozen=True)
class Mount:
    point: str
    kind: str
    read_only: bool


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(esc, ch)
    return field


def mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    """The mounts a path walk sees: the topmost one at each mount point."""
    top: dict[str, Mount] = {}
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            kind = right.split()[0]
            point = _unescape(fields[4])
            top[point] = Mount(point, kind, "ro" in fields[5].split(","))
    return sorted(top.values(), key=lambda m: (m.point.count("/") if m.point != "/" else 0, m.point))


def _under(path: str, tree: str) -> bool:
    return tree == "/" or path == tree or path.startswith(tree + "/")


def _name(point: str) -> str:
    return point.strip("/").replace("/", "%") or "root"


def plan(files_dir: Path, table: list[Mount] | None = None) -> list[tuple[str, ...]]:
    """The mounts that give one replica its view, in the order they are
    made: ("overlay", target, upper, work) for a writable tree, ("bind",
    target) for a mount that an overlay above it would hide.  The root
    filesystem is overlaid one top-level directory at a time (an overlay on
    "/" itself would need a pivot_root); the files directly in "/" stay
    shared."""
    table = mounts() if table is None else table
    points = {m.point for m in table}
    overlays: list[str] = []
    binds: list[str] = []

    def covered(point: str) -> bool:
        return any(_under(point, o) for o in overlays)

    for m in table:
        in_kernel_tree = any(_under(m.point, t) for t in KERNEL_TREES)
        writable = m.kind in WRITABLE_KINDS and not m.read_only
        if m.point == "/":
            if writable:
                for entry in sorted(os.scandir("/"), key=lambda e: e.name):
                    path = "/" + entry.name
                    if entry.is_dir(follow_symlinks=False) and path not in points and path not in KERNEL_TREES:
                        overlays.append(path)
        elif (writable and (not in_kernel_tree or m.kind == "tmpfs" and m.point.startswith("/dev/"))
              and not os.path.isfile(m.point)):   # a file mounted on its own (a container's /etc/hosts)
            overlays.append(m.point)
        elif covered(m.point) and not any(_under(m.point, b) for b in binds):
            binds.append(m.point)

    steps: list[tuple[str, ...]] = []
    for point in overlays:
        layer = files_dir / _name(point)
        steps.append(("overlay", point, str(layer / "upper"), str(layer / "work")))
    # An overlay covers the mounts below its target: those that are not
    # overlays themselves are bound back, after every overlay above them.
    steps += [("bind", point) for point in binds]
    steps.sort(key=lambda s: s[1].count("/"))
    return steps


def prepare(files_dir: Path) -> bytes:
    """Makes the upper and work directories of a new replica's view (empty:
    a replica starts from the machine's files, as a replay from the first
    record needs) and returns the plan as native/private_files.c reads it."""
    if files_dir.exists():
        shutil.rmtree(files_dir)
    steps = plan(files_dir)
    for step in steps:
        if step[0] == "overlay":
            os.makedirs(step[2])
            os.makedirs(step[3])
    return plan_text(steps)


def plan_text(steps: list[tuple[str, ...]]) -> bytes:
    """The plan as native/private_files.c reads it."""
    return "".join("\t".join(step) + "\n" for step in steps).encode()


def copy_uppers(src_dir: Path, dst_dir: Path):
    """What one replica has written, into another's prepared view (a clone
    of it, llft/checkpoint/clone.py): each upper layer copied as it is,
    whiteouts and xattrs with it (cp -a), into the layer of the same
    mount.  The source must be still meanwhile (frozen)."""
    import subprocess
    for entry in os.scandir(src_dir):
        upper, dest = Path(entry.path) / "upper", dst_dir / entry.name / "upper"
        if upper.is_dir() and dest.is_dir() and any(os.scandir(upper)):   # (most are empty)
            shutil.rmtree(dest)
            subprocess.run(["cp", "-a", "--", str(upper), str(dest)], check=True)


def _tar(*args: str, data: bytes | None = None) -> bytes:
    import subprocess
    r = subprocess.run(["tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", *args], input=data,
                       capture_output=True)
    if r.returncode != 0:
        raise OSError(f"tar {args[0]} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def pack_uppers(files_dir: Path) -> bytes:
    """What a replica has written (its non-empty upper layers, whiteouts
    and xattrs with them), as a tar archive for another host's replica
    (llft/cluster/checkpoint_join.py); b"" if it wrote nothing.  The
    replica must be still meanwhile (frozen)."""
    names = [f"{e.name}/upper" for e in os.scandir(files_dir)
             if (Path(e.path) / "upper").is_dir() and any(os.scandir(Path(e.path) / "upper"))]
    return _tar("-C", str(files_dir), "-cf", "-", "--", *names) if names else b""


def unpack_uppers(files_dir: Path, archive: bytes):
    """pack_uppers' archive, into a prepared view (prepare)."""
    if archive:
        _tar("-C", str(files_dir), "-xpf", "-", data=archive)


def check_available():
    """Raises PrivateFilesUnavailable with the reason if replicas cannot
    have private files here."""
    if os.geteuid() != 0:
        raise PrivateFilesUnavailable("llft-run is not running as root, which mount namespaces and overlays need")
    with open("/proc/filesystems") as f:
        if not any(line.split()[-1] == "overlay" for line in f if line.strip()):
            raise PrivateFilesUnavailable("the kernel has no overlay filesystem")


def enter(plan_text: bytes):
    """Between fork and exec (preexec_fn): the replica's own mount
    namespace with the planned mounts.  On failure the reason is on the
    replica's stderr and the exception ends the start."""
    if _lib.llft_private_files(plan_text) != 0:
        raise OSError("llft: could not give the replica its private files (see its stderr)")


def where(files_dir: Path, path: str, table: list[Mount] | None = None) -> Path | None:
    """Where a replica's copy of path is once it has written it."""
    for step in reversed(plan(files_dir, table)):
        if step[0] == "overlay" and _under(path, step[1]):
            return Path(step[2]) / os.path.relpath(path, step[1])
    return None
