"""http_counter's server with every signal blocked in every thread, as
servers that leave signals to a thread of their own have it: the main
thread blocks them all before it serves, and each connection's thread
before it reads its request.

usage: python masked_server.py PORT"""
import signal

from llft.nemesis import http_counter


class MaskedHandler(http_counter.Handler):
    def setup(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        super().setup()


signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
http_counter.Handler = MaskedHandler
http_counter.main()
