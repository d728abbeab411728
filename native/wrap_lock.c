/* Consistent Multi-Threading Service (LLFT §V-C).
 *
 * Every acquisition of a mutex, rwlock or semaphore takes a turn on that
 * object at the primary (counted while the object is held, so turns follow
 * the real acquisition order) and is recorded with it.  A backup waits for
 * the same turn, then acquires for real: threads touching different objects
 * never wait for each other.  A call that failed at the primary (EBUSY,
 * ETIMEDOUT, EAGAIN, EDEADLK...) is replayed as the same failure without
 * touching the object: it changed no shared state, so it takes no turn.
 *
 * Releases (unlock, post, signal, broadcast) need no record: a backup thread
 * cannot acquire before its turn, and cannot acquire at its turn until the
 * previous holder released.  A condition wait's return is the re-acquisition
 * of its mutex: at a backup it releases the mutex, waits for the primary's
 * turn and re-acquires, returning the primary's result (0 or ETIMEDOUT). */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

DEFINE_REAL(pthread_mutex_lock)
DEFINE_REAL(pthread_mutex_trylock)
DEFINE_REAL(pthread_mutex_timedlock)
DEFINE_REAL(pthread_mutex_clocklock)
DEFINE_REAL(pthread_mutex_unlock)
DEFINE_REAL_V(pthread_cond_wait, "GLIBC_2.3.2")
DEFINE_REAL_V(pthread_cond_timedwait, "GLIBC_2.3.2")
DEFINE_REAL(pthread_cond_clockwait)
DEFINE_REAL_V(pthread_cond_signal, "GLIBC_2.3.2")
DEFINE_REAL_V(pthread_cond_broadcast, "GLIBC_2.3.2")
DEFINE_REAL(pthread_rwlock_rdlock)
DEFINE_REAL(pthread_rwlock_wrlock)
DEFINE_REAL(pthread_rwlock_tryrdlock)
DEFINE_REAL(pthread_rwlock_trywrlock)
DEFINE_REAL(pthread_rwlock_timedrdlock)
DEFINE_REAL(pthread_rwlock_timedwrlock)
DEFINE_REAL(pthread_rwlock_clockrdlock)
DEFINE_REAL(pthread_rwlock_clockwrlock)
DEFINE_REAL(sem_wait)
DEFINE_REAL(sem_trywait)
DEFINE_REAL(sem_timedwait)
DEFINE_REAL(sem_clockwait)

/* Primary: record an acquisition attempt.  ok means the object is now held;
 * ret/err are what the caller gets back. */
static inline void record_acquire(struct llft_thread *t, uint16_t op, const void *obj, int ok, int64_t ret, int err)
{
    if (ok) {
        struct llft_obj *o = llft_obj_get(obj, t);
        llft_record(t, op, o->id, llft_obj_take_turn(o), ret, 0, 0);
    } else {
        llft_record(t, op, 0, 0, ret, err, 0);
    }
}

/* Backup: acquire in the primary's order.  block() acquires for real,
 * waiting as long as needed; it returns 0 on success.  The primary's result
 * goes to *res; LLFT_PROMOTED means this replica has just taken over. */
static int replay_acquire(struct llft_thread *t, uint16_t op, void *obj, int (*block)(void *), int64_t *res)
{
    llft_rec_t e;
    if (llft_replay_next(t, op, &e))
        return LLFT_PROMOTED;
    *res = e.ret;
    if (e.turn == 0) {
        if (e.err)
            errno = e.err;
        return 0;
    }
    struct turnstile *ts = llft_turn_wait(t, &e);
    int r = block(obj);
    llft_turn_done(t, ts, obj, e.turn);
    if (UNLIKELY(r != 0))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "acquiring for real failed here (error %d)", r);
    return 0;
}

static int block_mutex(void *m) { return REAL(pthread_mutex_lock)(m); }
static int block_rd(void *l) { return REAL(pthread_rwlock_rdlock)(l); }
static int block_wr(void *l) { return REAL(pthread_rwlock_wrlock)(l); }
static int block_sem(void *s)
{
    int r;
    while ((r = REAL(sem_wait)(s)) != 0 && errno == EINTR)
        ;
    return r ? errno : 0;
}

