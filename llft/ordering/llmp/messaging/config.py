"""Protocol timing and limits.  Seconds and message counts."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    tick: float = 0.005            # periodic processing (Fig. 6 lines 44-53)
    rto: float = 0.030             # initial retransmission timeout (line 45), then RTT-based
    rto_min: float = 0.010
    rto_max: float = 1.0
    retransmit_burst: int = 1      # on timeout retransmit the first unacked message only (as TCP): later gaps are Nacked
    ack_delay: float = 0.004       # FirstAck if no message to piggyback the ack on (line 47)
    first_ack_interval: float = 0.020  # FirstAck retransmission until SecondAck (line 48)
    nack_delay: float = 0.008      # a gap younger than this may be reordering: not Nacked yet
    nack_interval: float = 0.015   # Nack retransmission while the nack list is non-empty
    keepalive: float = 0.050       # idle inter-group connection (lines 54-55)
    keepalive_max: float = 2.0     # ... doubling up to this while they say nothing new (periodic.py)
    heartbeat: float = 0.020       # intra-group connection (lines 56-59)
    liveness: float = 0.0          # a bodiless Heartbeat when nothing went to the group for this long (fault detectors); 0: none
    max_ack: int = 4               # MAX_ACK: FirstAcks for one message before flow control (line 65)
    send_window: int = 256         # messages held in a connection's sent list (flow control)
    # and bytes: 256 messages of 64 KiB would be 16 MiB in flight, more than
    # the receivers' socket buffers (transport.SOCKET_BUFFER); the datagrams
    # beyond are dropped, Heartbeats among them (a false failover under a flood)
    send_window_bytes: int = 1 << 20
    recv_window: int = 512         # received-but-unconsumed messages accepted per connection
    # Messages the remote group has (its primary acknowledged them; this
    # member delivered them) are kept until the group watermark says every
    # member holds them: a lagging backup, or a newcomer being admitted (no
    # watermark until it reports), holds them back.  The windows above count
    # only messages in flight or unconsumed; these are bounded apart, so that
    # a join does not stop the clients (counted in a gateway's send window,
    # 256 of them fill it within a second of a 100 MiB join).
    kept_window: int = 8192
    kept_window_bytes: int = 8 << 20
    nack_batch: int = 64           # missing msns named in one Nack
    order_budget: int = 8192       # bytes of ordering info piggybacked on one message
    order_fallback: float = 0.040  # after this, the primary ships ordering info to backups itself
    max_datagram: int = 1472       # UDP payload size (Ethernet MTU)
    reassembly_bytes: int = 64 << 20
    reassembly_timeout: float = 1.0   # a partial message with no new fragment for this long is dropped
