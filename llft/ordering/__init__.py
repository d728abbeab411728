"""Ordering backends: the group-communication layers the replication runs
over (DESIGN.md, "The replication core and the ordering seam").  Each
backend lives in a package of its own here."""