/* ---- held for a checkpoint (quiesce.c) -------------------------------
 * A thread waiting for a lock may wait for one a parked thread holds: it
 * waits as a thread outside any call (acquiring), and once it has the
 * lock, if the primary is held, or this process is a copy of the primary
 * restored as a backup, it gives the lock back unrecorded and makes the
 * call again from its entry. */
DEFINE_REAL(pthread_rwlock_unlock)

static void give_back(uint16_t op, void *obj)
{
    if (op >= LLFT_OP_SEM_WAIT)
        sem_post(obj);
    else if (op >= LLFT_OP_RWLOCK_RDLOCK)
        REAL(pthread_rwlock_unlock)(obj);
    else
        REAL(pthread_mutex_unlock)(obj);
}

/* The real acquisition of a primary branch, made as a wait outside the
 * call; nonzero afterwards when it is to be given back (see above). */
#define ACQUIRING(t, call)                                                          \
    ({                                                                              \
        llft_acquiring(t, 1);                                                       \
        __typeof__(call) acquiring_ret_ = (call);                                   \
        llft_acquiring(t, 0);                                                       \
        acquiring_ret_;                                                             \
    })

/* An acquisition's result.  err_of(r) is the errno to record for result r:
 * pthread calls return the error (record 0), semaphores -1 and errno. */
#define ACQUIRED(op, obj, block, real_call, err_of)                                 \
    ({                                                                              \
        LLFT_CALL(t);                                                               \
        int role = llft_call_mode(&t), got_;                                        \
        int64_t res;                                                                \
        for (;;) {                                                                  \
            if (UNLIKELY(role == LLFT_ROLE_BACKUP) &&                               \
                !replay_acquire(t, op, (void *)(obj), block, &res)) {               \
                got_ = (int)res;                                                    \
            } else if (LIKELY(role != LLFT_ROLE_OFF)) { /* or taken over just now */\
                got_ = ACQUIRING(t, real_call);                                     \
                if (UNLIKELY(llft_held_or_copy())) {                                \
                    if (got_ == 0)                                                  \
                        give_back(op, (void *)(obj));                               \
                    role = llft_quiesce_enter(t);                                   \
                    continue;                                                       \
                }                                                                   \
                record_acquire(t, op, obj, got_ == 0, got_, err_of(got_));          \
            } else {                                                                \
                got_ = real_call;                                                   \
            }                                                                       \
            break;                                                                  \
        }                                                                           \
        got_;                                                                       \
    })
/* The wrapper's body: an acquisition, a switch point under --serialize. */
#define ACQUIRE(op, obj, block, real_call, err_of)                                  \
    LLFT_SWITCH_POINT(int, ACQUIRED(op, obj, block, real_call, err_of))
#define PTHREAD_ERR(r) 0
#define SEM_ERR(r) ((r) ? errno : 0)
#define PTHREAD_ACQUIRE(op, obj, block, real_call) ACQUIRE(op, obj, block, real_call, PTHREAD_ERR)
#define SEM_ACQUIRE(op, s, real_call) ACQUIRE(op, s, block_sem, real_call, SEM_ERR)

EXPORT int pthread_mutex_lock(pthread_mutex_t *m)
{
    PTHREAD_ACQUIRE(LLFT_OP_MUTEX_LOCK, m, block_mutex, REAL(pthread_mutex_lock)(m));
}

EXPORT int pthread_mutex_trylock(pthread_mutex_t *m)
{
    PTHREAD_ACQUIRE(LLFT_OP_MUTEX_TRYLOCK, m, block_mutex, REAL(pthread_mutex_trylock)(m));
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *restrict m, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_MUTEX_TIMEDLOCK, m, block_mutex, REAL(pthread_mutex_timedlock)(m, LOCAL_DEADLINE(CLOCK_REALTIME, at)));
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *restrict m, clockid_t c, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_MUTEX_TIMEDLOCK, m, block_mutex, REAL(pthread_mutex_clocklock)(m, c, LOCAL_DEADLINE(c, at)));
}

