/* The primary held still for a checkpoint of itself (docs/checkpoints.md).
 *
 * CRIU freezes every thread wherever it is.  A thread in the program's own
 * code is no trouble: a copy made of the image goes on from there as the
 * primary does.  A thread inside a recorded call is: between the real
 * call and its record the image and the stream disagree, and one blocked
 * in a real read would, in a copy, start that read again and take input
 * no record accounts for.  So before the image is taken the controller
 * holds the primary (quiesce_hold.c): it raises the control block's
 * quiesce flag and sends every thread CENSUS_SIGNAL.  A thread outside any
 * recorded call answers at once from the handler, and from then on waits
 * at the entry of any recorded call until the flag is lowered; a thread
 * inside one answers on leaving it.  One inside the real blocking call of
 * a wrapper (LLFT_BLOCKING: a read, accept, poll...) lists itself, so
 * that the controller interrupts it with KICK_SIGNAL (installed without
 * SA_RESTART: the call fails with EINTR, the wrapper sees it was kicked
 * and starts the call again from its entry, where it waits, with errno as
 * the program had it before the call); one about to
 * make such a call does not make it (LLFT_BLOCKING sees the census).  A
 * thread in a lock or condition wait answers as one outside any call
 * (wrap_lock.c).  The census is complete when every thread has answered;
 * from then on no thread records until the primary is let go.
 *
 * CENSUS_SIGNAL is installed with SA_RESTART, but some calls fail with
 * EINTR whatever the flag says (poll, epoll_wait, select, nanosleep:
 * signal(7)): there the program sees the EINTR (recorded, and replayed
 * alike), as it would a signal of its own.  Both signals stay unblocked
 * whatever masks the program sets (sigprocmask, pthread_sigmask and the
 * masks of the wait calls go through llft_mask_without_ours). */
#include "shim.h"

#include <signal.h>
#include <string.h>
#include <sys/syscall.h>

static int installed;

static uint32_t census_under_way(void)
{
    return (uint32_t)(__atomic_load_n(&llft_ctl->q_census, __ATOMIC_ACQUIRE) >> 32);
}

/* Records an answer to census gen, if it is still the one under way. */
static void count_answer(uint32_t gen)
{
    uint64_t *word = &llft_ctl->q_census;
    uint64_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    while ((uint32_t)(v >> 32) == gen &&
           !__atomic_compare_exchange_n(word, &v, v + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
        ;
}

static void unlist(struct llft_thread *t)
{
    if (t->q_slot) {
        /* The slot may hold another thread by now: the controller empties
         * the list at each census. */
        int32_t me = (int32_t)syscall(SYS_gettid);
        __atomic_compare_exchange_n(&llft_ctl->q_blocked[t->q_slot - 1], &me, 0, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_RELAXED);
        t->q_slot = 0;
    }
}

/* Lists this thread among those the controller interrupts. */
static void list_blocked(struct llft_thread *t)
{
    int32_t me = (int32_t)syscall(SYS_gettid);
    for (uint32_t i = 0; i < LLFT_QUIESCE_KICKS; i++) {
        int32_t free_slot = 0;
        if (__atomic_compare_exchange_n(&llft_ctl->q_blocked[i], &free_slot, me, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
            t->q_slot = i + 1;
            return;
        }
    }
    /* No slot: a thread blocked here is not interrupted, and the census
     * ends without it (the controller gives the checkpoint up). */
}

static void on_census(int sig)
{
    int saved = errno;
    struct llft_thread *t = &llft_self;
    if (llft_ctl && __atomic_load_n(&llft_ctl->quiesce, __ATOMIC_ACQUIRE)) {
        if (t->state == TS_TRACKED && __atomic_load_n(&t->calls, __ATOMIC_RELAXED) &&
            !__atomic_load_n(&t->parked, __ATOMIC_RELAXED)) {
            uint32_t gen = census_under_way();
            if (!t->q_pending || t->q_gen != gen) {
                t->q_gen = gen;
                t->q_pending = 1;
                unlist(t);
                /* Only the real blocking call needs the kick: elsewhere the
                 * thread answers on leaving its call, and does not start
                 * such a call once counted (LLFT_BLOCKING). */
                if (__atomic_load_n(&t->blocking, __ATOMIC_RELAXED))
                    list_blocked(t);
            }
        } else {
            count_answer(census_under_way());
        }
    }
    errno = saved;
}

static void on_kick(int sig)
{
    struct llft_thread *t = &llft_self;
    if (__atomic_load_n(&t->blocking, __ATOMIC_RELAXED))
        __atomic_store_n(&t->kicked, 1, __ATOMIC_RELAXED);
}

void llft_quiesce_answer(struct llft_thread *t)
{
    t->q_pending = 0;
    unlist(t);
    count_answer(t->q_gen);
}

int llft_quiesce_enter(struct llft_thread *t)
{
    int saved = errno;
    llft_ctl_t *c = llft_ctl;
    do {
        __atomic_store_n(&t->parked, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        if (t->q_pending)
            llft_quiesce_answer(t);
        /* A futex shared with the controller, which lowers the flag, then
         * wakes it.  In slices all the same: a copy restored from the
         * image has its threads in this very wait, on another control
         * block, and each looks at the flag again within a slice. */
        while (__atomic_load_n(&c->quiesce, __ATOMIC_ACQUIRE))
            llft_futex_wait(&c->quiesce, 1, 50);
        __atomic_store_n(&t->parked, 0, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    } while (__atomic_load_n(&c->quiesce, __ATOMIC_ACQUIRE));
    errno = saved;
    int role = (int)__atomic_load_n(&c->role, __ATOMIC_RELAXED);
    return role >= LLFT_ROLE_COPY ? llft_demote() : role;
}

static void install(int sig, void (*handler)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigfillset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

void llft_quiesce_init(void)
{
    install(LLFT_CENSUS_SIGNAL, on_census, SA_RESTART);
    install(LLFT_KICK_SIGNAL, on_kick, 0);
    installed = 1;
}

/* Before an exec: the next image takes the signals once its library is
 * attached; until then they are ignored (their default ends a process). */
void llft_quiesce_exec(void)
{
    signal(LLFT_CENSUS_SIGNAL, SIG_IGN);
    signal(LLFT_KICK_SIGNAL, SIG_IGN);
}

/* ---- the program's signal masks ------------------------------------- */

const sigset_t *llft_mask_without_ours(const sigset_t *mask, sigset_t *buf)
{
    if (!mask || !installed || (!sigismember(mask, LLFT_CENSUS_SIGNAL) && !sigismember(mask, LLFT_KICK_SIGNAL)))
        return mask;
    *buf = *mask;
    sigdelset(buf, LLFT_CENSUS_SIGNAL);
    sigdelset(buf, LLFT_KICK_SIGNAL);
    return buf;
}

DEFINE_REAL(sigprocmask)
DEFINE_REAL(pthread_sigmask)

static const sigset_t *without_ours(int how, const sigset_t *set, sigset_t *buf)
{
    return how == SIG_UNBLOCK ? set : llft_mask_without_ours(set, buf);
}

EXPORT int sigprocmask(int how, const sigset_t *restrict set, sigset_t *restrict old)
{
    sigset_t buf;
    return REAL(sigprocmask)(how, without_ours(how, set, &buf), old);
}

EXPORT int pthread_sigmask(int how, const sigset_t *restrict set, sigset_t *restrict old)
{
    sigset_t buf;
    return REAL(pthread_sigmask)(how, without_ours(how, set, &buf), old);
}
