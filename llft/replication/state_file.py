"""The group's state file on this host, which llft-status, llft-kill and
the tests read (llft/rundir.py writes it atomically)."""
from __future__ import annotations

import os

from llft import rundir


class GroupStateFile:
    """LocalGroup's state file (llft/replication/group.py)."""

    def write_state(self, phase: str):
        ranks = self.ranks()
        primary = getattr(self.primary(), "index", None)
        rundir.write_state(self.run_dir, {
            "group": self.group,
            # each primary change starts a new view, as in LLFT's membership
            "view": {"pvn": 1 + len(self.failovers), "primary": primary},
            "phase": phase,
            "controller_pid": os.getpid(),
            "argv": self.argv,
            "respawn": self.opts.respawn,
            "keep": self.opts.keep,
            **self.replacements.state(),
            "replicas": [dict(r.state(), precedence=r.index, rank=ranks.get(r.index),
                              replaces=r.replaces, catch_up=r.catch_up,
                              follow=self.follow.view(r.index) if r.role == "backup" else None,
                              outputs=rl.output_summary() if rl else {},
                              outgoing=self.outgoing.summary(r.index),
                              datagrams=self.gateway.datagrams.summary(r.index) if self.gateway else {})
                         for r, rl in zip(self.replicas, self.relays or [None] * len(self.replicas))],
            "gateway": dict(self.gateway.stats, errors=self.gateway.errors) if self.gateway else None,
            "failovers": self.failovers,
            "outgoing": dict(self.outgoing.stats, errors=self.outgoing.errors),
            "order": dict(self.ordering.counters(), backend=self.ordering.name) if self.ordering else None,
            "forked": self.forked.state() if self.forked else None,
        })
