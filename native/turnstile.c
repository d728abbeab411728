/* Backup: turnstiles.  Calls that take a turn on an ordered object (a
 * lock acquisition, a transfer on a connection) wait here until the turn
 * before theirs is done, so that one object's turns follow the primary's
 * order while threads on different objects run concurrently. */
#include "replay_queues.h"

#include <sys/mman.h>

#include <stdio.h>
#include <time.h>

#include "atomics.h"

/* ---- turnstiles -----------------------------------------------------
 * One per ordered object.  A thread waiting for turn k parks on a word of
 * its own and registers (k, word) in a sleeper slot; the thread finishing
 * turn k-1 wakes exactly that sleeper.  Waking everyone, or waking on every
 * turn while anyone sleeps, costs a system call per acquisition. */

#define TS_BITS 20
#define TS_SLOTS (1u << TS_BITS)
#define SLEEPERS 6
struct sleeper {
    uint64_t want;                /* the "done" count this sleeper waits for */
    uint32_t *park;               /* its park word; NULL = free slot */
};
struct turnstile {
    uint64_t key;                 /* logical object id, 0 = free slot */
    uint64_t done;                /* turns completed */
    uintptr_t addr;               /* where the last turn acquired the object here */
    uint64_t stamp;               /* when (the taker's llft_thread.stamp) */
    uint32_t nsleepers;
    uint32_t overflowed;          /* of them, parked in the overflow table (no sleeper slot was free) */
    uint32_t crowd;               /* ...or not even there */
    uint32_t crowd_futex;
    uint16_t turn_count_seen;     /* dispatcher: a turn of this object was queued */
    uint16_t _pad;
    uint32_t last_tid;            /* dispatcher: thread of the last turn queued */
    struct sleeper sleepers[SLEEPERS];
};
static struct turnstile *turnstiles;
static uint32_t *ts_used;         /* indices of the turnstiles in use, in order of first use */
static uint32_t ts_nused;
static __thread uint32_t park_word TLS_IE;

static struct turnstile *ts_get(uint64_t obj)
{
    uint32_t i = (uint32_t)((obj * 0x9E3779B97F4A7C15ull) >> (64 - TS_BITS));
    for (uint32_t probes = 0; probes < TS_SLOTS; probes++, i = (i + 1) & (TS_SLOTS - 1)) {
        struct turnstile *ts = &turnstiles[i];
        uint64_t k = LOAD(&ts->key, ACQ);
        if (k == 0) {
            uint64_t zero = 0;
            if (__atomic_compare_exchange_n(&ts->key, &zero, obj, 0, __ATOMIC_ACQ_REL, ACQ)) {
                ts_used[__atomic_fetch_add(&ts_nused, 1, RLX)] = i;
                return ts;
            }
            k = zero;
        }
        if (k == obj)
            return ts;
    }
    llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "more than %u ordered objects", TS_SLOTS);
}

/* Waiters a turnstile's own sleeper slots cannot hold (a thread per
 * connection, thousands of them waiting on one lock): one table for all
 * turnstiles, each waiter in one of OVERFLOW_PROBE slots from the home of
 * (turnstile, turn), where the thread finishing the turn before looks.
 * Waking the whole crowd at every turn instead made a backup of 3,000
 * threads on one mutex crawl (every waiter woke for each turn). */
#define OVERFLOW_SLOTS (1u << 16)
#define OVERFLOW_PROBE 16
#define OVERFLOW_BUSY ((uintptr_t)1)   /* key while its waiter writes the entry */
struct overflow {
    uintptr_t key;                /* the turnstile's address; 0 = free */
    uint64_t want;
    uint32_t *park;
};
static struct overflow *overflow;

static inline uint32_t overflow_home(const struct turnstile *ts, uint64_t want)
{
    return (uint32_t)((((uintptr_t)ts >> 6) ^ (want * 0x9E3779B97F4A7C15ull)) * 0x9E3779B97F4A7C15ull >> 48) &
           (OVERFLOW_SLOTS - 1);
}

