/* A daemon's fork: the process forks, the parent exits at once, and the
 * child goes on as the server (redis's daemonize, memcached -d, nginx's
 * `daemon on`: fork; the parent calls exit or _exit; the child setsid()s).
 * The replica is the parent, whose record stream ends with its exit, and a
 * forked child runs unrecorded (wrap_fork.c) or on a stream of its own
 * (fork_stream.c).  So the replica follows the program into its child by
 * not leaving: it goes on as the child itself.
 *
 * The fork is real, but the child waits, before it returns to the
 * program, until the parent's next move:
 *
 *   - the parent calls exit or _exit, with no call that waits on the way:
 *     the child is killed, and the parent resumes at the fork's return
 *     with 0, on the stack as it was then (a copy taken at the fork), as
 *     the child would have.  Same pid, same threads, same record stream:
 *     at every replica alike, since the parent's path is replayed.
 *     setsid() then succeeds without leaving the replica's session, which
 *     llft's process-group signals rely on.
 *   - the parent makes a call that may wait for another process or for
 *     input (a switch point, shim.h: a wait for the child, a read of a
 *     pipe from it, a poll), forks again, starts a thread or execs: the
 *     child is let go, an ordinary child as wrap_fork.c describes, before
 *     that call runs.  Other calls on the way to the exit (nginx's parent
 *     writes the pid file) are recorded and replayed as any are.
 *
 * Only a process that has started no thread does so: a child would have
 * none of its parent's other threads.  And only the replica's first
 * process, whose exit no process of the program sees: a process it forked
 * (on a stream of its own, fork_stream.c) that forks and exits is waited
 * for by its parent, which must see that exit, at once and with its
 * status (a server starting a detached job: fork, setsid, fork, exit);
 * the process it forked goes on on a stream of its own.  What the
 * parent's path changed outside its stack (rarely anything before an
 * exit) stays changed. */
#undef _FORTIFY_SOURCE /* the resumption jumps from another stack to an older frame */
#include "shim.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define ALT_STACK_BYTES (64 * 1024)
#define CHILD_WAIT_MS 5000 /* a child still held then goes on by itself */

enum { HELD = 0, LET_GO = 1, WENT_ALONE = 2, LET_GO_WAITING = 3, DOOMED = 4 };

int llft_fork_held;       /* a child waits for this process's next move */
int llft_fork_waited_for; /* this process was such a child, let go as its parent waited (read, poll) */

static struct {
    int continued;        /* this process went on as its child */
    pid_t child;
    sigjmp_buf at_fork;
    char *stack_lo;       /* the stack [stack_lo, stack_lo + stack_len) as it was at the fork */
    size_t stack_len;
    char *stack_copy;
    size_t copy_cap;
    char *alt_stack;
} df;

/* Shared with the waiting children: each one's fate, in a word of its
 * own (gate), so that a child let go still reads LET_GO when its parent
 * has already forked and held the next one. */
#define GATE_WORDS 1024
static uint32_t *gates;
static uint32_t *gate;
static uint32_t gates_used;

int llft_daemon_gate_at(unsigned long lo)
{
    return gates && (unsigned long)gates == lo;
}

struct mapping_of {
    unsigned long addr;
    char *end;
};

static int note_end_if_holds(const char *line, void *arg)
{
    struct mapping_of *m = arg;
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2 || lo > m->addr || m->addr >= hi)
        return 0;
    m->end = (char *)hi;
    return 1;
}

/* The end of the mapping that holds addr (the stack's top), or NULL. */
static char *mapping_end(const void *addr)
{
    struct mapping_of m = {(unsigned long)addr, NULL};
    llft_each_mapping(note_end_if_holds, &m);
    return m.end;
}

