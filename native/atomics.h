/* Shorthand for the GCC atomic builtins the shim and the ring use. */
#ifndef LLFT_ATOMICS_H
#define LLFT_ATOMICS_H

#define LOAD(p, o)     __atomic_load_n((p), (o))
#define STORE(p, v, o) __atomic_store_n((p), (v), (o))
#define ACQ __ATOMIC_ACQUIRE
#define REL __ATOMIC_RELEASE
#define RLX __ATOMIC_RELAXED
#define SEQ __ATOMIC_SEQ_CST

#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Spinlocks for short sections of the shim (no system call inside). */
static inline int spin_try(uint32_t *l)
{
    return LOAD(l, RLX) == 0 && __atomic_exchange_n(l, 1, ACQ) == 0;
}

static inline void spin_lock(uint32_t *l)
{
    for (unsigned n = 0; !spin_try(l); n++) {
        if (n < 64)
            __builtin_ia32_pause();
        else
            syscall(SYS_sched_yield); /* raw: the program's sched_yield is a switch point (serialize.c) */
    }
}

static inline void spin_unlock(uint32_t *l) { STORE(l, 0, REL); }

#endif
