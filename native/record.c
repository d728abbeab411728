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
    llft_lease_check();
    t->depth++;
    uint64_t pos = llft_ring_reserve(r, 1, &t->cached_tail);
    t->ring_end = pos + 1;
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
    llft_lease_check();
    t->depth++;
    uint64_t pos = llft_ring_reserve(r, 1 + nd, &t->cached_tail);
    t->ring_end = pos + 1 + nd;
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

/* Output commit.  Threads reserve ring slots and commit them a few stores
 * later, in any order; when the primary dies, the record pump forwards the
 * committed slots up to the first one that is not, and the rest are lost
 * (the pump cannot skip a hole: a later record may take the turn after the
 * lost one).  A thread preempted between the two, which on a busy machine
 * lasts milliseconds, so cuts the stream before records other threads
 * committed meanwhile, and those threads return and go on.  If one of
 * them then sends a client a reply, the new primary makes every call after
 * the cut again, in its own interleaving: pool_server's workers took their
 * counts in another order, and a client that had the old primary's reply
 * got a count twice, or a reply cut short where the lengths differed.  So
 * a primary's thread sends to a client only once every slot up to its own
 * last record is committed: a cut then falls after every record the reply
 * depends on, and what the new primary does again is the reply itself,
 * byte for byte.  committed_upto is a hint shared by the threads: every
 * slot before it is committed or consumed; it only grows, so each slot is
 * looked at about once. */
static uint64_t committed_upto;

void llft_wait_committed(struct llft_thread *t)
{
    uint64_t want = t->ring_end, p = __atomic_load_n(&committed_upto, __ATOMIC_ACQUIRE);
    if (LIKELY(p >= want))
        return;
    llft_ring_t *r = llft_ring;
    unsigned spins = 0;
    t->depth++;
    while (p < want) {
        uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
        if (p < tail) {
            p = tail;   /* consumed, so committed (the slot may hold a later lap's record now) */
            continue;
        }
        const llft_rec_t *s = llft_ring_slot(r, p);
        if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) == p + 1) {
            p++;
            spins = 0;
            continue;
        }
        /* Another thread is between reserving this slot and committing it. */
        if (++spins < 64) {
            __builtin_ia32_pause();
        } else if (spins < 128) {
            llft_yield();
        } else {
            struct timespec d = {0, 50000};
            llft_nap(&d);
        }
    }
    uint64_t cur = __atomic_load_n(&committed_upto, __ATOMIC_RELAXED);
    while (cur < p && !__atomic_compare_exchange_n(&committed_upto, &cur, p, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
    t->depth--;
}
