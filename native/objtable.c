/* Primary only (a backup fills it when it takes over: replay.c): maps a
 * lock's address to its logical identity and turn counter.  The identity
 * is the (T, N) of the first recorded call that touched it, so it never
 * carries an address to the backups.  Open addressing, insert-only,
 * lock-free; a destroyed lock keeps its entry and a new lock at the same
 * address continues its order, which is harmless: the old one can no
 * longer be used. */
#include "shim.h"

#include <sys/mman.h>
#include <unistd.h>

#define OBJ_BITS 22
#define OBJ_SLOTS (1u << OBJ_BITS)

static struct llft_obj *table;
static struct llft_obj *table_get_slow(void);

/* Called at start-up in every role (core.c): see llft_replay_reserve. */
void llft_obj_reserve(void)
{
    (void)table_get_slow();
}

static struct llft_obj *table_get(void)
{
    struct llft_obj *t = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
    return LIKELY(t) ? t : table_get_slow();
}

static struct llft_obj *table_get_slow(void)
{
    void *m = mmap(NULL, sizeof(struct llft_obj) * OBJ_SLOTS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        llft_log("llft: cannot allocate the lock table");
        llft_exit_now(LLFT_EXIT_NOSTREAM);
    }
    struct llft_obj *expected = NULL;
    if (!__atomic_compare_exchange_n(&table, &expected, m, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct llft_obj) * OBJ_SLOTS);
        return expected;
    }
    return m;
}

static inline uint32_t hash_addr(uintptr_t a)
{
    uint64_t x = (uint64_t)a * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> (64 - OBJ_BITS));
}

struct llft_obj *llft_obj_get(const void *addr, const struct llft_thread *t)
{
    /* The record being written is this thread's call #tn+1. */
    return llft_obj_at(addr, ((uint64_t)t->tid << 32) | (uint64_t)(t->tn + 1));
}

/* A backup does not use this table while it replays: it fills it when it
 * takes over (replay.c, adopt_objects), so that it goes on with the failed
 * primary's identities and turn numbers, and its backups keep ordering
 * them. */
struct llft_obj *llft_obj_at(const void *addr, uint64_t new_id)
{
    struct llft_obj *tab = table_get();
    uintptr_t a = (uintptr_t)addr;
    uint32_t i = hash_addr(a);
    for (uint32_t probes = 0; probes < OBJ_SLOTS; probes++, i = (i + 1) & (OBJ_SLOTS - 1)) {
        struct llft_obj *o = &tab[i];
        uintptr_t k = __atomic_load_n(&o->addr, __ATOMIC_ACQUIRE);
        if (k == 0) {
            uintptr_t zero = 0;
            if (__atomic_compare_exchange_n(&o->addr, &zero, a, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_store_n(&o->id, new_id, __ATOMIC_RELEASE);
                return o;
            }
            k = zero;
        }
        if (k == a) {
            while (UNLIKELY(__atomic_load_n(&o->id, __ATOMIC_ACQUIRE) == 0))
                __builtin_ia32_pause(); /* its inserter is writing the id */
            return o;
        }
    }
    llft_log("llft: more than %u distinct locks; cannot order more", OBJ_SLOTS);
    llft_exit_now(LLFT_EXIT_NOSTREAM);
}

/* A forked process's stream starts with no object known: the parent's
 * identities are (T, N) of the parent's stream, and would meet the
 * child's own (fork_stream.c).  The pages go back zeroed. */
void llft_obj_forget_all(void)
{
    madvise(table_get(), sizeof(struct llft_obj) * OBJ_SLOTS, MADV_DONTNEED);
}

/* Each object in the table (a copy of the primary becoming a backup:
 * demote.c). */
void llft_obj_each(void (*visit)(const struct llft_obj *o))
{
    struct llft_obj *tab = table_get();
    for (uint32_t i = 0; i < OBJ_SLOTS; i++)
        if (__atomic_load_n(&tab[i].addr, __ATOMIC_ACQUIRE) && __atomic_load_n(&tab[i].id, __ATOMIC_ACQUIRE))
            visit(&tab[i]);
}