static struct overflow *overflow_register(const struct turnstile *ts, uint64_t want)
{
    uint32_t h = overflow_home(ts, want);
    for (uint32_t i = 0; i < OVERFLOW_PROBE; i++) {
        struct overflow *o = &overflow[(h + i) & (OVERFLOW_SLOTS - 1)];
        uintptr_t free_key = 0;
        if (LOAD(&o->key, RLX) == 0 &&
            __atomic_compare_exchange_n(&o->key, &free_key, OVERFLOW_BUSY, 0, ACQ, RLX)) {
            o->want = want;
            o->park = &park_word;
            STORE(&o->key, (uintptr_t)ts, REL);
            return o;
        }
    }
    return NULL;
}

static void overflow_wake(const struct turnstile *ts, uint64_t turn)
{
    uint32_t h = overflow_home(ts, turn);
    for (uint32_t i = 0; i < OVERFLOW_PROBE; i++) {
        const struct overflow *o = &overflow[(h + i) & (OVERFLOW_SLOTS - 1)];
        if (LOAD(&o->key, ACQ) == (uintptr_t)ts && o->want == turn) {
            __atomic_fetch_add(o->park, 1, SEQ);
            llft_futex_wake(o->park);
            return;
        }
    }
}

/* Parks until ts->done may equal want (or 50 ms pass).  Returns after a
 * wake-up, a timeout, or immediately if done moved meanwhile. */
static void park_until(struct turnstile *ts, uint64_t want)
{
    __atomic_fetch_add(&ts->nsleepers, 1, SEQ);
    struct sleeper *slot = NULL;
    for (int i = 0; i < SLEEPERS && !slot; i++) {
        uint32_t *none = NULL;
        if (!LOAD(&ts->sleepers[i].park, RLX)) {
            STORE(&ts->sleepers[i].want, want, SEQ);
            if (__atomic_compare_exchange_n(&ts->sleepers[i].park, &none, &park_word, 0, SEQ, RLX))
                slot = &ts->sleepers[i];
        }
    }
    struct overflow *o = NULL;
    if (!slot) {
        __atomic_fetch_add(&ts->overflowed, 1, SEQ);
        o = overflow_register(ts, want);
    }
    if (slot || o) {
        uint32_t v = LOAD(&park_word, SEQ);
        if (LOAD(&ts->done, SEQ) != want)
            llft_futex_wait(&park_word, v, 50);
        if (slot)
            STORE(&slot->park, NULL, SEQ);
        else
            STORE(&o->key, 0, REL);
    } else {
        uint32_t f = LOAD(&ts->crowd_futex, SEQ);
        __atomic_fetch_add(&ts->crowd, 1, SEQ);
        if (LOAD(&ts->done, SEQ) != want)
            llft_futex_wait(&ts->crowd_futex, f, 5);
        __atomic_fetch_sub(&ts->crowd, 1, SEQ);
    }
    if (!slot)
        __atomic_fetch_sub(&ts->overflowed, 1, SEQ);
    __atomic_fetch_sub(&ts->nsleepers, 1, SEQ);
}

void llft_turnstiles_reserve(void)
{
    turnstiles = llft_map_anon(sizeof(struct turnstile) * TS_SLOTS, "turnstiles");
    overflow = llft_map_anon(sizeof(struct overflow) * OVERFLOW_SLOTS, "turnstiles");
    ts_used = llft_map_anon(sizeof(uint32_t) * TS_SLOTS, "turnstiles");
}

/* A forked process's stream (fork_stream.c): no turn taken yet. */
void llft_turnstiles_forget_all(void)
{
    madvise(turnstiles, sizeof(struct turnstile) * TS_SLOTS, MADV_DONTNEED);
    madvise(overflow, sizeof(struct overflow) * OVERFLOW_SLOTS, MADV_DONTNEED);
    madvise(ts_used, sizeof(uint32_t) * TS_SLOTS, MADV_DONTNEED);
    ts_nused = 0;
}

