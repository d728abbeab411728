"""Threads that run Python code without a blocking call: where CPython
forces the GIL from one to another decides the order of the list (and
differs from run to run).  Prints how often the list changes hands and a
digest of it."""
import hashlib
import threading

log = []


def work(k):
    for _ in range(300000):
        log.append(k)


threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
switches = sum(1 for a, b in zip(log, log[1:]) if a != b)
print(switches, hashlib.sha256(bytes(log)).hexdigest()[:16])
