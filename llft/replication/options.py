"""What llft-run's options make of a group on this host (llft/cli/run.py
fills it in)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llft.follow import STALL_S
from llft.native import DEFAULT_SLOTS


@dataclass
class GroupOptions:
    replicas: int = 3
    ring_slots: int = DEFAULT_SLOTS
    stall_timeout_ms: int = 60_000
    end_grace_ms: int = 3_000
    backup_exit_timeout: float = 60.0
    save_stream: Path | None = None
    replay_from: Path | None = None
    fault_timeout: float = 0.03   # a replica frozen this long is failed (LLFT: about 10-30 ms)
    port_map: dict[int, int] = field(default_factory=dict)   # program port -> public port (0: any)
    host: str | None = None
    log_output: bool = False
    respawn: bool = False         # a failed replica is replaced by a new backup that replays the history
    keep: int | None = None       # --keep N: replacements cloned from a live backup (CRIU), else replayed
    checkpoint_dir: str | None = None   # --checkpoint-dir: where a clone's image is written (None: memory)
    checkpoint_every: float | None = None   # --checkpoint-every: seconds between stored checkpoints
    semi_passive: bool = False    # --mode semi-passive: only the primary executes (llft/replacements.py)
    stall_alarm: float = STALL_S  # a backup that replays nothing this long while records wait is flagged
    private_files: bool = False   # each replica in its own view of the files (llft/private_files.py)
    serialize: bool = False       # --serialize: threads take turns (native/serialize.c)
    order: str = "llft"           # --order: the backend that carries the records (llft/ordering/)
    mailbox_copies: int = 3       # --order mailbox: copies of the mailbox (n; n − 1 may fail)
    mailbox_protocol: int = 1     # --order mailbox: 1 (crash failures) or 2 (timing failures too)
    replicate_forks: bool = False # --fork replicate: what the program forks is replicated (determinizer/forked.py)
