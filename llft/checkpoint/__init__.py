"""Checkpoints of replicas with CRIU (LLFT §IV-C): a new backup cloned
from a live one at an exact point of the record stream (clone.py), with
CRIU driven over its RPC (criu.py), the replica's sockets read from
outside while it is frozen (sockets.py), and the clone restored in a PID
namespace of its own (restore_init.py).  docs/checkpoints.md."""
