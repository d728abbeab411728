/* Primary: appending OrderInfo records.  The hot path is one atomic add, a
 * 64-byte store and a release store; no system call unless the ring is full
 * or the controller sleeps. */
#include "shim.h"

#include <string.h>

static inline void ring_bell(llft_ring_t *r)
{
    if (UNLIKELY(__atomic_load_n(&r->consumer_waiting, __ATOMIC_RELAXED)))
        llft_ring_doorbell(r);
}

void llft_record(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn,
                 int64_t ret, int32_t err, int64_t val)
{
    llft_record_aux(t, op, obj, turn, ret, err, val, 0);
}

static inline void fill(llft_rec_t *s, struct llft_thread *t, uint16_t op, uint16_t nslots, uint64_t obj,
                        uint64_t turn, int64_t ret, int32_t err, int64_t val, uint32_t aux)
{
    s->op = op;
    s->nslots = nslots;
    s->tid = t->tid;
    s->tn = ++t->tn;
    s->obj = obj;
    s->turn = turn;
    s->ret = ret;
    s->err = err;
    s->aux = aux;
    s->val = val;
}

void llft_record_aux(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn,
                     int64_t ret, int32_t err, int64_t val, uint32_t aux)
{
    llft_ring_t *r = llft_ring;
    t->depth++;
    uint64_t pos = llft_ring_reserve(r, 1, &t->cached_tail);
    llft_rec_t *s = llft_ring_slot(r, pos);
    /* The controller read this line a lap ago: fetch lines ahead for writing. */
    __builtin_prefetch(llft_ring_slot(r, pos + 8), 1, 3);
    fill(s, t, op, 1, obj, turn, ret, err, val, aux);
    llft_ring_commit(s, pos);
    ring_bell(r);
    t->depth--;
}

void llft_record_data(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn, int64_t ret,
                      int32_t err, const void *buf, uint64_t len)
{
    llft_record_data_aux(t, op, obj, turn, ret, err, buf, len, 0);
}

void llft_record_data_aux(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn, int64_t ret,
                          int32_t err, const void *buf, uint64_t len, uint32_t aux)
{
    llft_ring_t *r = llft_ring;
    uint32_t nd = llft_data_slots(len);
    t->depth++;
    uint64_t pos = llft_ring_reserve(r, 1 + nd, &t->cached_tail);
    llft_rec_t *s = llft_ring_slot(r, pos);
    fill(s, t, op, (uint16_t)(1 + nd), obj, turn, ret, err, (int64_t)len, aux);
    for (uint32_t i = 0; i < nd; i++) {
        llft_data_t *d = llft_ring_slot(r, pos + 1 + i);
        uint64_t off = (uint64_t)i * LLFT_DATA_BYTES;
        uint16_t n = (uint16_t)(len - off < LLFT_DATA_BYTES ? len - off : LLFT_DATA_BYTES);
        d->op = LLFT_OP_DATA;
        d->len = n;
        memset(d->bytes, 0, sizeof d->bytes);
        memcpy(d->bytes, (const char *)buf + off, n);
        llft_ring_commit(d, pos + 1 + i);
    }
    llft_ring_commit(s, pos);
    ring_bell(r);
    t->depth--;
}
