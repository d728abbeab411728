"""The application payloads that ride in messages between gateways and
members (llft/cluster/payload.py): what a member or gateway accepts, and
that anything else is a BadPayload (counted and dropped by the caller),
never an exception of another kind."""
from __future__ import annotations

import msgpack
import pytest

from llft.cluster import payload


def test_datagram_request_and_reply_round_trip():
    raw = payload.datagram_request(7000, 42, "10.0.0.9", 5353, b"\x00ping")
    assert payload.parse_request(raw) == (payload.DGRAM, 7000, 42, "10.0.0.9", 5353, b"\x00ping")
    assert payload.parse_datagram_reply(payload.datagram_reply(3, "::1", 9, b"")) == (3, "::1", 9, b"")


@pytest.mark.parametrize("fields", [
    [payload.DGRAM, 0, 1, "h", 1, b""],          # program port 0
    [payload.DGRAM, 70000, 1, "h", 1, b""],      # port out of range
    [payload.DGRAM, 7000, 0, "h", 1, b""],       # datagrams are numbered from 1
    [payload.DGRAM, 7000, 1, b"h", 1, b""],      # host not text
    [payload.DGRAM, 7000, 1, "h", -1, b""],      # client port negative
    [payload.DGRAM, 7000, 1, "h", 1, "text"],    # data not bytes
    [payload.DGRAM, 7000, 1, "h", 1],            # short
    [payload.DGRAM, 7000, 1, "h", 1, bytes(65508)],  # more than a UDP datagram carries
])
def test_malformed_datagram_requests_are_bad_payloads(fields):
    with pytest.raises(payload.BadPayload):
        payload.parse_request(msgpack.packb(fields, use_bin_type=True))


@pytest.mark.parametrize("raw", [
    payload.data_reply(0, b"tcp bytes"),                                  # a TCP reply on a UDP port's connection
    msgpack.packb([payload.DGRAM, -1, "h", 1, b""], use_bin_type=True),    # negative k
    msgpack.packb([payload.DGRAM, 0, "h", 65536, b""], use_bin_type=True),
    b"\xc1garbage",
])
def test_malformed_datagram_replies_are_bad_payloads(raw):
    with pytest.raises(payload.BadPayload):
        payload.parse_datagram_reply(raw)


def test_a_datagram_reply_is_not_a_tcp_reply():
    with pytest.raises(payload.BadPayload):
        payload.parse_reply(payload.datagram_reply(0, "h", 1, b"x"))


def test_outgoing_udp_payloads_round_trip():
    assert payload.parse_xudp_reply(payload.xudp_reply(4, 49153, 2)) == (4, 49153, 2)
    assert payload.parse_request(payload.xport_request(4, ("0.0.0.0", 40000))) == (payload.XPORT, 4, "0.0.0.0", 40000)
    assert payload.parse_port_reply(payload.close_reply(7)) == (payload.CLOSE, 7)
    assert payload.parse_port_reply(payload.datagram_reply(0, "h", 1, b"x")) == (payload.DGRAM, 0, "h", 1, b"x")
    assert payload.parse_blob(payload.udp_port_blob(4, 49153, 10)) == (payload.TAG_UDP_PORT, 4, 49153, 10)


@pytest.mark.parametrize("parse, fields", [
    (payload.parse_xudp_reply, [payload.XUDP, -1, 49153, 2]),        # negative j
    (payload.parse_xudp_reply, [payload.XUDP, 0, 0, 2]),             # program port 0
    (payload.parse_xudp_reply, [payload.XUDP, 0, 70000, 2]),
    (payload.parse_xudp_reply, [payload.XOPEN, 0, "h", 1]),          # a TCP open on the UDP control connection
    (payload.parse_request, [payload.XPORT, 0, "h"]),                # short
    (payload.parse_request, [payload.XPORT, 0, "h", 65536]),
    (payload.parse_port_reply, [payload.CLOSE, -1]),
    (payload.parse_port_reply, [payload.DATA, 0, b"tcp bytes"]),
])
def test_malformed_outgoing_udp_payloads_are_bad_payloads(parse, fields):
    with pytest.raises(payload.BadPayload):
        parse(msgpack.packb(fields, use_bin_type=True))


def test_malformed_udp_port_blob_is_a_bad_payload():
    with pytest.raises(payload.BadPayload):
        payload.parse_blob(payload.TAG_UDP_PORT + msgpack.packb([0, 70000, 2]))