EXPORT int pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_RDLOCK, l, block_rd, REAL(pthread_rwlock_rdlock)(l));
}

EXPORT int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_WRLOCK, l, block_wr, REAL(pthread_rwlock_wrlock)(l));
}

EXPORT int pthread_rwlock_tryrdlock(pthread_rwlock_t *l)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TRYRDLOCK, l, block_rd, REAL(pthread_rwlock_tryrdlock)(l));
}

EXPORT int pthread_rwlock_trywrlock(pthread_rwlock_t *l)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TRYWRLOCK, l, block_wr, REAL(pthread_rwlock_trywrlock)(l));
}

EXPORT int pthread_rwlock_timedrdlock(pthread_rwlock_t *restrict l, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TIMEDRDLOCK, l, block_rd, REAL(pthread_rwlock_timedrdlock)(l, LOCAL_DEADLINE(CLOCK_REALTIME, at)));
}

EXPORT int pthread_rwlock_timedwrlock(pthread_rwlock_t *restrict l, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TIMEDWRLOCK, l, block_wr, REAL(pthread_rwlock_timedwrlock)(l, LOCAL_DEADLINE(CLOCK_REALTIME, at)));
}

EXPORT int pthread_rwlock_clockrdlock(pthread_rwlock_t *restrict l, clockid_t c, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TIMEDRDLOCK, l, block_rd, REAL(pthread_rwlock_clockrdlock)(l, c, LOCAL_DEADLINE(c, at)));
}

EXPORT int pthread_rwlock_clockwrlock(pthread_rwlock_t *restrict l, clockid_t c, const struct timespec *restrict at)
{
    PTHREAD_ACQUIRE(LLFT_OP_RWLOCK_TIMEDWRLOCK, l, block_wr, REAL(pthread_rwlock_clockwrlock)(l, c, LOCAL_DEADLINE(c, at)));
}

/* Semaphores return -1 and set errno. */
EXPORT int sem_wait(sem_t *s) { SEM_ACQUIRE(LLFT_OP_SEM_WAIT, s, REAL(sem_wait)(s)); }
EXPORT int sem_trywait(sem_t *s) { SEM_ACQUIRE(LLFT_OP_SEM_TRYWAIT, s, REAL(sem_trywait)(s)); }
EXPORT int sem_timedwait(sem_t *restrict s, const struct timespec *restrict at)
{
    SEM_ACQUIRE(LLFT_OP_SEM_TIMEDWAIT, s, REAL(sem_timedwait)(s, LOCAL_DEADLINE(CLOCK_REALTIME, at)));
}
EXPORT int sem_clockwait(sem_t *restrict s, clockid_t c, const struct timespec *restrict at)
{
    SEM_ACQUIRE(LLFT_OP_SEM_TIMEDWAIT, s, REAL(sem_clockwait)(s, c, LOCAL_DEADLINE(c, at)));
}

/* Condition waits: the mutex is held again on return with 0 or ETIMEDOUT. */
static int cond_common(uint16_t op, pthread_mutex_t *m, int primary_result, struct llft_thread *t)
{
    int held = primary_result == 0 || primary_result == ETIMEDOUT;
    record_acquire(t, op, m, held, primary_result, 0);
    return primary_result;
}

/* How many signals and broadcasts each condition variable has had here,
 * by address in a small table (two variables that share a count only make
 * a waiter below return early, as a spurious wake-up).  Counted at the
 * primary too: a backup's thread that has not yet seen its replica take
 * over is still in the replay, not in the real wait, when the threads
 * that have seen it signal, and only the count tells it so. */
#define COND_SIGNAL_SLOTS 1024
static uint64_t cond_signals[COND_SIGNAL_SLOTS];

static inline uint64_t *signals_of(const pthread_cond_t *c)
{
    return &cond_signals[((uintptr_t)c * 0x9E3779B97F4A7C15ull) >> 54];
}

EXPORT int pthread_cond_signal(pthread_cond_t *c)
{
    struct llft_thread *t;
    if (LIKELY(llft_mode(&t) != LLFT_ROLE_OFF))
        __atomic_fetch_add(signals_of(c), 1, __ATOMIC_SEQ_CST);
    return REAL(pthread_cond_signal)(c);
}

