"""A newcomer's state from the primary over TCP (llft/cluster/state_transfer.py):
real sockets on loopback, the primary's offer and the newcomer's fetch."""
from __future__ import annotations

import asyncio
import os

import msgpack
import pytest

from llft.cluster import state_transfer
from llft.cluster.state_transfer import FileState, SpoolFailed, StateOffers, StateTransferError, fetch_state
from llft.transport import new_event_loop
from llft.ordering.llmp.wire import DropCounters


def run(coro):
    """On the loop the members run (uvloop), whose asyncio differs in places."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)


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


# -- a state with files (a checkpoint's image) -----------------------------------
def image(tmp_path, files: dict[str, bytes]) -> FileState:
    d = tmp_path / "offered"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    return FileState(b"the cut", d, sorted(files))


KEY = b"k" * 32   # the group's


async def offered_files(state: FileState):
    offers = StateOffers("127.0.0.1", DropCounters(), KEY)
    offers.open()
    return offers, offers.offer(state)


def test_a_state_with_files_is_written_into_the_spool_and_its_header_returned(tmp_path):
    files = {"pages-1.img": os.urandom(5 << 20), "core-1.img": os.urandom(3000), "empty.img": b""}
    state = image(tmp_path, files)
    spool = tmp_path / "spool"

    async def go():
        offers, desc = await offered_files(state)
        got = await fetch_state("127.0.0.1", desc, 10, spool, key=KEY)
        offers.withdraw(desc)
        offers.close()
        return got, desc

    header, desc = run(go())
    assert header == b"the cut" and desc["files"] is True and desc["size"] == state.size and desc["mac"] == "hmac-sha256"
    assert {p.name: p.read_bytes() for p in spool.iterdir()} == files
    assert not state.directory.exists(), "a withdrawn offer's files stay behind"


def test_a_state_not_made_with_the_groups_key_is_refused_and_nothing_is_kept(tmp_path):
    """Whoever sends a state without the newcomer's group key (forged, or
    another group's source) fails the MAC, however right the bytes."""
    state = image(tmp_path, {"pages-1.img": b"a" * 100_000})
    spool = tmp_path / "spool"

    async def go():
        offers, desc = await offered_files(state)
        offers.key = b"another group's key".ljust(32)
        with pytest.raises(StateTransferError, match="does not match its MAC"):
            await fetch_state("127.0.0.1", desc, 5, spool, key=KEY)
        offers.close()

    run(go())
    assert not spool.exists() and not state.directory.exists()


def test_a_state_whose_mac_is_cut_off_is_refused(tmp_path):
    state = image(tmp_path, {"pages-1.img": os.urandom(200_000)})
    spool = tmp_path / "spool"

    async def go():
        offers, desc = await offered_files(state)
        real_send = state.send

        class WithoutMac:   # everything sent, then the connection closed where the MAC goes
            update = None

            def digest(self):
                return b""

        async def send_without_mac(writer, mac):
            cut = WithoutMac()
            cut.update = mac.update
            await real_send(writer, cut)
        state.send = send_without_mac
        with pytest.raises(StateTransferError, match="ended early"):
            await fetch_state("127.0.0.1", desc, 5, spool, key=KEY)
        offers.close()

    run(go())
    assert not spool.exists()


@pytest.mark.parametrize("name", ["../escaped.img", "/etc/passwd", ".hidden", ""])
def test_a_file_table_naming_anything_but_a_plain_name_is_refused(tmp_path, name):
    """A primary (or whoever holds a token) that names files outside the
    spool, digest and all, gets nothing written anywhere."""
    state = image(tmp_path, {"pages-1.img": b"x" * 10})
    state.table = msgpack.packb([[name, 10]])

    async def go():
        offers, desc = await offered_files(state)
        with pytest.raises(StateTransferError, match="names a file"):
            await fetch_state("127.0.0.1", desc, 5, tmp_path / "spool", key=KEY)
        offers.close()

    run(go())
    assert not (tmp_path / "escaped.img").exists() and not (tmp_path / "spool").exists()


def test_a_spool_that_cannot_be_written_is_not_a_transfer_error(tmp_path):
    state = image(tmp_path, {"pages-1.img": b"x" * 10})
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")

    async def go():
        offers, desc = await offered_files(state)
        with pytest.raises(SpoolFailed):
            await fetch_state("127.0.0.1", desc, 5, blocker / "spool", key=KEY)
        offers.close()

    run(go())


def test_a_state_with_files_needs_a_spool(tmp_path):
    state = image(tmp_path, {"pages-1.img": b"x"})

    async def go():
        offers, desc = await offered_files(state)
        with pytest.raises(StateTransferError, match="keeps none"):
            await fetch_state("127.0.0.1", desc, 5)
        offers.close()

    run(go())
    assert not state.directory.exists(), "closed offers leave their files behind"
