"""A digest of a byte stream that another process can go on with.

Replicas compare what they sent on each connection by digest.  A replica
restored from another's checkpoint (llft/cluster/checkpoint_join.py) has
sent only the rest of each open connection; to agree with the others its
digest must go on from the other's, and a hashlib object's state cannot
be carried.  So the stream is hashed in blocks of BLOCK bytes by stream
offset, chained: the state is 32 bytes and the unfinished block, and the
digest is the same whatever chunks the stream was read in."""
from __future__ import annotations

from hashlib import sha256

BLOCK = 1 << 16


class StreamDigest:
    __slots__ = ("chain", "part")

    def __init__(self, chain: bytes = bytes(32), part: bytes = b""):
        self.chain = chain
        self.part = bytearray(part)

    def update(self, data) -> None:
        part = self.part
        part += data
        if len(part) < BLOCK:
            return
        whole = len(part) // BLOCK * BLOCK
        chain = self.chain
        with memoryview(part) as view:
            for at in range(0, whole, BLOCK):
                chain = sha256(chain + sha256(view[at:at + BLOCK]).digest()).digest()
        self.chain = chain
        del part[:whole]

    def hexdigest(self) -> str:
        return sha256(self.chain + sha256(self.part).digest()).hexdigest()

    def state(self) -> list[bytes]:
        """What StreamDigest(*state) goes on from."""
        return [self.chain, bytes(self.part)]

    def copy(self) -> "StreamDigest":
        return StreamDigest(self.chain, self.part)
