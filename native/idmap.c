/* The data plane's id map (idmap.h). */
#include "idmap.h"

#include <stdlib.h>

static uint64_t slot_of(uint64_t id, uint64_t cap) { return (id * 0x9E3779B97F4A7C15ull) & (cap - 1); }

void *llft_idmap_get(const llft_idmap_t *m, uint64_t id)
{
    if (m->cap == 0)
        return NULL;
    for (uint64_t i = slot_of(id, m->cap), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        if (m->keys[i] == id)
            return m->vals[i];
        if (m->keys[i] == 0)
            return NULL;
    }
    return NULL;
}

/* Rebuilt at cap, without the deleted slots. */
static int rebuild(llft_idmap_t *m, uint64_t cap)
{
    uint64_t *keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return -1;
    }
    for (uint64_t i = 0; i < m->cap; i++)
        if (llft_idmap_at(m, i)) {
            uint64_t j = slot_of(m->keys[i], cap);
            while (keys[j] != 0)
                j = (j + 1) & (cap - 1);
            keys[j] = m->keys[i];
            vals[j] = m->vals[i];
        }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->used = m->live;
    return 0;
}

int llft_idmap_put(llft_idmap_t *m, uint64_t id, void *val)
{
    if ((m->used + 1) * 4 > m->cap * 3) { /* at most three quarters full, deleted slots included */
        uint64_t cap = m->cap ? m->cap : 64;
        while ((m->live + 1) * 2 > cap)
            cap *= 2;
        if (rebuild(m, cap) < 0)
            return -1;
    }
    uint64_t i = slot_of(id, m->cap);
    while (llft_idmap_at(m, i))
        i = (i + 1) & (m->cap - 1);
    if (m->keys[i] == 0)
        m->used++;
    m->keys[i] = id;
    m->vals[i] = val;
    m->live++;
    return 0;
}

void llft_idmap_del(llft_idmap_t *m, uint64_t id)
{
    if (m->cap == 0)
        return;
    for (uint64_t i = slot_of(id, m->cap), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        if (m->keys[i] == id) {
            m->keys[i] = IDMAP_GONE;
            m->vals[i] = NULL;
            m->live--;
            return;
        }
        if (m->keys[i] == 0)
            return;
    }
}

void llft_idmap_free(llft_idmap_t *m)
{
    free(m->keys);
    free(m->vals);
    *m = (llft_idmap_t){0};
}
