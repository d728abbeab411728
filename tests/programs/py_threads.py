"""Threads, locks, clocks and randomness in CPython: hash-randomised set
order, time.time() and time.monotonic() from several threads, random and
os.urandom, and the order in which threads win a shared lock."""
import os
import random
import threading
import time

results = [None] * 4
order = []
lock = threading.Lock()


def work(i):
    names = {f"key-{i}-{j}" for j in range(12)}
    stamps = [time.time() for _ in range(3)]
    for _ in range(50):
        with lock:
            order.append(i)
    results[i] = (list(names)[:4], stamps, time.monotonic(), random.random(), os.urandom(4).hex())


threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("set", list({"alpha", "beta", "gamma", "delta", "epsilon"}))
print("hash", hash("llft"), "time", time.time())
for r in results:
    print("thread", r)
print("lock-order", hash(tuple(order)))
