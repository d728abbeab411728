/* --serialize (LLFT_SERIALIZE=1 in the environment): the threads of
 * a replica take turns, one running the program's code at a time and
 * switching only at calls the shim sees, in an order the primary records
 * and the backups follow (deterministic multithreading, as rr gets its
 * determinism from running on one core).  Accesses to memory outside any
 * lock, atomics included, then happen in the same order at every replica.
 *
 * The turn is a word naming its holder, taken in turns recorded as the
 * program's lock acquisitions are (LLFT_OP_SERIAL_TURN), so that a backup
 * takes it in the primary's order and a takeover needs nothing of its own.
 * A thread holds it while it runs the program; a call that may wait for
 * another thread or for input gives it up around the wait
 * (LLFT_SWITCH_POINT in shim.h).  Writes are not switch points: stdio holds
 * a stream's lock across its write(), and a thread that took the turn
 * meanwhile and blocked on that lock would keep it.
 *
 * A holder that goes on without such a call because it waits for another
 * thread (a spin on memory, as redis's main thread waits for its I/O
 * threads, or a wait in the kernel the shim does not see) would keep the
 * others from running for good.  A waiting thread then takes the turn
 * beside it, recorded as taken from it: a backup's thread takes it so too,
 * once the holder there has started every call it had started at the
 * primary by then (replay.c's previous-holder wait).  The holder goes on
 * until its next switch point, where it finds the turn gone and waits for
 * it as any thread does.  The two run side by side until then, which is
 * harmless for a spin but not for a holder that computes and races (a JVM
 * thread loading classes or compiling runs 100 ms without a call, and its
 * compiler threads then install code beside it, so that the replicas take
 * different paths into the VM).  So a holder asleep in the kernel loses
 * the turn after STEAL_ASLEEP_MS, but one on a CPU only once it has spent
 * STEAL_RUNNING_CPU_MS of CPU time while another waited: far more than any
 * computation between two calls, and what a spin costs each time.  The
 * steals are counted in the control block, and llft-run says so. */
#include "shim.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

DEFINE_REAL(nanosleep)
DEFINE_REAL(clock_nanosleep)
DEFINE_REAL(usleep)
DEFINE_REAL(sleep)
DEFINE_REAL(sched_yield)
DEFINE_REAL(pthread_join)

/* A holder asleep in the kernel this long is in a wait the shim does not
 * see.  One running this much CPU time while another thread waits spins
 * for it: longer than a bounded spin runs (redis's I/O threads spin a
 * million times before they sleep) and than the JVM computes between two
 * calls (its class loading and compiles take up to 100 ms), so that a
 * holder that would give the turn up by itself is left alone. */
#define STEAL_ASLEEP_MS 10
#define STEAL_RUNNING_CPU_MS 500

int llft_serial_on;
static uint32_t owner; /* logical tid + 1 of the thread holding the turn; 0: none */

/* The holder, for stealing. */
static uint32_t holder_ktid;
static uint64_t held_since_ms;

void llft_serial_init(void)
{
    const char *v = getenv("LLFT_SERIALIZE");
    llft_serial_on = v && *v && *v != '0';
}

/* A forked process (fork_stream.c), its one thread numbered afresh: it
 * holds the turn if it held it in its parent as it forked; the parent's
 * other threads, one of which may hold it there, are not in this process. */
