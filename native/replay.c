/* Backup: replaying the primary's OrderInfo stream (LLFT Fig. 11, right).
 *
 * The controller writes the primary's records, in the primary's order, into
 * this replica's ring.  Whichever application thread needs a record and
 * finds its own queue empty becomes the dispatcher for a moment: it moves
 * every available record into the queue of the thread that made it (the T
 * of (T, O, N, D)).  A thread then consumes its own records in N order.
 * Calls that take a turn on an object (lock acquisitions) also wait on that
 * object's turnstile until the previous turn is done, so acquisitions of one
 * lock happen in the primary's order while threads using different locks
 * run concurrently.  The shim's own locks are spinlocks: it never calls the
 * functions it wraps. */
#include "shim.h"

#include <limits.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "atomics.h"

static void *map_anon(size_t bytes, const char *what)
{
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        llft_log("llft: cannot allocate %s", what);
        llft_exit_now(LLFT_EXIT_NOSTREAM);
    }
    return m;
}

/* ---- chunk pool ----------------------------------------------------- */

#define CHUNK_RECS 255
struct qchunk {
    struct qchunk *next;
    uint32_t count;               /* records written (release-published) */
    uint32_t _pad[13];
    llft_rec_t recs[CHUNK_RECS];
};

/* The pool is one region reserved at start-up (pages are touched only as
 * used): mapping memory while replaying, whenever the dispatcher happens to
 * need it, would move the program's own later mappings, and programs let
 * addresses steer behaviour (hash tables of pointers). */
#define POOL_CHUNKS (1u << 16) /* 1 GiB of address space */
static uint32_t pool_lock;
static struct qchunk *pool_free_list, *pool_base;
static uint32_t pool_used;

static struct qchunk *chunk_alloc(void)
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

static void chunk_free(struct qchunk *c)
{
    spin_lock(&pool_lock);
    c->next = pool_free_list;
    pool_free_list = c;
    spin_unlock(&pool_lock);
}

/* ---- per-thread queues ---------------------------------------------
 * Slots of a fixed table, found from the thread id (tid & mask, then the
 * next ones): threads are numbered in creation order, one per client
 * connection in many servers, and an ended thread's slot is taken again
 * by a later one, so that what a backup holds follows the threads alive,
 * not every thread the program ever made.  An ended thread's slot says so
 * until it is taken again (a record for it then is a divergence). */

#define QSLOTS (1u << 16)         /* threads alive at once, at most */
#define QMASK (QSLOTS - 1)
enum { Q_FREE = 0, Q_LIVE = 1, Q_DEAD = 2 };

struct tqueue {
    struct qchunk *rd_chunk;      /* consumer (the owning thread) */
    uint32_t rd;
    uint32_t state;
    struct qchunk *wr_chunk;      /* producer (the dispatcher) */
    uint64_t pushed;              /* slots the dispatcher queued for this thread */
    uint64_t popped;              /* slots this thread has taken (calls it has started) */
    uint64_t to_finish;           /* of those, calls that must end before a takeover (must_finish) */
    uint64_t finished;            /* ...that this thread has ended (try_promote reads these) */
    uint32_t tid;                 /* whose queue this slot is (state != Q_FREE) */
    uint16_t gen;                 /* times the slot was taken: tells a later thread's from this one's */
    uint16_t _pad;
};

static struct tqueue *queues;
static uint32_t *live_slots;      /* slots of the live queues, in no order (dispatch lock) */
static uint32_t nlive_slots;
static uint32_t dispatch_lock;
static uint32_t epoch;            /* bumped after each dispatch that moved records */
static uint32_t epoch_waiters;    /* threads asleep on it, each with its bit (tid_bit) */
static uint32_t wake_bits;        /* whom the records drain() moved are for (dispatch lock held) */
static uint32_t stream_ended;
static uint32_t exec_barrier;     /* records past an execve belong to the next image */
static uint32_t promote_pending;  /* the failed primary's stream ends here: take over once drained */
static uint32_t max_tid;          /* highest thread id the primary used or created */
static uint64_t stream_ended_ms;
static int64_t primary_status = -1; /* END's: the primary program's exit status, -1 if unknown */
static uint32_t live_threads;     /* threads replaying here: started and not ended */
static uint32_t stopped;          /* of those, stopped for good (stop_for_good) */
static uint32_t stopped_futex;    /* bumped when either count changes */

