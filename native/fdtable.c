/* The fd table, and the backup's exact-count transfers. */
#include "fdtable.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

struct llft_fd llft_fds[LLFT_FD_MAX];

DEFINE_REAL(read)
DEFINE_REAL(write)
DEFINE_REAL(recv)
DEFINE_REAL(poll)

void llft_fd_set(int fd, int kind)
{
    if ((unsigned)fd < LLFT_FD_MAX) {
        memset(&llft_fds[fd], 0, sizeof llft_fds[fd]);
        llft_fds[fd].kind = (uint8_t)kind;
    }
}

void llft_fd_forget(int fd)
{
    if ((unsigned)fd < LLFT_FD_MAX && llft_fds[fd].kind != FD_LOCAL)
        memset(&llft_fds[fd], 0, sizeof llft_fds[fd]);
}

void llft_fd_copy(int from, int to)
{
    if ((unsigned)from < LLFT_FD_MAX && (unsigned)to < LLFT_FD_MAX && from != to)
        llft_fds[to] = llft_fds[from];
}

static int wait_fd(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    int r = REAL(poll)(&p, 1, 100);
    return r < 0 && errno != EINTR ? errno : 0;
}

int llft_read_exact(int fd, void *buf, size_t n, int peek)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r;
        if (peek) {
            int avail = 0;
            if (ioctl(fd, FIONREAD, &avail) == 0 && (size_t)avail >= n) {
                r = REAL(recv)(fd, buf, n, MSG_PEEK | MSG_DONTWAIT);
                return r == (ssize_t)n ? 0 : EIO;
            }
            r = -1;
            errno = EAGAIN;
        } else {
            r = REAL(read)(fd, (char *)buf + got, n - got);
        }
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            return ECONNRESET; /* the data the primary read never came */
        } else if (errno == EAGAIN || errno == EINTR) {
            int e = wait_fd(fd, POLLIN);
            if (e)
                return e;
        } else {
            return errno;
        }
    }
    return 0;
}

void llft_drain_counter(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t v;
    if (REAL(poll)(&p, 1, 0) == 1 && (p.revents & POLLIN))
        (void)REAL(read)(fd, &v, sizeof v);
}

int llft_write_exact(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = REAL(write)(fd, (const char *)buf + put, n - put);
        if (r > 0) {
            put += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            int e = wait_fd(fd, POLLOUT);
            if (e)
                return e;
        } else {
            return r < 0 ? errno : EIO;
        }
    }
    return 0;
}
