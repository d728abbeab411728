/* A map from 64-bit ids (1 .. UINT64_MAX - 1) to pointers: open
 * addressing, linear probing.  The data plane keeps its live connections
 * in one, so that what it holds follows the connections open, not every
 * connection ever made.  Not thread-safe; not part of the preload library. */
#ifndef LLFT_IDMAP_H
#define LLFT_IDMAP_H

#include <stdint.h>

typedef struct {
    uint64_t *keys;   /* 0: empty; IDMAP_GONE: deleted */
    void **vals;
    uint64_t cap;     /* a power of two, or 0 */
    uint64_t live;    /* ids in the map */
    uint64_t used;    /* slots not empty (live + deleted) */
} llft_idmap_t;

#define IDMAP_GONE UINT64_MAX

void *llft_idmap_get(const llft_idmap_t *m, uint64_t id);
/* 0, or -1 when memory ran out.  id must not be in the map. */
int llft_idmap_put(llft_idmap_t *m, uint64_t id, void *val);
void llft_idmap_del(llft_idmap_t *m, uint64_t id);
void llft_idmap_free(llft_idmap_t *m);

/* Visits each live entry: slot i holds one if keys[i] is neither 0 nor
 * IDMAP_GONE.  Deleting the visited entry during the visit is allowed;
 * putting is not. */
static inline int llft_idmap_at(const llft_idmap_t *m, uint64_t i)
{
    return m->keys[i] != 0 && m->keys[i] != IDMAP_GONE;
}

#endif