/* A thread sleeps on the epoch with one bit of 32, and a dispatch wakes
 * only the threads it queued records for: waking every sleeper at every
 * dispatch woke all of a backup's threads (one per client connection in
 * many servers) for each request, to find nothing and sleep again.
 * Threads that share a bit wake each other for nothing now and then, and
 * look again. */
static inline uint32_t tid_bit(uint32_t tid) { return 1u << (tid & 31); }
#define ALL_THREADS (~0u)

/* tid's queue (live or ended), or NULL (dispatch lock held). */
static struct tqueue *queue_find(uint32_t tid)
{
    for (uint32_t i = 0; i < QSLOTS; i++) {
        struct tqueue *q = &queues[(tid + i) & QMASK];
        if (q->state == Q_FREE)
            return NULL;
        if (q->tid == tid)
            return q;
    }
    return NULL;
}

static struct tqueue *queue_for(uint32_t tid) /* dispatch lock held */
{
    struct tqueue *q = queue_find(tid);
    if (q != NULL)
        return q;
    for (uint32_t i = 0; i < QSLOTS && q == NULL; i++) {
        struct tqueue *c = &queues[(tid + i) & QMASK];
        if (c->state != Q_LIVE)
            q = c;   /* free, or an ended thread's */
    }
    if (q == NULL)
        llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "more than %u threads at once", QSLOTS);
    q->rd_chunk = q->wr_chunk = chunk_alloc();
    q->rd = 0;
    q->pushed = q->popped = q->to_finish = q->finished = 0;
    q->tid = tid;
    q->gen++;
    live_slots[nlive_slots++] = (uint32_t)(q - queues);
    STORE(&q->state, Q_LIVE, REL);
    return q;
}

/* The thread of q has ended (dispatch lock held). */
static void queue_ended(struct tqueue *q)
{
    uint32_t slot = (uint32_t)(q - queues);
    for (uint32_t i = 0; i < nlive_slots; i++)
        if (live_slots[i] == slot) {
            live_slots[i] = live_slots[--nlive_slots];
            break;
        }
    STORE(&q->state, Q_DEAD, REL);
}

static void q_push(struct tqueue *q, const void *rec) /* dispatch lock held */
{
    struct qchunk *c = q->wr_chunk;
    if (c->count == CHUNK_RECS) {
        struct qchunk *n = chunk_alloc();
        STORE(&c->next, n, REL);
        q->wr_chunk = c = n;
    }
    memcpy(&c->recs[c->count], rec, LLFT_REC_SIZE);
    STORE(&c->count, c->count + 1, REL);
    q->pushed++;
}

/* A replayed call that must end before this replica takes over, or a
 * native call could contradict it: a turn (a native acquisition would
 * overtake it).  New fds and accepts take turns and end them once their
 * numbers are placed: a native socket() or accept() would otherwise take
 * the lowest free number, which the replaying thread is about to claim,
 * and the new primary would record that number twice, in an order its
 * backups cannot follow. */
static inline int must_finish(const llft_rec_t *r)
{
    return r->op != LLFT_OP_DATA && r->turn;
}

/* The thread's next record into out: taken (consume), or only looked at. */
static int q_take(struct tqueue *q, llft_rec_t *out, int consume)
{
    struct qchunk *c = q->rd_chunk;
    if (q->rd == CHUNK_RECS) {
        struct qchunk *n = LOAD(&c->next, ACQ);
        if (!n)
            return 0;
        q->rd_chunk = n;
        q->rd = 0;
        chunk_free(c);
        c = n;
    }
    if (q->rd >= LOAD(&c->count, ACQ))
        return 0;
    memcpy(out, &c->recs[q->rd], LLFT_REC_SIZE);
    if (!consume)
        return 1;
    q->rd++;
    /* Counted before the record counts as taken, so that try_promote never
     * sees every record taken and this call not pending.  Only this thread
     * writes these counts: the hot path shares no line. */
    if (must_finish(out))
        STORE(&q->to_finish, q->to_finish + 1, RLX);
    STORE(&q->popped, q->popped + 1, REL);
    return 1;
}

static int q_pop(struct tqueue *q, llft_rec_t *out) { return q_take(q, out, 1); }

