/* Backup: the per-thread replay queues (replay.c's dispatcher fills them
 * from the ring, each thread consumes its own) and the chunk pool they are
 * made of.  Pushing and taking are inline in replay_queues.h: they are on
 * the replay path of every record. */
#include "replay_queues.h"

#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "atomics.h"

void *llft_map_anon(size_t bytes, const char *what)
{
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        llft_log("llft: cannot allocate %s", what);
        llft_exit_now(LLFT_EXIT_NOSTREAM);
    }
    return m;
}

/* ---- chunk pool ----------------------------------------------------- */
/* The pool is one region reserved at start-up (pages are touched only as
 * used): mapping memory while replaying, whenever the dispatcher happens to
 * need it, would move the program's own later mappings, and programs let
 * addresses steer behaviour (hash tables of pointers). */
#define POOL_CHUNKS (1u << 16) /* 1 GiB of address space */
static uint32_t pool_lock;
static struct qchunk *pool_free_list, *pool_base;
static uint32_t pool_used;

struct qchunk *llft_chunk_alloc(void)
{
    spin_lock(&pool_lock);
    struct qchunk *c = pool_free_list;
    if (c)
        pool_free_list = c->next;
    else if (pool_used < POOL_CHUNKS)
        c = &pool_base[pool_used++];
    spin_unlock(&pool_lock);
    if (!c)
        llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "more than %u replay queue chunks: the backup is too far "
                     "behind its primary", POOL_CHUNKS);
    c->next = NULL;
    c->count = 0;
    return c;
}

void llft_chunk_free(struct qchunk *c)
{
    spin_lock(&pool_lock);
    c->next = pool_free_list;
    pool_free_list = c;
    spin_unlock(&pool_lock);
}

/* ---- per-thread queues --------------------------------------------------
 * Slots of a fixed table, found from the thread id (tid & mask, then the
 * next ones): threads are numbered in creation order, one per client
 * connection in many servers, and an ended thread's slot is taken again
 * by a later one, so that what a backup holds follows the threads alive,
 * not every thread the program ever made.  An ended thread's slot says so
 * until it is taken again (a record for it then is a divergence). */

struct tqueue *llft_queues;
uint32_t *llft_live_slots;        /* slots of the live queues, in no order (dispatch lock) */
uint32_t llft_nlive_slots;

struct tqueue *llft_queue_new(uint32_t tid)
{
    struct tqueue *q = NULL;
    for (uint32_t i = 0; i < QSLOTS && q == NULL; i++) {
        struct tqueue *c = &llft_queues[(tid + i) & QMASK];
        if (c->state != Q_LIVE)
            q = c;   /* free, or an ended thread's */
    }
    if (q == NULL)
        llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "more than %u threads at once", QSLOTS);
    q->rd_chunk = q->wr_chunk = llft_chunk_alloc();
    q->rd = 0;
    q->pushed = q->popped = q->to_finish = q->finished = 0;
    q->tid = tid;
    q->gen++;
    llft_live_slots[llft_nlive_slots++] = (uint32_t)(q - llft_queues);
    STORE(&q->state, Q_LIVE, REL);
    return q;
}

/* Records taken and calls ended by threads whose queues have ended: with
 * the live queues' counts, a measure of progress that never goes back. */
static uint64_t retired_progress;   /* (dispatch lock) */

void llft_queue_ended(struct tqueue *q)
{
    retired_progress += q->popped + LOAD(&q->finished, RLX);
    for (struct qchunk *c = q->rd_chunk; c;) {
        struct qchunk *n = c->next;
        llft_chunk_free(c);
        c = n;
    }
    q->rd_chunk = q->wr_chunk = NULL;
    uint32_t slot = (uint32_t)(q - llft_queues);
    for (uint32_t i = 0; i < llft_nlive_slots; i++)
        if (llft_live_slots[i] == slot) {
            llft_live_slots[i] = llft_live_slots[--llft_nlive_slots];
            break;
        }
    STORE(&q->state, Q_DEAD, REL);
}

void llft_queues_reset(void)
{
    for (uint32_t i = 0; i < QSLOTS; i++) {
        struct tqueue *q = &llft_queues[i];
        if (q->state != Q_FREE) {
            q->rd_chunk = q->wr_chunk = NULL;
            STORE(&q->state, Q_FREE, REL);   /* (gen goes on: a stale slot|gen never matches) */
        }
    }
    llft_nlive_slots = 0;
    retired_progress = 0;
    spin_lock(&pool_lock);
    pool_free_list = NULL;
    pool_used = 0;
    spin_unlock(&pool_lock);
}

