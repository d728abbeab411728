/* Keeping the fd table true: every way a descriptor is made, copied or
 * closed.  A descriptor the replicas share by number (a pipe, an eventfd or
 * timerfd, a copy of a socket: epoll sets, poll arrays and the program's
 * own tables name them so) is made under the primary's number
 * (llft_new_fds): threads make them in any order, and the kernel gives the
 * lowest free number, so a backup's thread would get another one.  A copy
 * of a file stays each replica's own, as the file does. */
#include "fdtable.h"

#include <fcntl.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

DEFINE_REAL(close)
DEFINE_REAL(dup2)
DEFINE_REAL(dup3)
DEFINE_REAL(fcntl)
DEFINE_REAL(pipe2)
DEFINE_REAL(eventfd)
DEFINE_REAL(timerfd_create)

void llft_listener_closed(int fd); /* wrap_socket.c */

static inline int replicated(void)
{
    if (UNLIKELY(__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) != 2))
        llft_init_slow();
    return llft_ctl != NULL;
}

EXPORT int close(int fd)
{
    int kind = llft_fd_kind(fd);
    if (kind == FD_LISTEN || kind == FD_DGRAM)
        llft_listener_closed(fd);
    llft_fd_forget(fd);
    return REAL(close)(fd);
}

struct dup_args {
    int fd, cmd, min;
};

static int make_dup(void *c)
{
    const struct dup_args *a = c;
    return REAL(fcntl)(a->fd, a->cmd, a->min);
}

/* dup() and fcntl(F_DUPFD*): the lowest free number from min on. */
static int dup_common(int fd, int cmd, int min)
{
    struct dup_args a = {fd, cmd, min};
    int r;
    if (llft_fd_kind(fd) != FD_LOCAL) {
        r = llft_new_fd(make_dup, &a, cmd == F_DUPFD_CLOEXEC);
    } else {
        r = make_dup(&a);
        struct llft_thread *t;
        if (r > 2 && llft_mode(&t) == LLFT_ROLE_BACKUP)
            r = llft_out_of_the_way(r, cmd == F_DUPFD_CLOEXEC); /* as the file itself (wrap_random.c) */
    }
    if (r >= 0)
        llft_fd_copy(fd, r);
    return r;
}

EXPORT int dup(int fd) { return dup_common(fd, F_DUPFD, 0); }

EXPORT int dup2(int fd, int to)
{
    int r = REAL(dup2)(fd, to);
    if (r >= 0)
        llft_fd_copy(fd, r);
    return r;
}

EXPORT int dup3(int fd, int to, int flags)
{
    int r = REAL(dup3)(fd, to, flags);
    if (r >= 0)
        llft_fd_copy(fd, r);
    return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *); /* every fcntl argument fits in a pointer */
    va_end(ap);
    if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
        return dup_common(fd, cmd, (int)(intptr_t)arg);
    return REAL(fcntl)(fd, cmd, arg);
}

int llft_ipc_pair(int (*make)(void *ctx, int *fds), void *ctx, int cloexec, int fds[2])
{
    if (!replicated())
        return make(ctx, fds);
    int r = llft_new_fds(2, make, ctx, cloexec, fds);
    if (r == 0) {
        llft_fd_set(fds[0], FD_IPC);
        llft_fd_set(fds[1], FD_IPC);
    }
    return r;
}

static int make_pipe(void *flags, int *fds) { return REAL(pipe2)(fds, *(int *)flags); }

EXPORT int pipe(int fds[2])
{
    int flags = 0;
    return llft_ipc_pair(make_pipe, &flags, 0, fds);
}

EXPORT int pipe2(int fds[2], int flags) { return llft_ipc_pair(make_pipe, &flags, flags & O_CLOEXEC, fds); }

struct counter_args {
    int which, arg, flags; /* which: 0 eventfd (arg: initial value), 1 timerfd (arg: clock) */
};

static int make_counter(void *c)
{
    const struct counter_args *a = c;
    return a->which ? REAL(timerfd_create)(a->arg, a->flags) : REAL(eventfd)((unsigned)a->arg, a->flags);
}

static int counter_common(struct counter_args a)
{
    if (!replicated())
        return make_counter(&a);
    int fd = llft_new_fd(make_counter, &a, a.flags & O_CLOEXEC); /* EFD_ and TFD_CLOEXEC are O_CLOEXEC */
    if (fd >= 0)
        llft_fd_set(fd, FD_COUNTER);
    return fd;
}

EXPORT int eventfd(unsigned int initval, int flags)
{
    return counter_common((struct counter_args){0, (int)initval, flags});
}

EXPORT int timerfd_create(int clockid, int flags)
{
    return counter_common((struct counter_args){1, clockid, flags});
}