/* ---- dispatcher ----------------------------------------------------- */

static __attribute__((noreturn)) void corrupt_stream(uint64_t pos, int why)
{
    llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "record %llu of the stream is %s",
                 (unsigned long long)pos, why == LLFT_REC_CORRUPT ? "corrupt (torn or altered)" : "malformed");
}

static void annotate_turn(llft_rec_t *rec);
static inline int event_wait_op(uint16_t op);
static void annotate_wait(llft_rec_t *rec, const struct tqueue *self);
static void wait_for_earlier_calls(struct llft_thread *t, const llft_rec_t *e);

/* Mutex acquisitions only: their turns follow the stream order, which the
 * annotation's freedom from deadlock rests on.  Concurrent rwlock readers
 * take turns in one order and record them in another. */
static inline int exclusive_op(uint16_t op)
{
    return op == LLFT_OP_MUTEX_LOCK || op == LLFT_OP_MUTEX_TRYLOCK || op == LLFT_OP_MUTEX_TIMEDLOCK ||
           op == LLFT_OP_COND_WAIT || op == LLFT_OP_COND_TIMEDWAIT;
}

/* Moves every complete record group from the ring into thread queues.
 * Called with the dispatch lock held; returns slots moved. */
static long drain(void)
{
    llft_ring_t *r = llft_ring;
    uint64_t tail = LOAD(&r->tail, RLX), start = tail;
    while (tail - start < 4096 && !exec_barrier && !promote_pending) {
        const llft_rec_t *h = llft_ring_slot(r, tail);
        int v = llft_rec_validate(h, tail + 1);
        if (v == LLFT_REC_PENDING)
            break;
        if (v != LLFT_REC_OK || h->op == LLFT_OP_DATA)
            corrupt_stream(tail, v != LLFT_REC_OK ? v : LLFT_REC_BADFIELD);
        if (h->op == LLFT_OP_END) {
            wake_bits = ALL_THREADS; /* each looks whether it stops here */
            primary_status = h->ret;
            stream_ended_ms = llft_now_ms();
            STORE(&stream_ended, 1, REL);
            tail++;
            continue;
        }
        if (h->op == LLFT_OP_PROMOTE) {
            wake_bits = ALL_THREADS;
            STORE(&promote_pending, 1, REL);
            tail++;
            break; /* nothing follows: from here this replica writes the ring */
        }
        if (h->tid > max_tid)
            max_tid = h->tid;
        /* A thread the primary created counts as used even if the primary
         * failed before that thread recorded anything: it runs here too,
         * under that id, and once promoted records under it.  Without this
         * the new primary's next pthread_create would hand the same id out
         * again (llft_next_tid = max_tid + 1), and the backups would get two
         * threads' calls, each numbered from #1, in one thread's queue. */
        if (h->op == LLFT_OP_THREAD_CREATE && h->ret == 0 && h->val > (int64_t)max_tid && h->val <= (int64_t)UINT32_MAX)
            max_tid = (uint32_t)h->val;
        uint32_t n = h->nslots, i;
        for (i = 1; i < n; i++) {
            const llft_rec_t *d = llft_ring_slot(r, tail + i);
            int dv = llft_rec_validate(d, tail + i + 1);
            if (dv == LLFT_REC_PENDING)
                break;
            if (dv != LLFT_REC_OK || d->op != LLFT_OP_DATA)
                corrupt_stream(tail + i, dv != LLFT_REC_OK ? dv : LLFT_REC_BADFIELD);
        }
        if (i < n)
            break;
        struct tqueue *q = queue_for(h->tid);
        if (q->state == Q_DEAD)
            llft_diverge(NULL, h->op, h, LLFT_EXIT_DIVERGED,
                         "the primary recorded a call by thread %u after that thread ended here", h->tid);
        llft_rec_t head = *h;
        if (head.turn && exclusive_op(head.op))
            annotate_turn(&head);
        else if (event_wait_op(head.op))
            annotate_wait(&head, q);
        else
            head.seq = 0; /* no annotation */
        q_push(q, &head);
        for (i = 1; i < n; i++)
            q_push(q, llft_ring_slot(r, tail + i));
        wake_bits |= tid_bit(h->tid);
        tail += n;
        if (h->op == LLFT_OP_EXEC)
            exec_barrier = 1; /* leave the rest in the ring for the image execve starts */
    }
    if (tail != start)
        llft_ring_release(r, tail);
    return (long)(tail - start);
}

