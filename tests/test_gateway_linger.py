"""The gateway ends a connection whose client never closed its side: after
the linger it closes the client and sends the group the connection's EOF,
also when messaging's window is full at that moment (the EOF then waits
for the window; before, it was dropped, and the program never saw the end
of that connection).  Deterministic: the real ClusterGateway and
GroupEndpoints on the simulated network; the client's TCP writer is the
one thing not real."""
from __future__ import annotations

from llft.auth import Keyring
from llft.cluster import payload
from llft.cluster.gateway import ClusterGateway, _Client
from llft.ordering.llmp.messaging.clock import SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.ids import ConnId
from llft.ordering.llmp.messaging.lossy import LossPolicy
from llft.ordering.llmp.messaging.simnet import SimNetwork, make_group

KEY = Keyring(b"k" * 32)
GW, SRV = 10, 20


class ClosedWriter:
    closed = False

    def close(self):
        self.closed = True


def test_the_eof_after_the_linger_waits_for_a_full_window():
    clock = SimClock()
    cut = {"on": True}
    net = SimNetwork(clock, LossPolicy(delay=0.0005, targets=[lambda datagram, dst: cut["on"] and dst == SRV]))
    config = Config(send_window=4)
    server = make_group(net, SRV, 1, KEY, config)[0]
    gateway = ClusterGateway(make_group(net, GW, 1, KEY, config)[0], SRV, 7000)
    cid = ConnId(*gateway.ep.connect(SRV, 1))
    sent = []
    while gateway.ep.writable(cid):                # the group hears nothing: the window fills
        sent.append(payload.data_request(b"line %d\n" % len(sent)))
        gateway.ep.send(cid, sent[-1])
    client = gateway.clients[cid] = _Client(ClosedWriter())
    gateway._closed(cid, client)                   # the linger is over
    assert client.writer.closed and cid not in gateway.clients
    cut["on"] = False
    got = []

    def all_there():
        while (m := server.recv()) is not None:
            got.append(m[1])
        return len(got) == len(sent) + 1
    assert clock.run_until(5.0, all_there), f"{len(got)} of {len(sent) + 1} messages"
    assert got == sent + [payload.eof_request()], "the program sees its input, then the end of it"
    assert not gateway.ending