void llft_serial_forked(const struct llft_thread *t)
{
    __atomic_store_n(&owner, t->serial_turn ? t->tid + 1 : 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&holder_ktid, (uint32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    __atomic_store_n(&held_since_ms, llft_now_ms(), __ATOMIC_SEQ_CST);
}

/* The state of thread ktid of this process as /proc shows it ('R'
 * running, 'S' or 'D' waiting in the kernel), or 0 when it is gone or
 * stopped (by a debugger or a signal: a frozen replica is the
 * controller's to fence). */
static char thread_state(uint32_t ktid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%u/stat", ktid);
    if (llft_read_small_file(path, buf, sizeof buf) <= 0)
        return 0;
    const char *paren = strrchr(buf, ')');
    if (!paren || !paren[1] || !paren[2] || !strchr("RSD", paren[2]))
        return 0;
    return paren[2];
}

/* CPU time thread ktid of this process has run, in ms (the clock
 * pthread_getcpuclockid names, built from the kernel's thread id). */
static uint64_t thread_cpu_ms(uint32_t ktid)
{
    struct timespec ts;
    clockid_t clock = (clockid_t)((~ktid << 3) | 6); /* CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD */
    if (syscall(SYS_clock_gettime, clock, &ts) != 0)
        return 0;
    return (uint64_t)llft_ts_ns(&ts) / 1000000;
}

/* What a waiting thread saw of the hold it waits on: when it began, and
 * the holder's CPU time when the waiter first saw it. */
struct hold_seen {
    uint64_t since_ms;
    uint64_t cpu_ms;
};

/* Whether the holder keeps the turn from a thread that has waited for it:
 * asleep in the kernel past STEAL_ASLEEP_MS, or running past
 * STEAL_RUNNING_CPU_MS of CPU time since the waiter saw the hold begin. */
static int keeps_turn_from_waiter(struct hold_seen *seen)
{
    uint64_t since = __atomic_load_n(&held_since_ms, __ATOMIC_SEQ_CST);
    uint32_t ktid = __atomic_load_n(&holder_ktid, __ATOMIC_SEQ_CST);
    if (since != seen->since_ms) {
        seen->since_ms = since;
        seen->cpu_ms = thread_cpu_ms(ktid);
    }
    if (llft_now_ms() - since < STEAL_ASLEEP_MS)
        return 0;
    switch (thread_state(ktid)) {
    case 'S':
    case 'D':
        return 1;
    case 'R':
        return thread_cpu_ms(ktid) - seen->cpu_ms >= STEAL_RUNNING_CPU_MS;
    default:
        return 0;
    }
}

/* Primary: takes the turn; returns the holder it was taken from (its tid
 * + 1), or 0 when it was free. */
static uint32_t primary_take(struct llft_thread *t)
{
    uint32_t me = t->tid + 1;
    struct hold_seen seen = {UINT64_MAX, 0};
    for (;;) {
        uint32_t o = __atomic_load_n(&owner, __ATOMIC_SEQ_CST);
        if (o == 0) {
            if (__atomic_compare_exchange_n(&owner, &o, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                return 0;
            continue;
        }
        llft_futex_wait(&owner, o, STEAL_ASLEEP_MS);
        if (__atomic_load_n(&owner, __ATOMIC_SEQ_CST) != o
            || !keeps_turn_from_waiter(&seen))
            continue;
        if (__atomic_compare_exchange_n(&owner, &o, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_fetch_add(&llft_ctl->serial_steals, 1, __ATOMIC_RELAXED);
            return o;
        }
    }
}

/* Backup: the turn as the primary's thread took it: after the previous
 * holder gave it up, or beside it when the primary's took it from it. */
static void backup_take(struct llft_thread *t, uint32_t from)
{
    uint32_t me = t->tid + 1;
    for (;;) {
        uint32_t o = __atomic_load_n(&owner, __ATOMIC_SEQ_CST);
        if (o == 0 || (from && o == from)) {
            if (__atomic_compare_exchange_n(&owner, &o, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                return;
            continue;
        }
        llft_futex_wait(&owner, o, 50);
    }
}

static void take(struct llft_thread *t, int role)
{
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_SERIAL_TURN, &e)) {
            struct turnstile *ts = llft_turn_wait(t, &e);
            backup_take(t, (uint32_t)e.val);
            llft_turn_done(t, ts, &owner, e.turn);
            return;
        }
    }
    uint32_t from = primary_take(t);
    struct llft_obj *o = llft_obj_get(&owner, t);
    llft_record(t, LLFT_OP_SERIAL_TURN, o->id, llft_obj_take_turn(o), 0, 0, from);
}

void llft_serial_give_slow(void)
{
    struct llft_thread *t;
    if (llft_mode(&t) == LLFT_ROLE_OFF || !t->serial_turn)
        return;
    t->serial_turn = 0;
    uint32_t me = t->tid + 1;
    /* Taken from this thread meanwhile: it is the taker's to give. */
    if (__atomic_compare_exchange_n(&owner, &me, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        llft_futex_wake(&owner);
}

void llft_serial_take_slow(void)
{
    struct llft_thread *t;
    int role = llft_mode(&t);
    if (role == LLFT_ROLE_OFF || t->serial_turn)
        return;
    take(t, role);
    t->serial_turn = 1;
    __atomic_store_n(&holder_ktid, (uint32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    __atomic_store_n(&held_since_ms, llft_now_ms(), __ATOMIC_SEQ_CST);
}

/* Calls that only wait, recorded nowhere, are switch points all the same:
 * a thread that sleeps or joins another keeping the turn would stop the
 * others for as long, or for good. */
EXPORT int nanosleep(const struct timespec *d, struct timespec *rem)
{
    LLFT_SWITCH_POINT(int, REAL(nanosleep)(d, rem));
}

EXPORT int clock_nanosleep(clockid_t c, int flags, const struct timespec *d, struct timespec *rem)
{
    LLFT_SWITCH_POINT(int, REAL(clock_nanosleep)(c, flags, d, rem));
}

EXPORT int usleep(useconds_t us)
{
    LLFT_SWITCH_POINT(int, REAL(usleep)(us));
}

EXPORT unsigned int sleep(unsigned int s)
{
    LLFT_SWITCH_POINT(unsigned int, REAL(sleep)(s));
}

EXPORT int sched_yield(void)
{
    LLFT_SWITCH_POINT(int, REAL(sched_yield)());
}

EXPORT int pthread_join(pthread_t th, void **ret)
{
    LLFT_SWITCH_POINT(int, REAL(pthread_join)(th, ret));
}