/* Dispatcher, for a record that takes a turn: note which thread took the
 * previous turn and how many of its records precede this one in the
 * primary's stream.  The copy in the queue carries it in seq and check,
 * which are spent once the record has been validated. */
#define NO_HOLDER 0xffffffffu
void llft_annotate_turn(llft_rec_t *rec)
{
    struct turnstile *ts = ts_get(rec->obj);
    uint32_t prev = ts->turn_count_seen ? ts->last_tid : rec->tid;
    ts->turn_count_seen = 1;
    ts->last_tid = rec->tid;
    const struct tqueue *q = prev != rec->tid ? llft_queue_find(prev) : NULL;
    if (q == NULL || q->state != Q_LIVE) { /* none, itself, or ended: nothing to wait for */
        rec->check = NO_HOLDER;
        rec->seq = 0;
        return;
    }
    rec->check = (uint32_t)(q - llft_queues) | (uint32_t)q->gen << 16;   /* the slot, and which thread in it */
    rec->seq = q->pushed;
}

/* The previous holder may read memory the program shares without a lock
 * right after releasing (CPython reads its GIL drop request so).  At the
 * primary it had started each call recorded before this acquisition, so
 * here too: wait until it has taken those records. */
static void wait_previous_holder(struct llft_thread *t, const llft_rec_t *e)
{
    if (e->seq && e->check != NO_HOLDER)
        llft_wait_taken(t, e, e->check, e->seq);
}

/* For a stall report: whose queued record takes turn `turn` of obj, and
 * how far that thread is (the queues are read without the lock: a
 * report, not a decision). */
static void describe_turn_taker(uint64_t obj, uint64_t turn, char *out, size_t cap)
{
    snprintf(out, cap, "no thread here has that turn queued; %llu slots in the ring not dispatched%s",
             (unsigned long long)(llft_ring_head(llft_ring) - llft_ring_tail(llft_ring)),
             LOAD(&llft_stream_ended, ACQ) ? "; the stream has ended" : "");
    for (uint32_t i = 0; i < LOAD(&llft_nlive_slots, ACQ); i++) {
        const struct tqueue *q = &llft_queues[llft_live_slots[i]];
        if (q->rd_chunk == NULL)
            continue;
        if (q->rd > 0 && q->rd_chunk->recs[q->rd - 1].obj == obj && q->rd_chunk->recs[q->rd - 1].turn == turn) {
            snprintf(out, cap, "thread %u took its record (call #%u) and has not taken the turn", q->tid,
                     q->rd_chunk->recs[q->rd - 1].tn);
            return;
        }
        uint64_t seen = 0;
        for (const struct qchunk *c = q->rd_chunk; c != NULL; c = c->next) {
            uint32_t from = c == q->rd_chunk ? q->rd : 0, n = LOAD(&c->count, ACQ);
            for (uint32_t k = from; k < n; k++, seen++) {
                const llft_rec_t *r = &c->recs[k];
                if (r->op != LLFT_OP_DATA && r->obj == obj && r->turn == turn) {
                    snprintf(out, cap, "it is thread %u's call #%u, %llu record(s) ahead of where that thread is; "
                             "it has taken %llu of %llu", q->tid, r->tn, (unsigned long long)seen,
                             (unsigned long long)q->popped, (unsigned long long)q->pushed);
                    return;
                }
            }
        }
    }
}

