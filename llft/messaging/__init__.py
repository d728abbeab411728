"""The Low Latency Messaging Protocol (LLFT §III): reliable, totally ordered
group-to-group virtual connections over UDP.  See docs/messaging.md."""
from llft.messaging.clock import LoopClock, SimClock
from llft.messaging.config import Config
from llft.messaging.endpoint import GroupEndpoint, WindowFull
from llft.messaging.ids import ConnId, View
from llft.messaging.lossy import LossPolicy, LossyTransport

__all__ = ["Config", "ConnId", "GroupEndpoint", "LoopClock", "LossPolicy", "LossyTransport",
           "SimClock", "View", "WindowFull"]
