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
 * run concurrently (turnstile.c), and event-loop waits return after the
 * calls the primary made before them (wait_order.c).  The queues and their
 * chunk pool are replay_queues.c's; what happens at the end of the
 * primary's stream, replay_end.c's.  The shim's own locks are spinlocks: it
 * never calls the functions it wraps. */
#include "replay_queues.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"

/* ---- dispatcher ----------------------------------------------------- */

static uint32_t epoch;            /* bumped after each dispatch that moved records */
static uint32_t epoch_waiters;    /* threads asleep on it, each with its bit (tid_bit) */
static uint32_t wake_bits;        /* whom the records drain() moved are for (dispatch lock held) */
static uint32_t exec_barrier;     /* records past an execve belong to the next image */
/* Records past a signal the program sent itself wait until it is sent
 * here: at the primary its handler had run (memcached's sets the flag its
 * main loop reads after each round, with no call in between that waits),
 * so no thread may replay a later record before the handler has run. */
static uint32_t signal_barrier;
static uint32_t promote_pending;  /* the failed primary's stream ends here: take over once drained */
static uint32_t promoted;         /* 1: a thread is taking over, 2: taken over */
static uint32_t era;              /* bumped when a copy of the primary starts replaying (demote.c) */
static uint32_t max_tid;          /* highest thread id the primary used or created */

/* A thread sleeps on the epoch with one bit of 32, and a dispatch wakes
 * only the threads it queued records for: waking every sleeper at every
 * dispatch woke all of a backup's threads (one per client connection in
 * many servers) for each request, to find nothing and sleep again.
 * Threads that share a bit wake each other for nothing now and then, and
 * look again. */
static inline uint32_t tid_bit(uint32_t tid) { return 1u << (tid & 31); }
#define ALL_THREADS (~0u)

