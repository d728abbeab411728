/* Logical thread identities: the primary numbers threads in creation order
 * and records each child's number in the parent's pthread_create record, so
 * a backup gives the same thread the same T whatever its scheduler does. */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

DEFINE_REAL(pthread_create)
DEFINE_REAL(pthread_exit)

/* What a child needs to start.  At the primary it starts only once its
 * parent has recorded its creation (created): a child that recorded
 * calls first (a connection thread answering its client at once) would
 * leave, were the primary to die before the parent's record, records of a
 * thread no backup could create, and no backup could take over. */
struct start {
    void *(*fn)(void *);
    void *arg;
    uint32_t tid;
    uint32_t created;
};

static void thread_finish(struct llft_thread *t)
{
    llft_lease_thread_ends();
    LLFT_CALL(me);
    int role = llft_call_mode(&me);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_THREAD_EXIT, &e))
            llft_replay_thread_end(t);
        else
            role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY)
        llft_record(t, LLFT_OP_THREAD_EXIT, 0, 0, 0, 0, 0);
    /* The call ends here: the thread itself does not return from it. */
    llft_call_end(&me);
    me = NULL;
    llft_serial_give();
    /* Whatever runs after this (TLS destructors) is not replicated. */
    t->state = TS_UNTRACKED;
}

static void *trampoline(void *p)
{
    struct start *sp = p;
    while (!__atomic_load_n(&sp->created, __ATOMIC_ACQUIRE))
        llft_futex_wait(&sp->created, 0, 100);
    struct start s = *sp;
    free(sp);
    struct llft_thread *t = &llft_self;
    t->tid = s.tid;
    t->tn = 0;
    t->depth = 0;
    t->cached_tail = 0;
    t->q = NULL;
    t->serial_turn = 0;
    t->state = TS_TRACKED;
    if (llft_ctl && __atomic_load_n(&llft_ctl->role, __ATOMIC_RELAXED) == LLFT_ROLE_BACKUP)
        llft_replay_thread_start(t);
    llft_serial_take(); /* --serialize: its first turn */
    void *ret = s.fn(s.arg);
    thread_finish(t);
    return ret;
}

/* Creates the thread; *started (when not NULL) gets its start, for the
 * primary to let it go once the creation is recorded (let_go). */
static int create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg, uint32_t tid,
                  struct start **started)
{
    /* What pthread_create does inside (malloc, and the TLS of the child:
     * calloc) passes through unrecorded: the primary records the creation
     * after it, a backup consumes that record before it, so records made
     * in between (an allocator's locks: jemalloc's) would be out of place. */
    llft_self.depth++;
    int r = EAGAIN;
    struct start *s = malloc(sizeof *s);
    if (s) {
        s->fn = fn;
        s->arg = arg;
        s->tid = tid;
        s->created = started == NULL;
        r = REAL(pthread_create)(th, attr, trampoline, s);
        if (r != 0)
            free(s);
        else if (started)
            *started = s;
    }
    llft_self.depth--;
    return r;
}

static void let_go(struct start *s)
{
    __atomic_store_n(&s->created, 1, __ATOMIC_RELEASE);
    llft_futex_wake(&s->created); /* a key only: the child may have freed s already */
}

EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (UNLIKELY(llft_fork_held))
        llft_daemon_fork_settle(0); /* a forked child goes on once its parent has threads */
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role != LLFT_ROLE_OFF)
        llft_python_threads_start();
    /* --serialize: the first thread runs without the turn while alone; the
     * child must not run beside it. */
    llft_serial_take();
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_THREAD_CREATE, &e)) {
            if (e.ret != 0)
                return (int)e.ret; /* it failed at the primary: fail the same way */
            int r = create(th, attr, fn, arg, (uint32_t)e.val, NULL);
            if (r != 0)
                llft_diverge(t, LLFT_OP_THREAD_CREATE, &e, LLFT_EXIT_DIVERGED,
                             "pthread_create failed here (error %d) but succeeded at the primary", r);
            __atomic_fetch_add(&llft_ctl->threads, 1, __ATOMIC_RELAXED);
            return 0;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        uint32_t tid = __atomic_fetch_add(&llft_next_tid, 1, __ATOMIC_RELAXED);
        struct start *started = NULL;
        int r = create(th, attr, fn, arg, tid, &started);
        llft_record(t, LLFT_OP_THREAD_CREATE, 0, 0, r, 0, tid);
        if (r == 0) {
            let_go(started);
            __atomic_fetch_add(&llft_ctl->threads, 1, __ATOMIC_RELAXED);
        }
        return r;
    }
    return REAL(pthread_create)(th, attr, fn, arg);
}

EXPORT void pthread_exit(void *rv)
{
    struct llft_thread *t = &llft_self;
    if (t->state == TS_TRACKED && t->tid != 0)
        thread_finish(t);
    REAL(pthread_exit)(rv);
    __builtin_unreachable();
}
