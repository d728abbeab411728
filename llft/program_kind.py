"""Whether the preload library can reach a program at all, told from its
executable before it starts.  llft sees a program through the C library
calls it interposes on; a program that makes its system calls another
way would run unreplicated at every replica, and its primary would serve
clients itself, around the gateway.  Such a program is refused in one
line that says why:

- a statically linked executable has no dynamic loader, so LD_PRELOAD
  never loads anything into it;
- a Go executable makes its system calls from Go's own runtime, not
  through the C library, even when it is dynamically linked (cgo);
- a set-user-ID or set-group-ID executable runs with LD_PRELOAD ignored
  (the loader's secure mode) unless llft-run runs as the user it sets.

A script is judged by its interpreter (#!).  What cannot be read or is not
ELF is left to run: the controller still notices, while it runs, a replica
that listens on a real port itself (llft/native_sockets.py)."""
from __future__ import annotations

import os
import shutil
import stat
import struct

PT_INTERP = 3
GO_SECTIONS = (b".go.buildinfo", b".note.go.buildid", b".gopclntab")
MAX_SCRIPT_DEPTH = 4


def resolve(program: str) -> str | None:
    """The file exec would run for program (a path, or a name on PATH)."""
    if os.sep in program:
        return program if os.path.isfile(program) else None
    return shutil.which(program)


def _elf_facts(data: bytes, f) -> tuple[bool, bool] | None:
    """(has a dynamic loader, is a Go program) of a 64-bit little-endian
    ELF file, or None when it is another kind."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (phoff, shoff) = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    dynamic = False
    f.seek(phoff)
    headers = f.read(phentsize * phnum)
    for i in range(min(phnum, len(headers) // max(phentsize, 1))):
        if struct.unpack_from("<I", headers, i * phentsize)[0] == PT_INTERP:
            dynamic = True
    go = False
    if shoff and shnum and shstrndx < shnum:
        f.seek(shoff)
        sections = f.read(shentsize * shnum)
        if len(sections) == shentsize * shnum:
            names_off, names_size = struct.unpack_from("<QQ", sections, shstrndx * shentsize + 0x18)
            f.seek(names_off)
            names = f.read(min(names_size, 1 << 20))
            go = any(name + b"\0" in names for name in GO_SECTIONS)
    return dynamic, go


def unreachable(program: str, depth: int = 0) -> str | None:
    """Why the preload library cannot reach program (argv[0]), or None."""
    path = resolve(program)
    if path is None or depth > MAX_SCRIPT_DEPTH:
        return None
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(b"#!"):
                words = head[2:].split(b"\n", 1)[0].split()
                return unreachable(os.fsdecode(words[0]), depth + 1) if words else None
            facts = _elf_facts(head, f)
    except (OSError, struct.error):
        return None
    if facts is None:
        return None
    dynamic, go = facts
    if go:
        return (f"{path} is a Go program: Go's runtime makes its system calls itself, not through the C "
                "library that llft's preload library interposes on, so llft can neither record nor replay them "
                "(its primary would serve clients itself, unreplicated)")
    if not dynamic:
        return (f"{path} is statically linked: without a dynamic loader the preload library (LD_PRELOAD) "
                "never loads into it, so llft can neither record nor replay it")
    if (st.st_mode & stat.S_ISUID and st.st_uid != os.geteuid()) or \
            (st.st_mode & stat.S_ISGID and st.st_gid != os.getegid()):
        return (f"{path} is set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it, so llft "
                "cannot reach it; run it without that bit")
    return None
