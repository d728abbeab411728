/* Internals of the preload library shared by its wrapper files. */
#ifndef LLFT_SHIM_H
#define LLFT_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ring.h"

#include <stdint.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT   __attribute__((visibility("default")))
#define LIKELY(x)   __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TLS_IE   __attribute__((tls_model("initial-exec")))

enum { TS_UNTRACKED = 0, TS_TRACKED = 1 };

struct tqueue;

/* Per-thread state.  Zero-initialised TLS means "not a thread llft knows". */
struct llft_thread {
    uint32_t tid;            /* T */
    uint32_t tn;             /* N of the last record written (primary) or replayed (backup) */
    uint32_t state;          /* TS_* */
    uint32_t depth;          /* > 0 while inside the shim: nested calls pass through */
    uint64_t cached_tail;    /* primary: last seen ring tail, saves a shared load */
    uint64_t ring_end;       /* primary: the ring position after this thread's last record */
    struct tqueue *q;        /* backup: this thread's replay queue... */
    uint32_t q_era;          /* ...if taken in the replay engine's current era (demote.c) */
    uint64_t stamp;          /* backup: when its last record was replayed (the replica's record count) */
    uint32_t serial_turn;    /* --serialize: 1 while this thread holds the replica's turn (serialize.c) */
    /* A quiesce's census (quiesce.c) reads these from a signal handler on
     * this same thread: plain stores, ordered by signal fences. */
    uint16_t calls;          /* recorded calls open (more than one: a signal handler's, inside one) */
    uint8_t parked;          /* waiting at a call's entry while the primary is held */
    uint8_t q_pending;       /* the census asked while in a call: answer on leaving it */
    uint8_t blocking;        /* inside the real blocking system call of a primary branch */
    uint8_t kicked;          /* ...which the census interrupted: the call is started again */
    int errno_before_kick;   /* ...with errno as the program had it before the interrupted call */
    uint32_t q_gen;          /* the census it answers */
    uint32_t q_slot;         /* 1 + its slot in the control block's list of threads to interrupt; 0: none */
    uint64_t held_signals;   /* primary: signals that came while inside the shim, blocked until the call
                              * blocks or ends (wrap_signal.c) */
};

extern __thread struct llft_thread llft_self TLS_IE;
extern int llft_state;            /* 0 not started, 1 initialising, 2 ready, or: */
#define LLFT_STATE_FORKING 3      /* ready, and a fork() is under way: a call may be the child's (daemon_fork.c) */
extern llft_ctl_t *llft_ctl;      /* NULL when this process is not replicated */
extern llft_ring_t *llft_ring;
extern uint32_t llft_next_tid;    /* primary: next logical thread id */

void  llft_init_slow(void);
void *llft_resolve(const char *name, const char *version);

/* Resolves the next definition of NAME lazily: never in a constructor, where
 * other libraries may already be calling us. */
