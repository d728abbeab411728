"""llft: transparent leader-follower replication of unmodified Linux programs.

The C library preloaded into each replica (llft/libllft.so, built from
native/) records the outcome of every non-deterministic call at the primary
and replays it at the backups; this package is the controller around it."""
from pathlib import Path

__version__ = "0.1.0"

PRELOAD_LIBRARY = Path(__file__).with_name("libllft.so")
