"""http_counter's server that, asked for /incr/probe, reads the clock only
when its parent is not the one it started under: a program that looks at
surroundings llft does not record (a replica's parent is its controller;
a copy restored from a checkpoint's is the init of a PID namespace of its
own), so any copy of it diverges at the first probe.

usage: python parent_sensitive.py PORT"""
import os
import time

from llft.nemesis import http_counter

STARTED_UNDER = os.getppid()


class ParentSensitiveHandler(http_counter.Handler):
    def do_GET(self):
        if self.path == "/incr/probe" and os.getppid() != STARTED_UNDER:
            time.time()
        super().do_GET()


http_counter.Handler = ParentSensitiveHandler
http_counter.main()