static void bump_epoch(uint32_t bits)
{
    __atomic_fetch_add(&epoch, 1, SEQ);
    if (bits && LOAD(&epoch_waiters, SEQ))
        llft_futex_wake_bits(&epoch, INT_MAX, bits);
}

/* Drains with the dispatch lock held by the caller, releases it, and wakes
 * the threads the records are for. */
static long drain_and_wake(void)
{
    long n = drain();
    uint32_t bits = wake_bits;
    wake_bits = 0;
    spin_unlock(&dispatch_lock);
    if (n > 0)
        bump_epoch(bits);
    return n;
}

static long try_dispatch(void)
{
    return spin_try(&dispatch_lock) ? drain_and_wake() : 0;
}

/* Another thread is dispatching, or the ring holds records not dispatched
 * yet: worth yielding for rather than sleeping.  Otherwise they may be a
 * client's request away: serving 16 clients, sched_yield calls of threads
 * waiting so took a seventh of the machine's time from the primary. */
static int records_on_the_way(void)
{
    return LOAD(&dispatch_lock, RLX) || llft_ring_head(llft_ring) != llft_ring_tail(llft_ring);
}

/* A thread that waited on the ring for records leaves with one of its own.
 * Asleep, the others wake only for their records, so if nobody else waits
 * on the ring now, one of them must, or records for threads asleep would
 * wait for their timeouts. */
static void hand_over_the_ring(void)
{
    if (LOAD(&llft_ring->consumer_waiting, SEQ) == 0 && LOAD(&epoch_waiters, SEQ))
        llft_futex_wake_bits(&epoch, 1, ALL_THREADS);
}

static void adopt_objects(void);

/* Every record of the failed primary's stream taken, and every turn among
 * them done: otherwise a native acquisition here could overtake a replayed
 * one.  Nothing is queued any more (promote_pending stopped the dispatcher),
 * so a thread found finished stays so. */
static int all_replayed(void)
{
    int all = 1;
    spin_lock(&dispatch_lock);
    for (uint32_t i = 0; i < nlive_slots && all; i++) {
        const struct tqueue *q = &queues[live_slots[i]];
        if (LOAD(&q->popped, ACQ) != q->pushed || LOAD(&q->finished, ACQ) != LOAD(&q->to_finish, RLX))
            all = 0;
    }
    spin_unlock(&dispatch_lock);
    return all;
}

/* Takes over as primary once every thread has taken every record of the
 * failed primary's stream: the virtual synchrony point.  From then on the
 * wrappers record (llft_mode reads the role) into this replica's ring. */
static int try_promote(void)
{
    static uint32_t promoted; /* 1: a thread is taking over, 2: taken over */
    uint32_t p = LOAD(&promoted, ACQ);
    if (p)
        return p == 2; /* the others wait until the lock table is filled */
    if (!all_replayed())
        return 0;
    if (!__atomic_compare_exchange_n(&promoted, &p, 1, 0, SEQ, RLX))
        return 0;
    adopt_objects();
    __atomic_store_n(&llft_next_tid, max_tid + 1, SEQ);
    __atomic_store_n(&llft_ctl->promoted_ns, llft_now_ns(), SEQ); /* for llft-run and benchmarks */
    __atomic_store_n(&llft_ctl->role, LLFT_ROLE_PRIMARY, SEQ);
    llft_log("llft: replica %u takes over as the primary after %llu records of the failed primary",
             llft_ctl->replica, (unsigned long long)LOAD(&llft_ctl->records, RLX));
    STORE(&promoted, 2, SEQ);
    bump_epoch(ALL_THREADS);
    return 1;
}

static void wake_stopped(void)
{
    __atomic_fetch_add(&stopped_futex, 1, SEQ);
    llft_futex_wake(&stopped_futex);
}

/* This thread does nothing more, as at the primary: either the primary's
 * stream has ended without this call (when the primary exited, its thread
 * was blocked in this call, or had not reached it yet), or the primary's
 * thread ended where this one makes another call.  Once every thread here
 * has stopped so, with every record replayed, this replica has done all
 * the primary did before it exited, and exits with the primary's status
 * (no thread is left to run the program's exit path, so stdio buffers are
 * not flushed).  A stream whose end gives no status (a saved or cut one),
 * or records still not replayed --end-grace after the end, make the stream
 * incomplete. */