void llft_queues_reserve(void)
{
    llft_queues = llft_map_anon(sizeof(struct tqueue) * QSLOTS, "replay queues");
    llft_live_slots = llft_map_anon(sizeof(uint32_t) * QSLOTS, "replay queues");
    pool_base = llft_map_anon(sizeof(struct qchunk) * POOL_CHUNKS, "replay queues");
}

/* ---- reading the queues ---------------------------------------------- */

/* For a divergence report: up to max of the calls this thread replayed
 * last, newest first (the record in hand among them, when consumed):
 * what is left of them in its queue's current chunk, read back, data
 * slots skipped.  Nothing on the replay path keeps them for this. */
int llft_replay_recent(const struct llft_thread *t, llft_rec_t *out, int max)
{
    const struct tqueue *q = t ? t->q : NULL;
    if (!q || !q->rd_chunk)
        return 0;
    int n = 0;
    for (int i = (int)q->rd - 1; i >= 0 && n < max; i--)
        if (q->rd_chunk->recs[i].op != LLFT_OP_DATA)
            out[n++] = q->rd_chunk->recs[i];
    return n;
}

/* Waits until the thread of queue slot|gen<<16 (slotgen) has taken `upto`
 * slots of its queue, or has ended (its slot taken by a later thread, which
 * means it took all). */
void llft_wait_taken(struct llft_thread *t, const llft_rec_t *e, uint32_t slotgen, uint64_t upto)
{
    const struct tqueue *q = &llft_queues[slotgen & QMASK];
    uint16_t gen = (uint16_t)(slotgen >> 16);
    struct llft_waited waited = {0, 0};
    for (unsigned spins = 0; LOAD(&q->gen, ACQ) == gen && LOAD(&q->popped, ACQ) < upto; spins++) {
        if (spins < 64) {
            __builtin_ia32_pause();
        } else if (spins < 80) {
            llft_yield();
        } else {
            if (llft_waited_ms(&waited) > llft_ctl->stall_timeout_ms)
                llft_diverge(t, e->op, e, LLFT_EXIT_DIVERGED,
                             "stalled waiting for thread %u to reach its call before this one (it has taken %llu "
                             "of its records, %llu of them by then; it %s)", q->tid,
                             (unsigned long long)q->popped, (unsigned long long)upto,
                             q->state == Q_DEAD ? "has ended" : "runs");
            struct timespec us = {0, 50000};
            llft_nap(&us);
        }
    }
}

/* ---- censuses of the live queues (each takes the dispatch lock) ---- */

uint32_t llft_dispatch_lock;

/* Every thread but except's (NULL: every thread) has taken every record
 * queued for it and ended every call that must_finish.  Before a takeover
 * nothing is queued any more (the dispatcher has stopped at PROMOTE), so
 * a thread found finished stays so: no native acquisition can then
 * overtake a replayed one. */
int llft_queues_replayed(const struct tqueue *except)
{
    int all = 1;
    spin_lock(&llft_dispatch_lock);
    for (uint32_t i = 0; i < llft_nlive_slots && all; i++) {
        const struct tqueue *q = &llft_queues[llft_live_slots[i]];
        if (q != except && (LOAD(&q->popped, ACQ) != q->pushed ||
                            LOAD(&q->finished, ACQ) != LOAD(&q->to_finish, RLX)))
            all = 0;
    }
    spin_unlock(&llft_dispatch_lock);
    return all;
}

/* Records the threads have taken and calls they have ended, those of
 * ended threads included (a sum over the live queues alone goes back as
 * threads end, and could come back to a value seen seconds before): while
 * this moves, the replica is still replaying. */
uint64_t llft_queues_progress(void)
{
    spin_lock(&llft_dispatch_lock);
    uint64_t n = retired_progress;
    for (uint32_t i = 0; i < llft_nlive_slots; i++) {
        const struct tqueue *q = &llft_queues[llft_live_slots[i]];
        n += LOAD(&q->popped, ACQ) + LOAD(&q->finished, ACQ);
    }
    spin_unlock(&llft_dispatch_lock);
    return n;
}
