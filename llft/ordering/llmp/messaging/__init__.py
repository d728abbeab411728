"""The Low Latency Messaging Protocol (LLFT §III): reliable, totally ordered
group-to-group virtual connections over UDP.  See docs/messaging.md."""
from llft.ordering.llmp.messaging.clock import LoopClock, SimClock
from llft.ordering.llmp.messaging.config import Config
from llft.ordering.llmp.messaging.endpoint import GroupEndpoint, WindowFull
from llft.ordering.ids import ConnId, View
from llft.ordering.llmp.messaging.lossy import LossPolicy, LossyTransport

__all__ = ["Config", "ConnId", "GroupEndpoint", "LoopClock", "LossPolicy", "LossyTransport",
           "SimClock", "View", "WindowFull"]
