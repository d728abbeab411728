"""The new primary's view notice (llft/ordering/llmp/membership/view_notice.py) reaches a
lagging backup across a lossy link: the old view's entries it lacks come in
parts small enough to get through.  Deterministic: real GroupEndpoints on
the simulated network (virtual clock), a tenth of the datagrams lost."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llft.auth import Keyring
from llft.ordering.llmp.membership.view_notice import ViewNotice, split_entries
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group
from llft.ordering.llmp.wire import MsgType

KEY = Keyring(b"k" * 32)
SRV = 20
NOTICE_TYPES = (MsgType.NEW_PRIMARY_VIEW, MsgType.NEW_PRIMARY_VIEW_ACK)


@given(st.integers(1, 1000), st.lists(st.binary(min_size=1, max_size=300), max_size=60), st.integers(1, 1000))
def test_split_entries_keeps_every_entry_in_order_within_budget(first, blobs, budget):
    runs = split_entries(first, blobs, budget)
    assert [b for _of, run in runs for b in run] == blobs
    k = first
    for of, run in runs:
        assert of == k and (len(run) == 1 or sum(map(len, run)) <= budget)
        k += len(run)


def notice_pair(net):
    """A primary and a backup, each with its ViewNotice wired as member.py does."""
    primary, backup = make_group(net, SRV, 2, KEY)
    got = []
    notices = [ViewNotice(primary, None), ViewNotice(backup, got.append)]
    for ep, notice in zip((primary, backup), notices):
        def event(name, info, notice=notice):
            msg = info.get("msg")
            if name == "membership-message" and msg is not None and msg.TYPE in NOTICE_TYPES:
                notice.on_message(msg)
        ep.on_event = event
    return primary, notices, got


@pytest.mark.parametrize("seed", range(5))
def test_a_lagging_backup_gets_the_whole_notice_over_a_lossy_link(seed):
    clock = SimClock()
    net = SimNetwork(clock, LossPolicy(seed=seed, drop=0.10, delay=0.0005))
    primary, (sender, _), got = notice_pair(net)
    # What a backup a second behind lacks: 150 record blobs of 4 KiB (600 KiB).
    entries = [bytes([i % 251]) * 4000 for i in range(150)]
    sender.start(primary.view, {"pvn": primary.view.pvn, "sync": 160, "base": 1 << 41, "of": 11, "ord": entries,
                                "members": sorted(primary.view.precedences)})

    def tick():
        sender.tick()
        clock.call_later(0.005, tick)
    tick()
    assert clock.run_until(clock.now() + 2.0, lambda: got), "the backup never had the whole notice"
    assert got[0]["of"] == 11 and got[0]["ord"] == entries and got[0]["sync"] == 160
    assert clock.run_until(clock.now() + 2.0, lambda: not any(p.waiting for p in sender.parts)), \
        "every part acknowledged"
