"""A newcomer's state from the primary over TCP (llft/cluster/state_transfer.py):
real sockets on loopback, the primary's offer and the newcomer's fetch."""
from __future__ import annotations

import asyncio
import os

import pytest

from llft.cluster import state_transfer
from llft.cluster.state_transfer import StateOffers, StateTransferError, fetch_state
from llft.wire import DropCounters


def run(coro):
    return asyncio.run(coro)


async def offered(state: bytes):
    offers = StateOffers("127.0.0.1", DropCounters())
    offers.open()
    return offers, offers.offer(state)


def test_the_newcomer_gets_the_state_it_was_offered():
    state = os.urandom(3 << 20)

    async def go():
        offers, desc = await offered(state)
        got = await fetch_state("127.0.0.1", desc, 10)
        offers.close()
        return got, offers.served

    got, served = run(go())
    assert got == state and served == 1


def test_a_wrong_token_gets_nothing_and_is_counted():
    async def go():
        offers, desc = await offered(b"secret history")
        forged = dict(desc, token=os.urandom(state_transfer.TOKEN_BYTES))
        with pytest.raises(StateTransferError):
            await fetch_state("127.0.0.1", forged, 5)
        await asyncio.sleep(0.05)
        offers.close()
        return offers.drops.snapshot(), offers.served

    drops, served = run(go())
    assert drops == {state_transfer.DROP_REFUSED: 1} and served == 0


def test_a_state_that_does_not_match_its_digest_is_refused():
    async def go():
        offers, desc = await offered(b"the state as offered")
        offers.offers[desc["token"]] = b"the state as altered"   # same length, other bytes
        with pytest.raises(StateTransferError, match="does not match its digest"):
            await fetch_state("127.0.0.1", desc, 5)
        offers.close()

    run(go())


def test_a_withdrawn_offer_is_not_served():
    async def go():
        offers, desc = await offered(b"x" * 1000)
        offers.withdraw(desc)
        with pytest.raises(StateTransferError):
            await fetch_state("127.0.0.1", desc, 5)
        offers.close()

    run(go())


def test_a_connection_that_says_nothing_is_closed(monkeypatch):
    monkeypatch.setattr(state_transfer, "TOKEN_WAIT_S", 0.2)

    async def go():
        offers, desc = await offered(b"x")
        reader, writer = await asyncio.open_connection("127.0.0.1", desc["port"])
        got = await asyncio.wait_for(reader.read(), 5)    # EOF: the primary closed it
        writer.close()
        offers.close()
        return got, offers.drops.snapshot()

    got, drops = run(go())
    assert got == b"" and drops == {state_transfer.DROP_REFUSED: 1}


@pytest.mark.parametrize("desc", [None, {}, {"port": 0, "token": b"t" * 16, "size": 1, "sha256": b""},
                                  {"port": 7000, "token": "not bytes", "size": 1, "sha256": b""},
                                  {"port": 7000, "token": b"short", "size": 1, "sha256": b""},
                                  {"port": "x", "token": b"t" * 16, "size": 1, "sha256": b""}])
def test_a_malformed_description_is_refused_clearly(desc):
    with pytest.raises(StateTransferError, match="malformed"):
        run(fetch_state("127.0.0.1", desc, 1))


def test_a_primary_gone_before_the_fetch_is_an_error_not_a_hang():
    async def go():
        offers, desc = await offered(b"x" * 100)
        offers.close()
        with pytest.raises(StateTransferError, match="could not be fetched"):
            await fetch_state("127.0.0.1", desc, 5)

    run(go())


def test_closed_offers_leave_no_port_open():
    async def go():
        offers, desc = await offered(b"x")
        await asyncio.sleep(0.01)
        offers.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", desc["port"])
        offers.open()                       # the next admission listens again
        again = offers.offer(b"y" * 10)
        got = await fetch_state("127.0.0.1", again, 5)
        offers.close()
        return got

    assert run(go()) == b"y" * 10
