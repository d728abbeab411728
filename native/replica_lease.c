/* The replica's lease: what tells its forked processes, before anything
 * else can, that the replica's first process has died.
 *
 * When the first process of a primary dies (llft-kill, a crash), the
 * processes it forked run on until the controller fences them, and could
 * record what the death shows them: a pipe to it broken (EPIPE), its end
 * of a socketpair at EOF, a hang-up in poll.  The backups would replay
 * that, and a backup's twin of the dead process is alive: its children
 * would act on a death that does not happen there (fork_counter's child
 * exiting on EPIPE, its successor's parent then dying of SIGPIPE).
 *
 * So the first process holds a robust mutex in a page it shares with the
 * processes it forks.  The kernel marks a robust mutex's owner dead while
 * the owner's thread exits, in exit_mm, before exit_files closes the
 * process's descriptors; every observation of the death comes after
 * that.  A forked process checks the mark before each record it writes
 * (one load); once it is set, it records nothing more and waits to be
 * fenced (llft/determinizer/forked.py), so the records of the replica's
 * processes end at a cut the death has not touched.
 *
 * A first process that leaves on purpose (exit, _exit, exec) says so in
 * the page first: its children go on recording (a daemon's parent leaves
 * its child to serve).  The holding thread ending on its own lets go of
 * it; the process's next fork takes it again. */
#include "shim.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>

DEFINE_REAL(pthread_mutex_init)
DEFINE_REAL(pthread_mutex_trylock)
DEFINE_REAL(pthread_mutex_unlock)
DEFINE_REAL(pthread_mutex_consistent)

struct lease_page {
    pthread_mutex_t mutex; /* glibc keeps the futex word, with its owner-died mark, first */
    uint32_t leaving;      /* the holder's process exits or execs on purpose */
};

static struct lease_page *lease;         /* the page, in the first process and everything forked since */
static __thread int holds;               /* this thread holds the mutex */
struct lease_page *llft_lease_watched;   /* a forked process's view of its first process's lease */

int llft_lease_at(unsigned long addr)
{
    return lease && (unsigned long)lease == addr;
}

static int page_ready(void)
{
    if (lease)
        return 1;
    struct lease_page *page = llft_shared_page();
    if (!page)
        return 0;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    REAL(pthread_mutex_init)(&page->mutex, &a);
    pthread_mutexattr_destroy(&a);
    lease = page;
    return 1;
}

/* Before a fork of the replica's first process (its root stream): the
 * lease is held, by this thread unless another of the process's holds it. */
void llft_lease_hold(void)
{
    if (holds || llft_lease_watched || !llft_ctl || llft_ctl->stream_id != 0 || !page_ready())
        return;
    __atomic_store_n(&lease->leaving, 0, __ATOMIC_RELEASE);
    int r = REAL(pthread_mutex_trylock)(&lease->mutex);
    if (r == EOWNERDEAD) /* a thread of this process that held it ended without letting go */
        r = REAL(pthread_mutex_consistent)(&lease->mutex);
    holds = r == 0;
}

/* In a new process: a forked child watches the lease its parent's tree
 * shares; a daemon's parent that goes on as its child (daemon_fork.c) is
 * the first process still, and takes the lease at its next fork. */
void llft_lease_forked(int child)
{
    holds = 0;
    if (lease && child)
        llft_lease_watched = lease;
}

/* The process exits or execs on purpose. */
void llft_lease_leaving(int leaving)
{
    if (lease && !llft_lease_watched)
        __atomic_store_n(&lease->leaving, (uint32_t)leaving, __ATOMIC_RELEASE);
}

/* The calling thread ends: what it holds, it lets go of. */
void llft_lease_thread_ends(void)
{
    if (holds) {
        holds = 0;
        REAL(pthread_mutex_unlock)(&lease->mutex);
    }
}

void llft_lease_check_slow(void)
{
    struct lease_page *p = llft_lease_watched;
    uint32_t word = __atomic_load_n((uint32_t *)&p->mutex, __ATOMIC_ACQUIRE);
    if (!(word & FUTEX_OWNER_DIED) || __atomic_load_n(&p->leaving, __ATOMIC_ACQUIRE))
        return;
    llft_log("llft: process %d: its replica's first process died; it records nothing more and waits to be ended",
             (int)syscall(SYS_getpid));
    sigset_t all;
    sigfillset(&all);
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, sizeof(uint64_t));
    for (;;) {
        struct timespec s = {1, 0};
        syscall(SYS_nanosleep, &s, NULL);
    }
}