#define REAL(name) (*(__typeof__(&name))llft_real_##name())
#define DEFINE_REAL(name) DEFINE_REAL_V(name, NULL)
#define DEFINE_REAL_V(name, ver)                                              \
    static void *llft_real_ptr_##name;                                        \
    static inline void *llft_real_##name(void) {                              \
        void *p = __atomic_load_n(&llft_real_ptr_##name, __ATOMIC_RELAXED);    \
        if (UNLIKELY(!p)) {                                                   \
            p = llft_resolve(#name, ver);                                      \
            __atomic_store_n(&llft_real_ptr_##name, p, __ATOMIC_RELAXED);      \
        }                                                                     \
        return p;                                                             \
    }

/* A copy of the primary restored as a backup (demote.c): its first call
 * makes it one; returns LLFT_ROLE_BACKUP. */
int llft_demote(void);
/* Wakes every condition wait the primary's threads are in for real
 * (wrap_lock.c): a copy's first step as a backup. */
void llft_cond_waits_wake(void);

/* Which role the calling thread plays for this call: LLFT_ROLE_OFF means
 * "just call the real function". */
static inline int llft_mode(struct llft_thread **tp)
{
    if (UNLIKELY(__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) != 2))
        llft_init_slow();
    struct llft_thread *t = &llft_self;
    if (UNLIKELY(t->state != TS_TRACKED || t->depth || !llft_ctl))
        return LLFT_ROLE_OFF;
    *tp = t;
    int role = (int)__atomic_load_n(&llft_ctl->role, __ATOMIC_RELAXED);
    if (UNLIKELY(role >= LLFT_ROLE_COPY))
        role = llft_demote();
    return role;
}

/* ---- a quiesce of the primary for its checkpoint (quiesce.c) ----
 * Every recorded call is entered through llft_call_mode, with its thread
 * declared by LLFT_CALL: while the controller holds the primary, such
 * calls wait at their entry, and one blocked in the kernel is interrupted
 * and started again, so that no thread is inside a recorded call of the
 * primary's when its image is taken, and none records until it is
 * released.  Lock and condition waits are the exception: a thread waits
 * for the lock as a thread outside any call, and once it has it, gives
 * it back and waits at the entry (wrap_lock.c). */
void llft_quiesce_init(void);
void llft_quiesce_exec(void);
int  llft_quiesce_enter(struct llft_thread *t);
void llft_quiesce_answer(struct llft_thread *t);
/* The mask a wait call sets while it waits (ppoll, pselect, epoll_pwait),
 * with the quiesce's signals left open: mask itself, or a copy in buf. */
const sigset_t *llft_mask_without_ours(const sigset_t *mask, sigset_t *buf);
static inline int llft_call_mode(struct llft_thread **tp)
{
    int role = llft_mode(tp);
    if (role == LLFT_ROLE_OFF) {
        *tp = NULL;
        return role;
    }
    struct llft_thread *t = *tp;
    __atomic_store_n(&t->calls, t->calls + 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* (A call inside a signal handler's, inside a call, does not wait: the
     * census waits for the outer one.) */
    if (UNLIKELY(__atomic_load_n(&llft_ctl->quiesce, __ATOMIC_ACQUIRE)) && role == LLFT_ROLE_PRIMARY &&
        t->calls == 1)
        role = llft_quiesce_enter(t);
    return role;
}
void llft_signals_release(struct llft_thread *t); /* wrap_signal.c */
static inline void llft_call_end(struct llft_thread **tp)
{
    struct llft_thread *t = *tp;
    if (!t)
        return;
    if (UNLIKELY(t->held_signals) && !t->depth)
        llft_signals_release(t);
    __atomic_store_n(&t->calls, t->calls - 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (UNLIKELY(__atomic_load_n(&t->q_pending, __ATOMIC_RELAXED)) && t->calls == 0)
        llft_quiesce_answer(t);
}
#define LLFT_CALL(t) struct llft_thread *t __attribute__((cleanup(llft_call_end))) = NULL
/* call, the wrapper's own, made again once this call (t's) has ended (a
 * timed wait starts again with its whole timeout: a hold of the primary
 * makes it last up to that much longer).  errno is as the program had it
 * before the interrupted call: a call that then succeeds leaves it so, as
 * any successful call does, and a program may read it (CPython's poll
 * loop retries when it says EINTR, whatever poll returned). */
#define LLFT_AGAIN(t, call)                                                         \
    ({                                                                              \
        int errno_again_ = (t)->errno_before_kick;                                  \
        llft_call_end(&(t));                                                        \
        (t) = NULL;                                                                 \
        errno = errno_again_;                                                       \
        call;                                                                       \
    })
/* A lock or condition wait of a primary branch (wrap_lock.c): the census
 * takes the thread for one outside any call while it waits. */
static inline void llft_acquiring(struct llft_thread *t, int on)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    __atomic_store_n(&t->parked, (uint8_t)on, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (on && UNLIKELY(__atomic_load_n(&t->q_pending, __ATOMIC_RELAXED)))
        llft_quiesce_answer(t);
}
/* After such a wait: the primary is held, or this is a copy of it
 * restored as a backup; either way what was acquired is given back. */
static inline int llft_held_or_copy(void)
{
    return UNLIKELY(__atomic_load_n(&llft_ctl->quiesce, __ATOMIC_ACQUIRE) ||
                    __atomic_load_n(&llft_ctl->role, __ATOMIC_RELAXED) != LLFT_ROLE_PRIMARY);
}
/* The real blocking call of a primary branch, marked so that a census
 * interrupts it (then llft_kicked says so).  Not made at all once a census
 * has counted this thread as inside its call: it would block where no
 * kick reaches it (the census lists only threads already in the real
 * call); it ends as kicked instead.  A signal handler's call inside it
 * leaves the marks as they were. */
#define LLFT_BLOCKING(t, call)                                                      \
    ({                                                                              \
        if (UNLIKELY((t)->held_signals) && !(t)->depth)                             \
            llft_signals_release(t); /* handled before the wait, not after it */    \
        uint8_t outer_blocking_ = (t)->blocking, outer_kicked_ = (t)->kicked;       \
        int errno_before_ = errno;                                                  \
        __atomic_store_n(&(t)->kicked, 0, __ATOMIC_RELAXED);                        \
        __atomic_store_n(&(t)->blocking, 1, __ATOMIC_RELAXED);                      \
        __atomic_signal_fence(__ATOMIC_SEQ_CST);                                    \
        __typeof__(call) blocking_ret_;                                             \
        if (UNLIKELY(__atomic_load_n(&(t)->q_pending, __ATOMIC_RELAXED))) {         \
            __atomic_store_n(&(t)->kicked, 1, __ATOMIC_RELAXED);                    \
            errno = EINTR;                                                          \
            blocking_ret_ = -1;                                                     \
        } else {                                                                    \
            blocking_ret_ = (call);                                                 \
        }                                                                           \
        __atomic_signal_fence(__ATOMIC_SEQ_CST);                                    \
        __atomic_store_n(&(t)->blocking, outer_blocking_, __ATOMIC_RELAXED);        \
        if ((t)->kicked)                                                            \
            (t)->errno_before_kick = errno_before_;                                  \
        (t)->kicked |= outer_kicked_;                                               \
        blocking_ret_;                                                              \
    })
/* The blocking call just made returned r because a census interrupted it:
 * the caller starts the call again with LLFT_AGAIN, from its wrapper's
 * entry, where it waits for the quiesce to end. */
static inline int llft_kicked(struct llft_thread *t, long r)
{
    return UNLIKELY(r < 0 && errno == EINTR && __atomic_load_n(&t->kicked, __ATOMIC_RELAXED));
}

#define LLFT_NS 1000000000LL
static inline int64_t llft_ts_ns(const struct timespec *ts) { return (int64_t)ts->tv_sec * LLFT_NS + ts->tv_nsec; }

/* The shim's own naps and yields: raw, never the program's switch points
 * (serialize.c wraps nanosleep and sched_yield).  A nap keeps errno as the
 * program had it, as the futex waits do (ring.c): a stop ends it with EINTR
 * (CRIU restores a frozen backup's sleep so), which the replayed call it
 * waits inside would otherwise seem to have had. */
static inline void llft_nap(const struct timespec *d)
{
    int saved = errno;
    syscall(SYS_nanosleep, d, NULL);
    errno = saved;
}
static inline void llft_yield(void) { syscall(SYS_sched_yield); }

/* ---- a daemon's fork (daemon_fork.c) ---- */
enum { LLFT_FORK_PLAIN, LLFT_FORK_HELD, LLFT_FORK_RESUMED };
extern int llft_fork_held;             /* a forked child waits for this process's next move */
extern int llft_fork_waited_for;       /* this process was such a child, let go as its parent waited (read, poll) */
/* fork(): how says whether the child is held (parent) or this process went
 * on as its child (resumed, returning 0). */
pid_t llft_daemon_fork(pid_t (*real_fork)(void), int *how);
/* The parent's next move lets the held child go on: a switch point (a
 * read of the child's pipe, say: waiting is nonzero) or another call. */
void  llft_daemon_fork_settle(int waiting);
void  llft_daemon_exit(void);          /* exit or _exit: goes on as the held child instead */
void  llft_fork_child_check(void);     /* during a fork: a call in the child leaves the stream */
int   llft_daemon_gate_at(unsigned long addr);

/* ---- forked processes replicated (fork_stream.c) ---- */
pid_t llft_fork_replicated(pid_t (*real_fork)(void));
/* The first memory this process maps shared with the processes it forks
 * (an anonymous shared mapping, a System V segment), as a phrase, or ""
 * (wrap_fork.c). */
const char *llft_shared_memory(void);
/* Whether addr is where the fork gates are mapped (the shim's, not the program's sharing). */
int   llft_fork_gates_at(unsigned long addr);
/* The pid map of a replica that forked as a backup: the pid the program
 * holds (the primary's child's) and this process's own child; either way
 * unchanged when not in it. */
pid_t llft_pid_local(pid_t program);
pid_t llft_pid_program(pid_t local);
void  llft_pid_forget(pid_t program);
/* Calls visit(line, arg) for each line of /proc/self/maps, read with raw
 * calls (the program's read is the shim's), until it returns nonzero
 * (wrap_fork.c). */
void  llft_each_mapping(int (*visit)(const char *line, void *arg), void *arg);

/* ---- --serialize: one thread runs at a time (serialize.c) ---- */
extern int llft_serial_on;            /* set once, at attach */
void llft_serial_init(void);
void llft_serial_forked(const struct llft_thread *t);   /* a forked process's one thread */
void llft_serial_give_slow(void);
void llft_serial_take_slow(void);
static inline void llft_serial_give(void)
{
    if (UNLIKELY(llft_serial_on))
        llft_serial_give_slow();
}
static inline void llft_serial_take(void)
{
    if (UNLIKELY(llft_serial_on))
        llft_serial_take_slow();
}
/* Returns call's value; under --serialize the turn is given up around it
 * (a call that may wait for another thread or for input), errno kept.  A
 * child held by a daemon's fork is let go first (daemon_fork.c). */
#define LLFT_SWITCH_POINT(type, call)                                               \
    do {                                                                            \
        if (UNLIKELY(llft_fork_held))                                               \
            llft_daemon_fork_settle(1);                                             \
        if (LIKELY(!llft_serial_on))                                                \
            return call;                                                            \
        llft_serial_give_slow();                                                    \
        type switch_ret_ = call;                                                    \
        int switch_err_ = errno;                                                    \
        llft_serial_take_slow();                                                    \
        errno = switch_err_;                                                        \
        return switch_ret_;                                                         \
    } while (0)
/* An exported wrapper that is a switch point: its body follows, as
 * NAME_call's. */
#define SWITCHING(ret, name, params, args)                                          \
    static ret name##_call params;                                                  \
    EXPORT ret name params { LLFT_SWITCH_POINT(ret, name##_call args); }           \
    static ret name##_call params

/* ---- primary: recording (record.c) ---- */
void llft_record(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn,
                 int64_t ret, int32_t err, int64_t val);
void llft_record_aux(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn,
                     int64_t ret, int32_t err, int64_t val, uint32_t aux);
/* Primary: waits until every ring slot before t's last record is
 * committed (record.c), so that a failover's cut never falls before it. */
void llft_wait_committed(struct llft_thread *t);
void llft_record_data_aux(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn, int64_t ret,
                          int32_t err, const void *buf, uint64_t len, uint32_t aux);
void llft_record_data(struct llft_thread *t, uint16_t op, uint64_t obj, uint64_t turn, int64_t ret,
                      int32_t err, const void *buf, uint64_t len);

/* ---- inputs recorded as bytes (wrap_random.c) ---- */
/* fill() produces up to n bytes into buf (the real call) and returns how
 * many, or -1 with errno; the primary records them, a backup returns them. */
typedef int64_t (*fill_fn)(void *buf, uint64_t n, uint64_t obj);
int64_t llft_recorded_call(uint16_t op, uint64_t obj, void *buf, uint64_t n, fill_fn fill);

/* ---- primary: address -> logical object (objtable.c) ---- */
struct llft_obj {
    uintptr_t addr;
    uint64_t id;
    uint64_t turns;
};
struct llft_obj *llft_obj_get(const void *addr, const struct llft_thread *t);
/* The entry for addr, made with id new_id if there was none. */
struct llft_obj *llft_obj_at(const void *addr, uint64_t new_id);
void llft_obj_each(void (*visit)(const struct llft_obj *o));
static inline uint64_t llft_obj_take_turn(struct llft_obj *o)
{
    return __atomic_add_fetch(&o->turns, 1, __ATOMIC_RELAXED);
}

/* ---- backup: replay (replay.c) ---- */
void llft_replay_reserve(void);
void llft_obj_reserve(void);

void llft_replay_setup(void);
/* A copy of the primary becoming a backup (demote.c): the replay engine
 * starts afresh (the primary may once have been a backup), the primary
 * having created threads up to last_tid. */
void llft_replay_restart(uint32_t last_tid);
/* Returns 0 with the thread's next record, or LLFT_PROMOTED: this replica
 * has just become the primary and the caller must do the call as one. */
#define LLFT_PROMOTED 1
int  llft_replay_next(struct llft_thread *t, uint16_t op, llft_rec_t *out);
/* ...only if the thread's next record is that call: LLFT_NOT_NEXT (the
 * record stays) when it is another. */
#define LLFT_NOT_NEXT 2
int  llft_replay_next_if(struct llft_thread *t, uint16_t op, llft_rec_t *out);
int  llft_replay_recent(const struct llft_thread *t, llft_rec_t *out, int max);
void llft_replay_data(struct llft_thread *t, void *buf, uint64_t len);
struct turnstile;
struct turnstile *llft_turn_wait(struct llft_thread *t, const llft_rec_t *e);
/* The turn is taken, acquiring the object at addr (a lock's address, an
 * fd's tag): what this replica continues with, should it take over. */
void llft_turn_done(const struct llft_thread *t, struct turnstile *ts, const void *addr, uint64_t turn);
void llft_replay_thread_start(struct llft_thread *t);
void llft_replay_thread_end(struct llft_thread *t);
void llft_replay_at_exit(struct llft_thread *t);
void llft_replay_exec_failed(void);
void llft_replay_signal_sent(void);   /* a backup sent the signal the primary sent itself: its successors may replay */
/* A backup thread reached the primary's SIGNAL record e: the program's
 * handler runs (wrap_signal.c). */
void llft_signal_replayed(const llft_rec_t *e, siginfo_t *info);
void llft_python_threads_start(void); /* python_gil.c */

/* ---- group clock (wrap_time.c) ---- */
/* A primary that took over keeps the group clock at an offset from its own:
 * an absolute deadline the program computed from the group clock becomes
 * one on this replica's clock (buf), so a timed wait lasts as long as the
 * program meant; otherwise at itself. */
struct timespec;
const struct timespec *llft_local_deadline(int clock, const struct timespec *at, struct timespec *buf);
#define LOCAL_DEADLINE(clock, at) llft_local_deadline((clock), (at), &(struct timespec){0, 0})

/* The image an exec would start cannot be reached by this library
 * (elf_check.c): why, or NULL.  name is searched on PATH when search;
 * fd >= 0 judges that open file instead (fexecve). */
const char *llft_exec_unreachable(const char *name, int search, int fd);

/* ---- divergence (core.c) ---- */
/* Stops this replica, saying in the control block why it cannot be
 * replicated (LLFT_EXIT_UNREACHABLE). */
__attribute__((noreturn, format(printf, 1, 2))) void llft_refuse(const char *fmt, ...);
/* Reads up to cap - 1 bytes of a small file (under /proc) with the
 * kernel's calls alone, NUL-terminated: their count, or -1. */
long llft_read_small_file(const char *path, char *buf, size_t cap);
/* A page of memory shared with the processes this one forks (the shim's
 * own), or NULL. */
static inline void *llft_shared_page(void)
{
    void *p = (void *)syscall(SYS_mmap, NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return (long)p < 0 && (long)p > -4096 ? NULL : p;
}
/* The replica's lease (replica_lease.c): its first process holds it; a
 * forked process checks it before each record it writes. */
struct lease_page;
extern struct lease_page *llft_lease_watched;
void  llft_lease_hold(void);
void  llft_lease_attach(llft_ctl_t *ctl);
void  llft_lease_forked(int child);
void  llft_lease_leaving(int leaving);
void  llft_lease_thread_ends(void);
void  llft_lease_check_slow(void);
int   llft_lease_at(unsigned long addr);
static inline void llft_lease_check(void)
{
    if (UNLIKELY(llft_lease_watched != NULL))
        llft_lease_check_slow();
}
/* Ends the process at once, as _exit does, without the program's _exit
 * wrapper (core.c), which would wait for the primary's end of stream. */
__attribute__((noreturn)) void llft_exit_now(int code);
/* The control block of the replica this process was forked from, or NULL:
 * a forked child runs unrecorded, and may not reach the program's clients
 * (llft_forked_use refuses it). */
extern llft_ctl_t *llft_forked_from;
__attribute__((noreturn)) void llft_forked_use(int fd, const char *what);
__attribute__((noreturn, format(printf, 5, 6)))
void llft_diverge(const struct llft_thread *t, uint16_t want_op, const llft_rec_t *got,
                  int exit_code, const char *fmt, ...);
void llft_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t llft_now_ms(void);
uint64_t llft_now_ns(void);

/* How long a wait has lasted, for its stall timeout: the time between two
 * looks at it counts for at most LLFT_LOOK_MAX_MS, so that a process
 * stopped meanwhile (CRIU's freeze of a backup, a stored checkpoint
 * restored long after its dump, a debugger) is not taken for one stalled
 * all the while.  Zeroed before the wait; each call is one look. */
#define LLFT_LOOK_MAX_MS 1000
struct llft_waited {
    uint64_t last_ms, ms;
};
uint64_t llft_waited_ms(struct llft_waited *w);

#endif
