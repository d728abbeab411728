"""Thread per request: many short-lived threads, each taking a lock, reading
the clock and drawing random numbers, as ThreadingHTTPServer does."""
import random
import sys
import threading
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
lock = threading.Lock()
log = []


def handle(i):
    t = time.time()
    r = random.getrandbits(32)
    with lock:
        log.append((i, t, r))


for batch in range(0, N, 10):
    threads = [threading.Thread(target=handle, args=(i,)) for i in range(batch, min(batch + 10, N))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
print(len(log), hash(tuple(log)))
print([i for i, _, _ in log[:30]])
