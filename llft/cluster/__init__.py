"""Groups whose members are on several hosts: `llft-run --join` on each host
(one replica per host, llft/cluster/member.py) and `llft-gateway` for the
clients (llft/cluster/gateway.py), all over the Low Latency Messaging
Protocol (llft/ordering/llmp/messaging/)."""
