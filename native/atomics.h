/* Shorthand for the GCC atomic builtins the shim and the ring use. */
#ifndef LLFT_ATOMICS_H
#define LLFT_ATOMICS_H

#define LOAD(p, o)     __atomic_load_n((p), (o))
#define STORE(p, v, o) __atomic_store_n((p), (v), (o))
#define ACQ __ATOMIC_ACQUIRE
#define REL __ATOMIC_RELEASE
#define RLX __ATOMIC_RELAXED
#define SEQ __ATOMIC_SEQ_CST

#endif