static void *map(size_t len, int shared)
{
    void *p = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
                              (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
    return (long)p < 0 && (long)p > -4096 ? NULL : p;
}

/* Copies the stack from below the caller's frame to its top; 0 on success. */
static __attribute__((noinline)) int copy_stack(void)
{
    char here;
    char *lo = (char *)(((unsigned long)&here - 512) & ~15UL);
    char *hi = mapping_end(&here);
    if (!hi)
        return -1;
    size_t len = (size_t)(hi - lo);
    if (len > df.copy_cap) {
        if (df.stack_copy)
            syscall(SYS_munmap, df.stack_copy, df.copy_cap);
        df.copy_cap = (len + 0xffff) & ~0xffffUL;
        df.stack_copy = map(df.copy_cap, 0);
        if (!df.stack_copy) {
            df.copy_cap = 0;
            return -1;
        }
    }
    memcpy(df.stack_copy, lo, len);
    df.stack_lo = lo;
    df.stack_len = len;
    return 0;
}

static int prepare(void)
{
    if (!gates && !(gates = map(GATE_WORDS * sizeof *gates, 1)))
        return -1;
    gate = &gates[gates_used++ % GATE_WORDS];
    if (!df.alt_stack && !(df.alt_stack = map(ALT_STACK_BYTES, 0)))
        return -1;
    return copy_stack();
}

/* In the child: waits for its fate; returns once it is to go on. */
static void child_waits(void)
{
    uint64_t end = llft_now_ms() + CHILD_WAIT_MS;
    uint32_t g;
    while ((g = __atomic_load_n(gate, __ATOMIC_ACQUIRE)) == HELD || g == DOOMED) {
        if (g == DOOMED) { /* the parent goes on as this child: SIGKILL is on its way */
            llft_futex_wait(gate, DOOMED, 100);
            continue;
        }
        if (llft_now_ms() >= end) {
            uint32_t held = HELD;
            if (__atomic_compare_exchange_n(gate, &held, WENT_ALONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return;
            continue;
        }
        llft_futex_wait(gate, HELD, 100);
    }
}

/* The pid that forks, while it does. */
static pid_t forking_pid;

/* Forks with the library's state at LLFT_STATE_FORKING, so that every call
 * the shim sees meanwhile asks whether it runs in the child: the program's
 * pthread_atfork handlers (jemalloc's relock and reset every arena lock in
 * the child) run there before fork() returns, and must not record into
 * the parent's stream. */
static pid_t fork_quietly(pid_t (*real_fork)(void))
{
    forking_pid = (pid_t)syscall(SYS_getpid);
    __atomic_store_n(&llft_state, LLFT_STATE_FORKING, __ATOMIC_RELEASE);
    pid_t p = real_fork();
    if (p == 0)
        llft_fork_child_check();
    __atomic_store_n(&llft_state, 2, __ATOMIC_RELEASE);
    return p;
}

void llft_fork_child_check(void)
{
    if (llft_ctl && (pid_t)syscall(SYS_getpid) != forking_pid) {
        llft_forked_from = llft_ctl;
        llft_ctl = NULL;
    }
}

pid_t llft_daemon_fork(pid_t (*real_fork)(void), int *how)
{
    *how = LLFT_FORK_PLAIN;
    if (llft_fork_held)
        llft_daemon_fork_settle(0);
    if (!llft_ctl)
        return real_fork();
    if (__atomic_load_n(&llft_ctl->threads, __ATOMIC_RELAXED) != 0 || llft_ctl->stream_id != 0)
        return fork_quietly(real_fork);
    /* The signal mask too: a parent that exits from a signal handler
     * resumes with the mask it forked with. */
    if (sigsetjmp(df.at_fork, 1)) {
        /* Resumed: the parent's path exited; this process is the child. */
        df.continued = 1;
        *how = LLFT_FORK_RESUMED;
        return 0;
    }
    if (prepare() != 0)
        return fork_quietly(real_fork);
    __atomic_store_n(gate, HELD, __ATOMIC_RELEASE);
    pid_t p = fork_quietly(real_fork);
    if (p == 0) {
        child_waits();
        llft_fork_waited_for = __atomic_load_n(gate, __ATOMIC_ACQUIRE) == LET_GO_WAITING;
        return 0;
    }
    if (p > 0) {
        llft_fork_held = 1;
        df.child = p;
        *how = LLFT_FORK_HELD;
    }
    return p;
}

void llft_fds_shared_with_child(void); /* fdtable.c */

void llft_daemon_fork_settle(int waiting)
{
    if (!llft_fork_held)
        return;
    llft_fork_held = 0;
    uint32_t held = HELD; /* (a child that went on alone keeps its word) */
    __atomic_compare_exchange_n(gate, &held, waiting ? LET_GO_WAITING : LET_GO, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    llft_futex_wake(gate);
    llft_fds_shared_with_child();
}

static __attribute__((noreturn, noinline)) void restore_and_resume(void)
{
    memcpy(df.stack_lo, df.stack_copy, df.stack_len);
    siglongjmp(df.at_fork, 1);
}

void llft_daemon_exit(void)
{
    if (!llft_fork_held)
        return;
    uint32_t held = HELD;
    if (!__atomic_compare_exchange_n(gate, &held, DOOMED, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        llft_daemon_fork_settle(0); /* it went on alone: this exit is the parent's own */
        return;
    }
    llft_fork_held = 0;
    /* The child's death is no news to the program: its SIGCHLD is taken
     * here, with the signal blocked. */
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, &chld, &old, sizeof(uint64_t));
    syscall(SYS_kill, df.child, SIGKILL);
    syscall(SYS_wait4, df.child, NULL, __WALL, NULL);
    struct timespec none = {0, 0};
    syscall(SYS_rt_sigtimedwait, &chld, NULL, &none, sizeof(uint64_t));
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof(uint64_t));
    char *top = df.alt_stack + ALT_STACK_BYTES - 64;
#if defined(__x86_64__)
    __asm__ volatile("mov %0, %%rsp\n\tcall *%1\n" : : "r"(top), "r"(restore_and_resume) : "memory");
#elif defined(__aarch64__)
    __asm__ volatile("mov sp, %0\n\tblr %1\n" : : "r"(top), "r"(restore_and_resume) : "memory", "x30");
#else
#error "daemon_fork.c: no stack switch for this architecture"
#endif
    __builtin_unreachable();
}

/* setsid() after the replica went on as its child: the program's new
 * session is the one it has (the replica stays in the process group llft
 * signals); it gets its own pid as the session's id, as a child would. */
DEFINE_REAL(setsid)
EXPORT pid_t setsid(void)
{
    if (df.continued) {
        df.continued = 0;
        return getpid();
    }
    return REAL(setsid)();
}

/* The waits the parent's path may make for its child (a prefork
 * master's) let a held child go first: the wait family (wrap_wait.c),
 * sigsuspend and pause (wrap_signal.c). */

/* glibc's daemon(3) forks inside libc, past the fork wrapper: it is done
 * here as glibc does it, through that wrapper, so that it is followed. */
EXPORT int daemon(int nochdir, int noclose)
{
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p > 0)
        _exit(0);
    if (setsid() < 0)
        return -1;
    if (!nochdir && chdir("/") != 0)
        return -1;
    if (!noclose) {
        int fd = open("/dev/null", O_RDWR);
        if (fd < 0)
            return -1;
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2)
            close(fd);
    }
    return 0;
}