EXPORT int pthread_cond_broadcast(pthread_cond_t *c)
{
    struct llft_thread *t;
    if (LIKELY(llft_mode(&t) != LLFT_ROLE_OFF))
        __atomic_fetch_add(signals_of(c), 1, __ATOMIC_SEQ_CST);
    return REAL(pthread_cond_broadcast)(c);
}

/* The condition variables the primary's threads wait on for real, with
 * how many wait on each: a copy of the primary (demote.c) wakes them all.
 * Restored, such a wait goes on for real, and a signal there need not
 * wake the waiter the primary's woke: the waiter the record says returns
 * would wait on, for a signal nobody sends, while the one woken waits
 * for its turn after it.  Woken, each takes its record instead (a
 * spurious wake-up, which a condition wait may always have).  Open
 * addressing over a few slots from the variable's home; a slot nobody
 * waits in goes to the next variable that needs it (variables come and
 * go: per-connection ones would fill the table for good). */
#define COND_WAIT_SLOTS 4096
#define COND_WAIT_PROBE 8
static struct cond_wait {
    pthread_cond_t *c;
    uint32_t waiting;
} cond_waits[COND_WAIT_SLOTS];

static struct cond_wait *cond_wait_begin(pthread_cond_t *c)
{
    uint32_t home = (uint32_t)(((uintptr_t)c * 0x9E3779B97F4A7C15ull) >> 52);
    for (uint32_t i = 0; i < COND_WAIT_PROBE; i++) {
        struct cond_wait *w = &cond_waits[(home + i) % COND_WAIT_SLOTS];
        pthread_cond_t *was = __atomic_load_n(&w->c, __ATOMIC_ACQUIRE);
        if (was != c) {
            if (was && __atomic_load_n(&w->waiting, __ATOMIC_SEQ_CST))
                continue;   /* another variable's, waited on */
            if (!__atomic_compare_exchange_n(&w->c, &was, c, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && was != c)
                continue;
        }
        __atomic_fetch_add(&w->waiting, 1, __ATOMIC_SEQ_CST);
        /* Another variable may have taken the slot, empty as it seemed,
         * between the test and the count: then the count is undone. */
        if (__atomic_load_n(&w->c, __ATOMIC_SEQ_CST) == c)
            return w;
        __atomic_fetch_sub(&w->waiting, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;   /* not woken by a copy: it waits for a signal, as a spurious wake-up's absence allows */
}

static void cond_wait_end(struct cond_wait *w)
{
    if (w)
        __atomic_fetch_sub(&w->waiting, 1, __ATOMIC_SEQ_CST);
}

void llft_cond_waits_wake(void)
{
    for (uint32_t i = 0; i < COND_WAIT_SLOTS; i++) {
        pthread_cond_t *c = __atomic_load_n(&cond_waits[i].c, __ATOMIC_ACQUIRE);
        if (c && __atomic_load_n(&cond_waits[i].waiting, __ATOMIC_SEQ_CST))
            REAL(pthread_cond_broadcast)(c);
    }
}

/* The primary's real wait on c, registered (see above) while it lasts. */
#define COND_REAL_WAIT(t, c, call)                                                  \
    ({                                                                              \
        struct cond_wait *registered_ = cond_wait_begin(c);                         \
        int cond_ret_ = ACQUIRING(t, call);                                         \
        cond_wait_end(registered_);                                                 \
        cond_ret_;                                                                  \
    })

/* Backup: the condition variable this thread last returned from a
 * replayed wait on, and its signal count then. */
static __thread const pthread_cond_t *last_cond TLS_IE;
static __thread uint64_t last_signals TLS_IE;

#define COND_WOKEN 1   /* taken over, and signalled meanwhile */
#define COND_STILL 2   /* taken over, and not signalled: wait for real */

/* The signal count a wait open at a takeover compares against. */
static __thread uint64_t takeover_signals TLS_IE;

/* Backup: the result in *res; or, when this replica takes over while the
 * wait is open (its primary died before the wait's end was recorded), the
 * mutex held again and COND_WOKEN or COND_STILL.  A signal sent here since
 * this thread's last wait on the variable ended (or ever, if it had none)
 * reached no real wait of it (a worker pool's job queued and signalled
 * during the replay, possibly before this backup's worker, lagging, even
 * began this wait): the caller returns as woken.  Without one it waits for
 * real, as its primary's thread still was: programs that take any wake-up
 * for their signal (memcached's hash-table thread expands the table on
 * each) would act on a wake-up nobody sent. */
static int cond_replay_unlocked(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, int *res)
{
    uint64_t signals = last_cond == c ? last_signals : 0;
    llft_rec_t e;
    if (llft_replay_next(t, op, &e)) {
        REAL(pthread_mutex_lock)(m);
        takeover_signals = signals;
        return __atomic_load_n(signals_of(c), __ATOMIC_SEQ_CST) != signals ? COND_WOKEN : COND_STILL;
    }
    *res = (int)e.ret;
    last_cond = c;
    if (e.turn == 0) { /* it failed at the primary without waiting */
        REAL(pthread_mutex_lock)(m);
        last_signals = __atomic_load_n(signals_of(c), __ATOMIC_SEQ_CST);
        return 0;
    }
    struct turnstile *ts = llft_turn_wait(t, &e);
    int r = REAL(pthread_mutex_lock)(m);
    last_signals = __atomic_load_n(signals_of(c), __ATOMIC_SEQ_CST);
    llft_turn_done(t, ts, m, e.turn);
    if (UNLIKELY(r != 0))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "re-acquiring the mutex failed here (error %d)", r);
    return 0;
}

static int cond_replay(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, int *res)
{
    /* Release first, as the real wait does: the record of this wait's end
     * may be long in coming, and other threads need the mutex meanwhile. */
    REAL(pthread_mutex_unlock)(m);
    return cond_replay_unlocked(op, c, m, t, res);
}

/* A wait open at a takeover that nobody had signalled: the real wait, in
 * slices of TAKEOVER_SLICE_NS, the signal count checked between them.  A
 * thread that signals without holding the mutex can signal between this
 * thread's reading of the count and its real wait, reaching no waiter; the
 * count it raised first wakes this one at the end of the slice.  0, or
 * ETIMEDOUT at the program's deadline on clock clk (NULL: none). */
#define TAKEOVER_SLICE_NS 10000000

static int wait_after_takeover(struct llft_thread *t, pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk,
                               const struct timespec *deadline)
{
    int64_t end = deadline ? llft_ts_ns(deadline) : INT64_MAX;
    for (;;) {
        struct timespec now;
        syscall(SYS_clock_gettime, clk, &now);
        int64_t at = llft_ts_ns(&now);
        if (at >= end)
            return ETIMEDOUT;
        int64_t until = end - at < TAKEOVER_SLICE_NS ? end : at + TAKEOVER_SLICE_NS;
        struct timespec slice = {until / LLFT_NS, until % LLFT_NS};
        int r = COND_REAL_WAIT(t, c, REAL(pthread_cond_clockwait)(c, m, clk, &slice));
        if (r != ETIMEDOUT || llft_held_or_copy())   /* (held: the caller gives the mutex back) */
            return r;
        if (__atomic_load_n(signals_of(c), __ATOMIC_SEQ_CST) != takeover_signals)
            return 0;
    }
}

static int cond_waited(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, clockid_t clk,
                       const struct timespec *deadline, int r);

/* A backup's wait, replayed (how 0: res is its result), or open at a
 * takeover (COND_WOKEN or COND_STILL: cond_replay_unlocked). */
static int cond_backup_end(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, clockid_t clk,
                           const struct timespec *deadline, int how, int res)
{
    if (how == COND_WOKEN)
        return cond_common(op, m, 0, t);
    if (how == COND_STILL)
        return cond_waited(op, c, m, t, clk, deadline, wait_after_takeover(t, c, m, clk, deadline));
    return res;
}

/* The primary's real wait ended with r (0 or ETIMEDOUT, the mutex held
 * again; or an error) while the primary is held, or in a copy of it
 * restored as a backup (see give_back): the mutex is given back, and the
 * wait ends as if woken for nothing, its re-acquisition made in the role
 * this thread has once it may go on. */
static int cond_given_back(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, clockid_t clk,
                           const struct timespec *deadline, int r)
{
    int held = r == 0 || r == ETIMEDOUT;
    if (held)
        REAL(pthread_mutex_unlock)(m);
    for (;;) {
        if (llft_quiesce_enter(t) == LLFT_ROLE_BACKUP) {
            int res = 0, how = cond_replay_unlocked(op, c, m, t, &res);
            return cond_backup_end(op, c, m, t, clk, deadline, how, res);
        }
        if (!held)
            return cond_common(op, m, r, t);
        int got = ACQUIRING(t, REAL(pthread_mutex_lock)(m));
        if (!llft_held_or_copy())
            return cond_common(op, m, got == 0 ? r : got, t);
        if (got == 0)
            REAL(pthread_mutex_unlock)(m);
    }
}

/* The primary's real wait ended with r: recorded, or given back. */
static int cond_waited(uint16_t op, pthread_cond_t *c, pthread_mutex_t *m, struct llft_thread *t, clockid_t clk,
                       const struct timespec *deadline, int r)
{
    return llft_held_or_copy() ? cond_given_back(op, c, m, t, clk, deadline, r) : cond_common(op, m, r, t);
}

/* A condition wait's result.  clk and deadline: what wait_after_takeover
 * needs of the program's wait (deadline NULL for an untimed one). */
#define COND_WAITED(op, c, m, clk, deadline, real_call)                             \
    ({                                                                              \
        LLFT_CALL(t);                                                               \
        int role = llft_call_mode(&t), res = 0, how = 0;                            \
        if (UNLIKELY(role == LLFT_ROLE_BACKUP)) {                                   \
            how = cond_replay(op, c, m, t, &res);                                   \
            res = cond_backup_end(op, c, m, t, clk, deadline, how, res);            \
        } else if (LIKELY(role == LLFT_ROLE_PRIMARY)) {                             \
            res = cond_waited(op, c, m, t, clk, deadline, COND_REAL_WAIT(t, c, real_call)); \
        } else {                                                                    \
            res = real_call;                                                        \
        }                                                                           \
        res;                                                                        \
    })
#define COND_WAIT(op, c, m, clk, deadline, real_call)                               \
    LLFT_SWITCH_POINT(int, COND_WAITED(op, c, m, clk, deadline, real_call))

/* The clock a condition variable's timed waits use (glibc keeps it in bit 1
 * of __wrefs: pthread_condattr_setclock). */
static inline int cond_clock(const pthread_cond_t *c)
{
    return (__atomic_load_n(&c->__data.__wrefs, __ATOMIC_RELAXED) & 2) ? CLOCK_MONOTONIC : CLOCK_REALTIME;
}

EXPORT int pthread_cond_wait(pthread_cond_t *restrict c, pthread_mutex_t *restrict m)
{
    COND_WAIT(LLFT_OP_COND_WAIT, c, m, CLOCK_MONOTONIC, NULL, REAL(pthread_cond_wait)(c, m));
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *restrict c, pthread_mutex_t *restrict m,
                                  const struct timespec *restrict at)
{
    COND_WAIT(LLFT_OP_COND_TIMEDWAIT, c, m, cond_clock(c), LOCAL_DEADLINE(cond_clock(c), at),
              REAL(pthread_cond_timedwait)(c, m, LOCAL_DEADLINE(cond_clock(c), at)));
}

EXPORT int pthread_cond_clockwait(pthread_cond_t *restrict c, pthread_mutex_t *restrict m, clockid_t clk,
                                  const struct timespec *restrict at)
{
    COND_WAIT(LLFT_OP_COND_TIMEDWAIT, c, m, clk, LOCAL_DEADLINE(clk, at),
              REAL(pthread_cond_clockwait)(c, m, clk, LOCAL_DEADLINE(clk, at)));
}