struct turnstile *llft_turn_wait(struct llft_thread *t, const llft_rec_t *e)
{
    uint64_t obj = e->obj, turn = e->turn;
    struct turnstile *ts = ts_get(obj);
    uint64_t want = turn - 1;
    uint64_t d = LOAD(&ts->done, ACQ);
    if (LIKELY(d == want)) {
        wait_previous_holder(t, e);
        return ts;
    }
    t->depth++;
    struct llft_waited waited = {0, 0};
    for (unsigned spins = 0;; spins++) {
        if (d > want)
            llft_diverge(t, 0, NULL, LLFT_EXIT_DIVERGED,
                         "turn %llu of object %#llx is already taken (%llu turns done)",
                         (unsigned long long)turn, (unsigned long long)obj, (unsigned long long)d);
        if (spins < 64) {
            __builtin_ia32_pause();
        } else if (spins < 80) {
            llft_yield(); /* more threads than cores: let the turn's owner run */
        } else {
            uint64_t waited_ms = llft_waited_ms(&waited);
            if (LOAD(&llft_stream_ended, ACQ) ? llft_end_grace_over() : waited_ms > llft_ctl->stall_timeout_ms) {
                char who[160];
                describe_turn_taker(obj, d + 1, who, sizeof who);
                llft_diverge(t, 0, NULL, LLFT_EXIT_DIVERGED,
                             "stalled %llu ms waiting for turn %llu of object %#llx (%llu turns done): "
                             "the thread that should take the previous turn never did (%s)",
                             (unsigned long long)waited_ms, (unsigned long long)turn,
                             (unsigned long long)obj, (unsigned long long)d, who);
            }
            park_until(ts, want);
        }
        d = LOAD(&ts->done, ACQ);
        if (d == want)
            break;
    }
    wait_previous_holder(t, e);
    t->depth--;
    return ts;
}

void llft_turn_done(const struct llft_thread *t, struct turnstile *ts, const void *addr, uint64_t turn)
{
    /* Plain stores to a line written anyway; llft_adopt_objects reads them once
     * the finished counts, counted after them, say every turn is done. */
    ts->addr = (uintptr_t)addr;
    ts->stamp = t->stamp;
    STORE(&ts->done, turn, SEQ);
    STORE(&t->q->finished, t->q->finished + 1, REL);
    if (LIKELY(LOAD(&ts->nsleepers, SEQ) == 0))
        return;
    for (int i = 0; i < SLEEPERS; i++) {
        uint32_t *p = LOAD(&ts->sleepers[i].park, SEQ);
        if (p && LOAD(&ts->sleepers[i].want, SEQ) == turn) {
            __atomic_fetch_add(p, 1, SEQ);
            llft_futex_wake(p);
        }
    }
    if (LOAD(&ts->overflowed, SEQ))
        overflow_wake(ts, turn);
    if (LOAD(&ts->crowd, SEQ)) {
        __atomic_fetch_add(&ts->crowd_futex, 1, SEQ);
        llft_futex_wake(&ts->crowd_futex);
    }
}

/* At the takeover, with every replayed turn done and no thread acquiring
 * natively yet: the lock table (objtable.c) gets each object at the address
 * of its last acquisition here, with the turns taken, so that this replica
 * continues the failed primary's identities and turn numbers.  Where two
 * objects were acquired at one address here (a lock freed and another made
 * there, which the primary had elsewhere), the later one keeps it. */
void llft_adopt_objects(void)
{
    uint32_t n = LOAD(&ts_nused, ACQ);
    for (uint32_t k = 0; k < n; k++) {
        const struct turnstile *ts = &turnstiles[ts_used[k]];
        if (!ts->addr)
            continue;
        struct llft_obj *o = llft_obj_at((const void *)ts->addr, ts->key);
        uint64_t other = LOAD(&o->id, ACQ);
        if (other != ts->key && ts_get(other)->stamp > ts->stamp)
            continue;
        STORE(&o->id, ts->key, REL);
        STORE(&o->turns, ts->done, RLX);
    }
}


/* A copy of the primary becoming a backup (demote.c), the reverse of
 * llft_adopt_objects: each object's turnstile starts where the primary's
 * lock table says its turns are, every turn taken so far done (the
 * primary was held: none was under way). */
static void start_from(const struct llft_obj *o)
{
    struct turnstile *ts = ts_get(o->id);
    ts->addr = o->addr;
    ts->turn_count_seen = 0;
    STORE(&ts->done, LOAD(&o->turns, RLX), REL);
}

void llft_turnstiles_from_objects(void)
{
    llft_obj_each(start_from);
}
