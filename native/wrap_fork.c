/* fork and vfork.  Under --fork replicate a forked child is replicated
 * with its parent, on a record stream of its own (fork_stream.c).
 * Otherwise a forked child is not a replica: it runs unrecorded.
 * It may run what it execs, or work on its own files and pipes (what the
 * program reads back from it is recorded whole: FD_CHILD_IPC); a client
 * connection, listener or UDP socket it inherited is the replicas' alone,
 * and a child that uses one is refused (llft_forked_use) rather than serve
 * a client unreplicated (nginx's workers would read llft's connection
 * headers as requests).  The refusal names the memory the child shares
 * with the replica, if any (apache's scoreboard): what one process writes
 * there the other reads, and nothing records it.  A daemon's fork, whose
 * parent exits at once, is followed instead (daemon_fork.c). */
#include "fdtable.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

llft_ctl_t *llft_forked_from;

/* In a child: the first memory its parent shared with it, as a phrase. */
static char shared_memory[128];

/* Whether a /proc/self/maps line maps memory processes share without a
 * file of their own: MAP_SHARED|MAP_ANONYMOUS (/dev/zero), System V
 * segments, memfds. */
static const char *shared_kind(const char *perms, const char *path)
{
    if (perms[3] != 's')
        return NULL;
    if (strncmp(path, "/dev/zero", 9) == 0)
        return "an anonymous shared mapping";
    if (strncmp(path, "/SYSV", 5) == 0)
        return "a System V shared memory segment";
    if (strncmp(path, "/memfd:", 7) == 0)
        return "a shared memfd mapping";
    return NULL;
}

void llft_each_mapping(int (*visit)(const char *line, void *arg), void *arg)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[8192];
    size_t have = 0;
    for (;;) {
        long n = syscall(SYS_read, fd, buf + have, sizeof buf - 1 - have);
        if (n <= 0 && have == 0)
            break;
        have += n > 0 ? (size_t)n : 0;
        buf[have] = 0;
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = 0;
            if (visit(line, arg)) {
                syscall(SYS_close, fd);
                return;
            }
            line = nl + 1;
        }
        have = (size_t)(buf + have - line);
        memmove(buf, line, have);
        if (n <= 0 || have == sizeof buf - 1)
            break;
    }
    syscall(SYS_close, fd);
}

/* Parent, before a fork: notes the first such mapping. */
static int note_if_shared(const char *line, void *out)
{
    unsigned long lo;
    char perms[8] = "", path[64] = "";
    if (sscanf(line, "%lx-%*x %7s %*s %*s %*s %63s", &lo, perms, path) < 2 || llft_daemon_gate_at(lo) ||
        llft_fork_gates_at(lo) || llft_lease_at(lo) || lo == (unsigned long)llft_ctl) /* (the shim's own, and the stream's) */
        return 0;
    const char *kind = shared_kind(perms, path);
    if (kind)
        snprintf(out, sizeof shared_memory, "%s at %#lx", kind, lo);
    return kind != NULL;
}

const char *llft_shared_memory(void)
{
    shared_memory[0] = 0;
    llft_each_mapping(note_if_shared, shared_memory);
    return shared_memory;
}

DEFINE_REAL(fork)
EXPORT pid_t fork(void)
{
    if (llft_ctl && llft_ctl->fork_mode == LLFT_FORKS_REPLICATED && llft_self.state == TS_TRACKED &&
        !llft_self.depth)
        return llft_fork_replicated(REAL(fork));
    if (llft_ctl)
        llft_shared_memory();
    /* The child leaves the record stream there (llft_forked_from). */
    int how;
    pid_t p = llft_daemon_fork(REAL(fork), &how);
    if (p > 0 && llft_ctl && how == LLFT_FORK_PLAIN)
        llft_fds_shared_with_child(); /* a held child's parent does so when it lets it go */
    return how == LLFT_FORK_RESUMED ? 0 : p;
}

/* vfork's child borrows its parent's memory until it execs: whatever it
 * called through the shim would be recorded (or replayed) as the parent's
 * own calls, as dash's child recorded its exec of /bin/true in its
 * parent's stream and a backup's consumed its parent's record.  A fork is
 * what POSIX lets vfork be: the child then runs on its own (unrecorded,
 * or on a stream of its own: fork_stream.c). */
EXPORT pid_t vfork(void)
{
    return fork();
}

void llft_forked_use(int fd, const char *what)
{
    /* A child its parent waited for, before it had any thread: a daemon
     * whose parent waits for the child's word before it exits (lighttpd,
     * dnsmasq), which the foreground mode avoids. */
    const char *how = llft_fork_waited_for
                          ? "; it is the background copy of a daemon whose parent waited for it: run the server in "
                            "the foreground (lighttpd -D, dnsmasq -d)"
                          : "; run the server in its single-process mode, or without the options that leave forked "
                            "processes unrecorded (docs/forked-processes.md)";
    llft_refuse("a process the program forked (pid %d) %s (fd %d)%s%s: under --fork unrecorded llft "
                "replicates a program's threads, not the processes it forks to serve clients%s",
                (int)syscall(SYS_getpid), what, fd, shared_memory[0] ? ", sharing with it " : "", shared_memory, how);
}
