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
 * its child to serve).  So does the controller, in each process's control
 * block, when it stops the group: a start script dying of its SIGTERM
 * leaves its server to run its handler and end by itself.  The holding thread ending on its own lets go of
 * it; the process's next fork takes it again.
 *
 * The page is a memfd kept open (channel.h) at the number its stream's
 * control block names: a process that execs maps it again in its next
 * image (llft_lease_attach), a forked child watching it still, the first
 * process to hold it at its next fork.  A start script's server, forked
 * and exec'd, would otherwise record its pipe to the dead script broken. */
#include "channel.h"

#include <fcntl.h>
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
int llft_lease_fd = -1;
static __thread int holds;               /* this thread holds the mutex */
struct lease_page *llft_lease_watched;   /* a forked process's view of its first process's lease */

int llft_lease_at(unsigned long addr)
{
    return (lease && (unsigned long)lease == addr) || (llft_lease_watched && (unsigned long)llft_lease_watched == addr);
}

static struct lease_page *map_page(int fd)
{
    void *p = (void *)syscall(SYS_mmap, NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return (long)p < 0 && (long)p > -4096 ? NULL : p;
}

static int page_ready(void)
{
    if (lease)
        return 1;
    int fd = (int)syscall(SYS_memfd_create, "llft-lease", 0);
    if (fd < 0)
        return 0;
    struct lease_page *page = syscall(SYS_ftruncate, fd, 4096) == 0 ? map_page(fd) : NULL;
    if (!page) {
        syscall(SYS_close, fd);
        return 0;
    }
    fd = llft_above_the_floor(fd);
    __atomic_store_n(&llft_lease_fd, fd, __ATOMIC_RELEASE);
    llft_ctl->lease_fd = fd;
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
    int r = REAL(pthread_mutex_trylock)(&lease->mutex);
    /* A thread of this process that held it ended without letting go, or
     * this process's previous image did (an exec marks it dead too). */
    if (r == EOWNERDEAD)
        r = REAL(pthread_mutex_consistent)(&lease->mutex);
    holds = r == 0;
    /* Only now: while the owner-died mark is on, a child that saw it with
     * leaving off would take the holder for dead. */
    __atomic_store_n(&lease->leaving, 0, __ATOMIC_RELEASE);
}

/* After an exec: the lease the process's stream names, mapped again; a
 * forked process watches it, the first process holds it at its next
 * fork.  Before the process's first recorded call (attach). */
void llft_lease_attach(llft_ctl_t *ctl)
{
    int fd = ctl->lease_fd;
    if (fd <= 0 || syscall(SYS_fcntl, fd, F_GETFD) < 0)
        return;
    struct lease_page *page = map_page(fd);
    if (!page)
        return;
    __atomic_store_n(&llft_lease_fd, fd, __ATOMIC_RELEASE);
    if (ctl->stream_id != 0)
        llft_lease_watched = page;
    else
        lease = page;
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
    if (!(word & FUTEX_OWNER_DIED) || __atomic_load_n(&p->leaving, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&llft_ctl->stopping, __ATOMIC_ACQUIRE))
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
