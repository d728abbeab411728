/* Keeping the fd table true: every way a descriptor is made, copied or
 * closed.  None of these is recorded: at a replaying backup they happen in
 * the same order as at the primary, so the kernel hands out the same
 * numbers. */
#include "fdtable.h"

#include <fcntl.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

DEFINE_REAL(close)
DEFINE_REAL(dup)
DEFINE_REAL(dup2)
DEFINE_REAL(dup3)
DEFINE_REAL(fcntl)
DEFINE_REAL(pipe)
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

EXPORT int dup(int fd)
{
    int r = REAL(dup)(fd);
    if (r >= 0)
        llft_fd_copy(fd, r);
    return r;
}

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
    int r = REAL(fcntl)(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
        llft_fd_copy(fd, r);
    return r;
}

static int pipe_common(int fds[2], int r)
{
    if (r == 0 && replicated()) {
        llft_fd_set(fds[0], FD_IPC);
        llft_fd_set(fds[1], FD_IPC);
    }
    return r;
}

EXPORT int pipe(int fds[2]) { return pipe_common(fds, REAL(pipe)(fds)); }
EXPORT int pipe2(int fds[2], int flags) { return pipe_common(fds, REAL(pipe2)(fds, flags)); }

EXPORT int eventfd(unsigned int initval, int flags)
{
    int fd = REAL(eventfd)(initval, flags);
    if (fd >= 0 && replicated())
        llft_fd_set(fd, FD_COUNTER);
    return fd;
}

EXPORT int timerfd_create(int clockid, int flags)
{
    int fd = REAL(timerfd_create)(clockid, flags);
    if (fd >= 0 && replicated())
        llft_fd_set(fd, FD_COUNTER);
    return fd;
}