static __attribute__((noreturn)) void stop_for_good(struct llft_thread *t, uint16_t op)
{
    __atomic_fetch_add(&stopped, 1, SEQ);
    wake_stopped();
    for (;;) {
        uint32_t seen = LOAD(&stopped_futex, SEQ);
        if (LOAD(&stream_ended, ACQ)) {
            int replayed = all_replayed();
            int all = replayed && LOAD(&stopped, SEQ) == LOAD(&live_threads, SEQ);
            if (all && primary_status >= 0) {
                llft_log("llft: replica %u replayed the primary's whole stream; its %u threads stopped where "
                         "the primary's were when it exited (in a call it never finished, or before their "
                         "next one): exiting with the primary's status %lld",
                         llft_ctl->replica, LOAD(&live_threads, SEQ), (long long)primary_status);
                STORE(&llft_ctl->stopped_for_good, 1, SEQ);
                llft_exit_now((int)primary_status);
            }
            if (all || ((primary_status < 0 || !replayed) &&
                        llft_now_ms() - stream_ended_ms > llft_ctl->end_grace_ms))
                llft_diverge(t, op, NULL, LLFT_EXIT_NOSTREAM, "the primary's record stream ended without this call");
        }
        llft_futex_wait(&stopped_futex, seen, 50);
    }
}

/* Blocks until this thread's next record is in its queue; returns
 * LLFT_PROMOTED instead when this replica has become the primary. */
static int pop_wait(struct llft_thread *t, uint16_t op, llft_rec_t *out, int consume)
{
    unsigned spins = 0;
    int waited_on_ring = 0;
    for (;;) {
        uint32_t ep = LOAD(&epoch, SEQ);
        if (q_take(t->q, out, consume)) {
            if (waited_on_ring)
                hand_over_the_ring();
            return 0;
        }
        if (try_dispatch() > 0)
            continue;
        if (LOAD(&promote_pending, ACQ)) {
            if (try_promote())
                return LLFT_PROMOTED;
            llft_futex_wait(&epoch, ep, 1); /* others are still replaying their last records */
            continue;
        }
        if (LOAD(&stream_ended, ACQ)) {
            /* Every record before END is queued by now: none is coming. */
            if (q_take(t->q, out, consume))
                return 0;
            stop_for_good(t, op);
        }
        if (++spins < 64) {
            __builtin_ia32_pause();
            continue;
        }
        if (spins < 72 && records_on_the_way()) {
            llft_yield(); /* more threads than cores: let whoever brings them run */
            continue;
        }
        if (spin_try(&dispatch_lock)) {
            if (drain_and_wake() > 0)
                continue;
            waited_on_ring = 1;
            llft_ring_wait_data(llft_ring, 20);
        } else {
            __atomic_fetch_add(&epoch_waiters, 1, SEQ);
            llft_futex_wait_bits(&epoch, ep, 20, tid_bit(t->tid));
            __atomic_fetch_sub(&epoch_waiters, 1, SEQ);
        }
    }
}

int llft_replay_next(struct llft_thread *t, uint16_t op, llft_rec_t *out)
{
    t->depth++;
    if (pop_wait(t, op, out, 1) == LLFT_PROMOTED) {
        t->depth--;
        return LLFT_PROMOTED;
    }
    if (UNLIKELY(out->op != op)) {
        /* The primary's thread ended here (pthread_exit from deep inside a
         * library, as CPython does to a daemon thread at interpreter
         * shutdown, after reading a flag without a lock).  It did nothing
         * more, so neither may this one, holding what the primary's held. */
        if (out->op == LLFT_OP_THREAD_EXIT)
            stop_for_good(t, op);
        llft_diverge(t, op, out, LLFT_EXIT_DIVERGED, "the backup made a different call than the primary");
    }
    if (UNLIKELY(out->tn != t->tn + 1))
        llft_diverge(t, op, out, LLFT_EXIT_NOSTREAM, "the stream lacks calls #%u..#%u of this thread",
                     t->tn + 1, out->tn - 1);
    t->tn = out->tn;
    if (out->seq && event_wait_op(op))
        wait_for_earlier_calls(t, out);
    /* The count orders this call after every replayed call that happened
     * before it here (one atomic variable's order follows happens-before). */
    t->stamp = __atomic_fetch_add(&llft_ctl->records, 1, RLX) + 1;
    t->depth--;
    return 0;
}

