"""http_counter's server with a thread that sleeps between ticks.  A
backup sleeps for real (only the GIL's hand-overs around the sleep are
replayed), so a checkpoint of a backup finds this thread asleep: CRIU
restores the sleep as interrupted (EINTR).

usage: python sleeper_server.py PORT"""
import threading
import time

from llft.nemesis import http_counter


def tick():
    while True:
        time.sleep(0.2)
        with http_counter.lock:
            http_counter.counters["ticks"] = http_counter.counters.get("ticks", 0) + 1


threading.Thread(target=tick, daemon=True).start()
http_counter.main()