static __attribute__((noreturn)) void corrupt_stream(uint64_t pos, int why)
{
    llft_diverge(NULL, 0, NULL, LLFT_EXIT_NOSTREAM, "record %llu of the stream is %s",
                 (unsigned long long)pos, why == LLFT_REC_CORRUPT ? "corrupt (torn or altered)" : "malformed");
}


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
    while (tail - start < 4096 && !exec_barrier && !signal_barrier && !promote_pending) {
        const llft_rec_t *h = llft_ring_slot(r, tail);
        int v = llft_rec_validate(h, tail + 1);
        if (v == LLFT_REC_PENDING)
            break;
        if (v != LLFT_REC_OK || h->op == LLFT_OP_DATA)
            corrupt_stream(tail, v != LLFT_REC_OK ? v : LLFT_REC_BADFIELD);
        if (h->op == LLFT_OP_END) {
            wake_bits = ALL_THREADS; /* each looks whether it stops here */
            llft_end_reached(h->ret);
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
        struct tqueue *q = llft_queue_for(h->tid);
        if (q->state == Q_DEAD)
            llft_diverge(NULL, h->op, h, LLFT_EXIT_DIVERGED,
                         "the primary recorded a call by thread %u after that thread ended here", h->tid);
        llft_rec_t head = *h;
        if (head.turn && exclusive_op(head.op))
            llft_annotate_turn(&head);
        else if (llft_event_wait_op(head.op))
            llft_annotate_wait(&head, q);
        else
            head.seq = 0; /* no annotation */
        q_push(q, &head);
        for (i = 1; i < n; i++)
            q_push(q, llft_ring_slot(r, tail + i));
        wake_bits |= tid_bit(h->tid);
        tail += n;
        if (h->op == LLFT_OP_EXEC)
            exec_barrier = 1; /* leave the rest in the ring for the image execve starts */
        if (h->op == LLFT_OP_SIGNAL_SELF)
            signal_barrier = 1;
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
    spin_unlock(&llft_dispatch_lock);
    if (n > 0)
        bump_epoch(bits);
    return n;
}

static long try_dispatch(void)
{
    return spin_try(&llft_dispatch_lock) ? drain_and_wake() : 0;
}

/* Another thread is dispatching, or the ring holds records not dispatched
 * yet: worth yielding for rather than sleeping.  Otherwise they may be a
 * client's request away: serving 16 clients, sched_yield calls of threads
 * waiting so took a seventh of the machine's time from the primary. */
static int records_on_the_way(void)
{
    return LOAD(&llft_dispatch_lock, RLX) || llft_ring_head(llft_ring) != llft_ring_tail(llft_ring);
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


/* Takes over as primary once every thread has taken every record of the
 * failed primary's stream: the virtual synchrony point.  From then on the
 * wrappers record (llft_mode reads the role) into this replica's ring. */
static int try_promote(void)
{
    uint32_t p = LOAD(&promoted, ACQ);
    if (p)
        return p == 2; /* the others wait until the lock table is filled */
    if (!llft_queues_replayed(NULL))
        return 0;
    if (!__atomic_compare_exchange_n(&promoted, &p, 1, 0, SEQ, RLX))
        return 0;
    llft_adopt_objects();
    __atomic_store_n(&llft_next_tid, max_tid + 1, SEQ);
    __atomic_store_n(&llft_ctl->promoted_ns, llft_now_ns(), SEQ); /* for llft-run and benchmarks */
    __atomic_store_n(&llft_ctl->role, LLFT_ROLE_PRIMARY, SEQ);
    llft_log("llft: replica %u takes over as the primary after %llu records of the failed primary",
             llft_ctl->replica, (unsigned long long)LOAD(&llft_ctl->records, RLX));
    STORE(&promoted, 2, SEQ);
    bump_epoch(ALL_THREADS);
    return 1;
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
        if (LOAD(&llft_stream_ended, ACQ)) {
            /* Every record before END is queued by now: none is coming. */
            if (q_take(t->q, out, consume))
                return 0;
            llft_stop_for_good(t, op);
        }
        if (++spins < 64) {
            __builtin_ia32_pause();
            continue;
        }
        if (spins < 72 && records_on_the_way()) {
            llft_yield(); /* more threads than cores: let whoever brings them run */
            continue;
        }
        if (spin_try(&llft_dispatch_lock)) {
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

static void take_queue(struct llft_thread *t, uint32_t tid)
{
    spin_lock(&llft_dispatch_lock);
    t->q = llft_queue_for(tid);
    t->q_era = era;
    spin_unlock(&llft_dispatch_lock);
    llft_end_thread_started();
}

/* A thread of a copy of the primary (demote.c) takes its queue at its
 * first replayed call. */
static void own_queue(struct llft_thread *t)
{
    if (UNLIKELY(t->q == NULL || t->q_era != LOAD(&era, RLX)))
        take_queue(t, t->tid);
}

/* No thread is in the engine: the copy's were the primary's. */
void llft_replay_restart(uint32_t last_tid)
{
    spin_lock(&llft_dispatch_lock);
    llft_queues_reset();
    exec_barrier = signal_barrier = 0;
    STORE(&promote_pending, 0, SEQ);
    STORE(&promoted, 0, SEQ);
    llft_end_forget();
    wake_bits = 0;
    max_tid = last_tid;
    STORE(&era, era + 1, SEQ);
    spin_unlock(&llft_dispatch_lock);
}

/* The thread's next record is the primary's SIGNAL (wrap_signal.c),
 * taken: the program's handler runs here, now, as it ran there before
 * the thread's next call.  Called with depth raised; leaves it lowered. */
static void replay_signal(struct llft_thread *t, const llft_rec_t *e)
{
    if (UNLIKELY(e->tn != t->tn + 1))
        llft_diverge(t, LLFT_OP_SIGNAL, e, LLFT_EXIT_NOSTREAM, "the stream lacks calls #%u..#%u of this thread",
                     t->tn + 1, e->tn - 1);
    t->tn = e->tn;
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (e->nslots > 1)
        llft_replay_data(t, &info, sizeof info);
    t->stamp = __atomic_fetch_add(&llft_ctl->records, 1, RLX) + 1;
    t->depth--;
    llft_signal_replayed(e, &info);
}

int llft_replay_next(struct llft_thread *t, uint16_t op, llft_rec_t *out)
{
    own_queue(t);
    for (;;) {
        t->depth++;
        if (pop_wait(t, op, out, 1) == LLFT_PROMOTED) {
            t->depth--;
            return LLFT_PROMOTED;
        }
        if (LIKELY(out->op != LLFT_OP_SIGNAL || op == LLFT_OP_SIGNAL))
            break;
        replay_signal(t, out);
    }
    if (UNLIKELY(out->op != op)) {
        /* The primary's thread ended here (pthread_exit from deep inside a
         * library, as CPython does to a daemon thread at interpreter
         * shutdown, after reading a flag without a lock).  It did nothing
         * more, so neither may this one, holding what the primary's held. */
        if (out->op == LLFT_OP_THREAD_EXIT)
            llft_stop_for_good(t, op);
        llft_diverge(t, op, out, LLFT_EXIT_DIVERGED, "the backup made a different call than the primary");
    }
    if (UNLIKELY(out->tn != t->tn + 1))
        llft_diverge(t, op, out, LLFT_EXIT_NOSTREAM, "the stream lacks calls #%u..#%u of this thread",
                     t->tn + 1, out->tn - 1);
    t->tn = out->tn;
    if (out->seq && llft_event_wait_op(op))
        llft_wait_for_earlier_calls(t, out);
    /* The count orders this call after every replayed call that happened
     * before it here (one atomic variable's order follows happens-before). */
    t->stamp = __atomic_fetch_add(&llft_ctl->records, 1, RLX) + 1;
    t->depth--;
    return 0;
}

int llft_replay_next_if(struct llft_thread *t, uint16_t op, llft_rec_t *out)
{
    own_queue(t);
    int r;
    for (;;) {
        t->depth++;
        r = pop_wait(t, op, out, 0);
        if (r == LLFT_PROMOTED || out->op != LLFT_OP_SIGNAL || op == LLFT_OP_SIGNAL)
            break;
        pop_wait(t, op, out, 1); /* a handler runs first, wherever the call goes */
        replay_signal(t, out);
    }
    t->depth--;
    if (r == LLFT_PROMOTED)
        return LLFT_PROMOTED;
    if (out->op != op)
        return LLFT_NOT_NEXT;
    return llft_replay_next(t, op, out);
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

/* execve failed here as it did at the primary: this image goes on. */
void llft_replay_exec_failed(void)
{
    spin_lock(&llft_dispatch_lock);
    exec_barrier = 0;
    spin_unlock(&llft_dispatch_lock);
}

void llft_replay_signal_sent(void)
{
    spin_lock(&llft_dispatch_lock);
    signal_barrier = 0;
    drain_and_wake(); /* (releases the lock) */
}

/* ---- thread lifecycle ----------------------------------------------- */

/* Every role reserves the same regions at start-up, so that replicas'
 * address spaces match whatever their role and replay timing. */
void llft_replay_reserve(void)
{
    llft_queues_reserve();
    llft_turnstiles_reserve();
    llft_wait_notes_reserve();
}

void llft_replay_setup(void)
{
    llft_self.q = NULL;
    take_queue(&llft_self, 0);
}

void llft_replay_thread_start(struct llft_thread *t)
{
    take_queue(t, t->tid);
}

void llft_replay_thread_end(struct llft_thread *t)
{
    spin_lock(&llft_dispatch_lock);
    struct tqueue *q = t->q;
    llft_rec_t extra;
    int more = q_take(q, &extra, 1);
    if (!more)
        llft_queue_ended(q);
    spin_unlock(&llft_dispatch_lock);
    if (more)
        llft_diverge(t, LLFT_OP_THREAD_EXIT, &extra, LLFT_EXIT_DIVERGED,
                     "this thread ended here but made more calls at the primary");
    t->q = NULL;
    llft_end_thread_ended();
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
    own_queue(t);
    t->depth++;
    while (!LOAD(&llft_stream_ended, ACQ) && !LOAD(&promote_pending, ACQ)) {
        uint32_t ep = LOAD(&epoch, SEQ);
        if (try_dispatch() > 0)
            continue;
        if (spin_try(&llft_dispatch_lock)) {
            if (drain_and_wake() == 0)
                llft_ring_wait_data(llft_ring, 50);
        } else {
            llft_futex_wait(&epoch, ep, 50);
        }
    }
    while (LOAD(&llft_stream_ended, ACQ) && !llft_queues_replayed(t->q) && !llft_end_grace_over()) {
        struct timespec ms = {0, 1000000};
        llft_nap(&ms);
    }
    t->depth--;
}