int llft_replay_next_if(struct llft_thread *t, uint16_t op, llft_rec_t *out)
{
    t->depth++;
    int r = pop_wait(t, op, out, 0);
    t->depth--;
    if (r == LLFT_PROMOTED)
        return LLFT_PROMOTED;
    if (out->op != op)
        return LLFT_NOT_NEXT;
    return llft_replay_next(t, op, out);
}

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

void llft_replay_data(struct llft_thread *t, void *buf, uint64_t len)
{
    llft_rec_t slot;
    uint64_t off = 0;
    t->depth++;
    while (off < len) {
        pop_wait(t, LLFT_OP_DATA, &slot, 1); /* a group is whole: never promoted in its middle */
        const llft_data_t *d = (const llft_data_t *)&slot;
        if (d->op != LLFT_OP_DATA)
            llft_diverge(t, LLFT_OP_DATA, &slot, LLFT_EXIT_NOSTREAM, "a data record is missing");
        uint64_t n = len - off < d->len ? len - off : d->len;
        memcpy((char *)buf + off, d->bytes, n);
        off += n;
    }
    t->depth--;
}

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

/* Dispatcher, for a record that takes a turn: note which thread took the
 * previous turn and how many of its records precede this one in the
 * primary's stream.  The copy in the queue carries it in seq and check,
 * which are spent once the record has been validated. */
#define NO_HOLDER 0xffffffffu
static void annotate_turn(llft_rec_t *rec)
{
    struct turnstile *ts = ts_get(rec->obj);
    uint32_t prev = ts->turn_count_seen ? ts->last_tid : rec->tid;
    ts->turn_count_seen = 1;
    ts->last_tid = rec->tid;
    const struct tqueue *q = prev != rec->tid ? queue_find(prev) : NULL;
    if (q == NULL || q->state != Q_LIVE) { /* none, itself, or ended: nothing to wait for */
        rec->check = NO_HOLDER;
        rec->seq = 0;
        return;
    }
    rec->check = (uint32_t)(q - queues) | (uint32_t)q->gen << 16;   /* the slot, and which thread in it */
    rec->seq = q->pushed;
}

/* Waits until the thread of queue slot|gen<<16 (slotgen) has taken `upto`
 * slots of its queue, or has ended (its slot taken by a later thread, which
 * means it took all). */
