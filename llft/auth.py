"""Per-group secrets and datagram MACs.

Every datagram is authenticated with keyed BLAKE2b under the secret of its
destination group, so only holders of that group's key (its members and the
groups allowed to talk to it) can inject requests or membership messages.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Any

KEY_BYTES = 32


class KeyFileError(ValueError):
    """A key file that is missing, unreadable, too short or too open."""


def generate_key_file(path: str) -> bytes:
    """Write a fresh random key (hex) readable only by its owner."""
    key = secrets.token_bytes(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return key


def load_key(path: str) -> bytes:
    """Read a key written by `generate_key_file` (or any >=16 bytes of hex).

    A key readable by group or others is refused: it would let any local
    user forge group traffic.
    """
    try:
        st = os.stat(path)
        with open(path) as f:
            text = f.read().strip()
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e}") from e
    if st.st_mode & 0o077:
        raise KeyFileError(f"key file {path} must not be accessible by group/others (chmod 600)")
    try:
        key = bytes.fromhex(text)
    except ValueError as e:
        raise KeyFileError(f"key file {path} is not hex") from e
    if len(key) < 16:
        raise KeyFileError(f"key in {path} is shorter than 16 bytes")
    return key


class Keyring:
    """Secrets by group id, with a default for groups not listed."""

    MAC_LEN = 16

    def __init__(self, default: bytes | None = None, groups: dict[int, bytes] | None = None):
        self._default = default
        self._groups = dict(groups or {})
        self._hashers: dict[int, Any] = {}

    def key(self, group: int) -> bytes | None:
        return self._groups.get(group, self._default)

    def _keyed(self, group: int):
        # A keyed BLAKE2b state per group, copied per datagram: cheaper than
        # re-keying every time.
        h = self._hashers.get(group)
        if h is None:
            key = self.key(group)
            if key is None:
                return None
            h = self._hashers[group] = hashlib.blake2b(key=key[:64], digest_size=self.MAC_LEN)
        return h.copy()

    def mac(self, group: int, *parts: bytes) -> bytes:
        h = self._keyed(group)
        if h is None:
            raise LookupError(f"no key for group {group}")
        for p in parts:
            h.update(p)
        return h.digest()

    def verify(self, group: int, head: bytes, chunk: bytes, tag: bytes) -> bool:
        h = self._keyed(group)
        if h is None:
            return False
        h.update(head)
        h.update(chunk)
        return hmac.compare_digest(h.digest(), tag)
