"""The `llft` backend: LLFT's Low Latency Messaging Protocol and its
leader-determined membership (the primary orders; its ordering
information reaches the backups in the order it recorded it)."""