static void wait_taken(struct llft_thread *t, const llft_rec_t *e, uint32_t slotgen, uint64_t upto)
{
    const struct tqueue *q = &queues[slotgen & QMASK];
    uint16_t gen = (uint16_t)(slotgen >> 16);
    uint64_t since = 0;
    for (unsigned spins = 0; LOAD(&q->gen, ACQ) == gen && LOAD(&q->popped, ACQ) < upto; spins++) {
        if (spins < 64) {
            __builtin_ia32_pause();
        } else if (spins < 80) {
            llft_yield();
        } else {
            uint64_t now = llft_now_ms();
            if (!since)
                since = now;
            if (now - since > llft_ctl->stall_timeout_ms)
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

/* The previous holder may read memory the program shares without a lock
 * right after releasing (CPython reads its GIL drop request so).  At the
 * primary it had started each call recorded before this acquisition, so
 * here too: wait until it has taken those records. */
static void wait_previous_holder(struct llft_thread *t, const llft_rec_t *e)
{
    if (e->seq && e->check != NO_HOLDER)
        wait_taken(t, e, e->check, e->seq);
}

/* ---- waits follow the primary's order --------------------------------
 * An event loop's wait (poll, select, epoll_wait) returns at the primary
 * when something happened, often another thread's doing, and the loop
 * then reads what that thread left, with or without a lock: memcached's
 * main loop reads a flag a worker's signal handler set (its shutdown).
 * Replayed, the wait would return as soon as its record is here, maybe
 * before the backup's worker got that far: memcached's main loop read the
 * flag unset, went round once more and read the clock where the primary's
 * had closed its listener.  So a replayed wait returns only once every
 * other thread has started each call the primary recorded before the
 * wait returned there.  The dispatcher notes, for each thread with
 * records it has not taken yet, how many slots it had queued then; the
 * waiting thread waits until each has taken that many.  Those calls
 * happened at the primary before the wait returned, so nothing they need
 * waits on this one: no cycle. */
#define SNAPS (1u << 14)
#define SNAP_MASK (SNAPS - 1)
struct snap {
    uint64_t at;                  /* index + 1 of the note written here (0 while being written) */
    uint64_t upto;                /* slots its thread had queued */
    uint32_t slotgen;             /* slot | gen << 16 of that thread's queue */
    uint32_t _pad;
};
static struct snap *snaps;
static uint64_t snap_head;        /* notes written (dispatch lock) */

static inline int event_wait_op(uint16_t op)
{
    return op == LLFT_OP_POLL || op == LLFT_OP_SELECT || op == LLFT_OP_EPOLL_WAIT;
}

/* Dispatcher: the wait's copy in the queue carries its first note + 1 in
 * seq and how many in check (no turn: annotate_turn has none of these). */
static void annotate_wait(llft_rec_t *rec, const struct tqueue *self)
{
    uint64_t first = snap_head;
    for (uint32_t i = 0; i < nlive_slots; i++) {
        const struct tqueue *q = &queues[live_slots[i]];
        if (q == self || LOAD(&q->popped, ACQ) >= q->pushed)
            continue;
        struct snap *s = &snaps[snap_head & SNAP_MASK];
        STORE(&s->at, 0, RLX);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        STORE(&s->upto, q->pushed, RLX);
        STORE(&s->slotgen, live_slots[i] | (uint32_t)q->gen << 16, RLX);
        STORE(&s->at, snap_head + 1, REL);
        snap_head++;
    }
    rec->seq = snap_head != first ? first + 1 : 0;
    rec->check = (uint32_t)(snap_head - first);
}

static void wait_for_earlier_calls(struct llft_thread *t, const llft_rec_t *e)
{
    for (uint64_t k = e->seq - 1, end = k + e->check; k < end; k++) {
        const struct snap *s = &snaps[k & SNAP_MASK];
        if (LOAD(&s->at, ACQ) != k + 1)
            continue; /* written over: that far behind, its threads have long moved on */
        uint64_t upto = LOAD(&s->upto, RLX);
        uint32_t slotgen = LOAD(&s->slotgen, RLX);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(&s->at, RLX) == k + 1)
            wait_taken(t, e, slotgen, upto);
    }
}

/* For a stall report: whose queued record takes turn `turn` of obj, and
 * how far that thread is (the queues are read without the lock: a
 * report, not a decision). */
static void describe_turn_taker(uint64_t obj, uint64_t turn, char *out, size_t cap)
{
    snprintf(out, cap, "no thread here has that turn queued; %llu slots in the ring not dispatched%s",
             (unsigned long long)(llft_ring_head(llft_ring) - llft_ring_tail(llft_ring)),
             LOAD(&stream_ended, ACQ) ? "; the stream has ended" : "");
    for (uint32_t i = 0; i < LOAD(&nlive_slots, ACQ); i++) {
        const struct tqueue *q = &queues[live_slots[i]];
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
    uint64_t since = 0;
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
            uint64_t now = llft_now_ms();
            if (!since)
                since = now;
            uint32_t limit = LOAD(&stream_ended, ACQ) ? llft_ctl->end_grace_ms : llft_ctl->stall_timeout_ms;
            if (now - since > limit) {
                char who[160];
                describe_turn_taker(obj, d + 1, who, sizeof who);
                llft_diverge(t, 0, NULL, LLFT_EXIT_DIVERGED,
                             "stalled %llu ms waiting for turn %llu of object %#llx (%llu turns done): "
                             "the thread that should take the previous turn never did (%s)",
                             (unsigned long long)(now - since), (unsigned long long)turn,
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
    /* Plain stores to a line written anyway; adopt_objects reads them once
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
static void adopt_objects(void)
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

/* execve failed here as it did at the primary: this image goes on. */
void llft_replay_exec_failed(void)
{
    spin_lock(&dispatch_lock);
    exec_barrier = 0;
    spin_unlock(&dispatch_lock);
}

/* ---- thread lifecycle ----------------------------------------------- */

/* Every role reserves the same regions at start-up, so that replicas'
 * address spaces match whatever their role and replay timing. */
void llft_replay_reserve(void)
{
    queues = map_anon(sizeof(struct tqueue) * QSLOTS, "replay queues");
    live_slots = map_anon(sizeof(uint32_t) * QSLOTS, "replay queues");
    turnstiles = map_anon(sizeof(struct turnstile) * TS_SLOTS, "turnstiles");
    overflow = map_anon(sizeof(struct overflow) * OVERFLOW_SLOTS, "turnstiles");
    ts_used = map_anon(sizeof(uint32_t) * TS_SLOTS, "turnstiles");
    pool_base = map_anon(sizeof(struct qchunk) * POOL_CHUNKS, "replay queues");
    snaps = map_anon(sizeof(struct snap) * SNAPS, "wait notes");
}

void llft_replay_setup(void)
{
    llft_self.q = NULL;
    spin_lock(&dispatch_lock);
    llft_self.q = queue_for(0);
    spin_unlock(&dispatch_lock);
    __atomic_fetch_add(&live_threads, 1, SEQ);
}

void llft_replay_thread_start(struct llft_thread *t)
{
    spin_lock(&dispatch_lock);
    t->q = queue_for(t->tid);
    spin_unlock(&dispatch_lock);
    __atomic_fetch_add(&live_threads, 1, SEQ);
}

void llft_replay_thread_end(struct llft_thread *t)
{
    spin_lock(&dispatch_lock);
    struct tqueue *q = t->q;
    llft_rec_t extra;
    int more = q_pop(q, &extra);
    if (!more) {
        struct qchunk *c = q->rd_chunk;
        while (c) {
            struct qchunk *n = c->next;
            chunk_free(c);
            c = n;
        }
        q->rd_chunk = q->wr_chunk = NULL;
        queue_ended(q);
    }
    spin_unlock(&dispatch_lock);
    if (more)
        llft_diverge(t, LLFT_OP_THREAD_EXIT, &extra, LLFT_EXIT_DIVERGED,
                     "this thread ended here but made more calls at the primary");
    t->q = NULL;
    __atomic_fetch_sub(&live_threads, 1, SEQ);
    wake_stopped();
}

/* Every other thread has started each call the primary recorded for it,
 * and finished each one that must_finish (a transfer on a connection). */
static int others_replayed(const struct llft_thread *t)
{
    int all = 1;
    spin_lock(&dispatch_lock);
    for (uint32_t i = 0; i < nlive_slots && all; i++) {
        const struct tqueue *q = &queues[live_slots[i]];
        if (q != t->q && (LOAD(&q->popped, ACQ) != LOAD(&q->pushed, RLX) ||
                          LOAD(&q->finished, ACQ) != LOAD(&q->to_finish, RLX)))
            all = 0;
    }
    spin_unlock(&dispatch_lock);
    return all;
}

/* The thread calling exit() waits until the primary's stream has ended: a
 * backup never finishes before its primary.  Then, for at most the end
 * grace, until the other threads have replayed their records: at the
 * primary a thread that lags here had already sent its last replies (a
 * connection's thread, while another one serves the request to exit).
 * Its own queue may still hold records: destructors that run after this
 * one (an allocator's, a C++ runtime's) make recorded calls, and replay
 * them after we return. */
void llft_replay_at_exit(struct llft_thread *t)
{
    t->depth++;
    while (!LOAD(&stream_ended, ACQ) && !LOAD(&promote_pending, ACQ)) {
        uint32_t ep = LOAD(&epoch, SEQ);
        if (try_dispatch() > 0)
            continue;
        if (spin_try(&dispatch_lock)) {
            if (drain_and_wake() == 0)
                llft_ring_wait_data(llft_ring, 50);
        } else {
            llft_futex_wait(&epoch, ep, 50);
        }
    }
    uint64_t since = llft_now_ms();
    while (LOAD(&stream_ended, ACQ) && !others_replayed(t) && llft_now_ms() - since < llft_ctl->end_grace_ms) {
        struct timespec ms = {0, 1000000};
        llft_nap(&ms);
    }
    t->depth--;
}
