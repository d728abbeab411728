"""Hosts for tests (llft/nemesis/hosts.py): a test that cannot make
network namespaces here is skipped."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from llft.nemesis import hosts
from llft.nemesis.hosts import HostsError, deaf_to, drop_randomly, in_ns, sh

__all__ = ["bridged_hosts", "deaf_to", "drop_randomly", "in_ns", "sh"]


@contextmanager
def bridged_hosts(n: int):
    try:
        with hosts.bridged_hosts(n) as made:
            yield made
    except HostsError as e:
        pytest.skip(str(e))
