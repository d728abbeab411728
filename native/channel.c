/* The fds the controller hands a replica down: its private channel
 * (llft_abi.h), how the program's virtual sockets reach the controller
 * without a name anyone else on the host could connect to; and its stream
 * file, which the shim maps from the fd (LLFT_SHM=fd:N) rather than by
 * name, so that a program that drops its privileges (setpriv, setuid)
 * before an exec still attaches.
 *
 * The shim moves both high, out of the numbers the program's own fds take,
 * and keeps them there whatever the program closes: daemons close every fd
 * they did not open, and both must outlive them, and an exec. */
#include "channel.h"

#include "atomics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int llft_channel = -1;
int llft_stream_fd = -1;

/* The lowest number the channel may move to: a few below the soft limit
 * (at most 1024, so that select()'s fd sets never meet it). */
static int channel_floor(void)
{
    struct rlimit lim;
    rlim_t top = getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : 1024;
    if (top > 1024)
        top = 1024;
    return top > 64 ? (int)top - 16 : 3;
}

static int is_socket(int fd)
{
    struct stat st;
    return fd >= 0 && syscall(SYS_fstat, fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* fd moved up to the channel floor (out of the numbers the program's fds
 * take), or left where it is if it is there already or cannot move. */
static int above_the_floor(int fd)
{
    int floor = channel_floor();
    if (fd >= floor)
        return fd;
    int moved = (int)syscall(SYS_fcntl, fd, F_DUPFD, floor);
    if (moved < 0)
        return fd;
    syscall(SYS_close, fd);
    return moved;
}

void llft_channel_attach(llft_ctl_t *ctl)
{
    int fd = ctl->channel_fd;
    if (fd <= 0) {
        const char *env = getenv("LLFT_CHANNEL");
        fd = env && *env ? atoi(env) : -1;
    }
    if (!is_socket(fd)) {
        llft_log("llft: no channel to the controller (LLFT_CHANNEL): the program's sockets cannot be served");
        return;
    }
    fd = above_the_floor(fd);
    ctl->channel_fd = fd;
    __atomic_store_n(&llft_channel, fd, __ATOMIC_RELEASE);
}

/* The stream's fd as LLFT_SHM says it, "fd:" and five digits: a fixed
 * length, so that rewriting it never moves the environment (nor the stack
 * layout, which is the same at every replica). */
#define STREAM_FD_DIGITS 5

static void note_stream_fd(int fd)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "LLFT_SHM=fd:", 12) != 0 || strlen(*e + 12) != STREAM_FD_DIGITS)
            continue;
        char *d = *e + 12;
        for (int i = STREAM_FD_DIGITS - 1, v = fd; i >= 0; i--, v /= 10)
            d[i] = (char)('0' + v % 10);
    }
}

void llft_stream_keep(int fd)
{
    fd = above_the_floor(fd);
    note_stream_fd(fd);
    __atomic_store_n(&llft_stream_fd, fd, __ATOMIC_RELEASE);
}

int llft_kept_move(int fd)
{
    int moved = (int)syscall(SYS_fcntl, fd, F_DUPFD, channel_floor());
    if (moved < 0)
        return -1;
    if (fd == __atomic_load_n(&llft_stream_fd, __ATOMIC_ACQUIRE)) {
        note_stream_fd(moved);
        __atomic_store_n(&llft_stream_fd, moved, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&llft_channel, moved, __ATOMIC_RELEASE);
        if (llft_ctl)
            llft_ctl->channel_fd = moved;
    }
    syscall(SYS_close, fd);
    return 0;
}

int llft_channel_send(const llft_channel_msg_t *m, int fd)
{
    int ch = __atomic_load_n(&llft_channel, __ATOMIC_ACQUIRE);
    if (ch < 0)
        return ENOTCONN;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } c;
    memset(&c, 0, sizeof c);
    struct iovec v = {(void *)m, sizeof *m};
    struct msghdr msg = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof c.buf};
    struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    for (;;) {
        /* Raw: a wrapped sendmsg would take this for the program's. */
        long r = syscall(SYS_sendmsg, ch, &msg, MSG_NOSIGNAL);
        if (r == (long)sizeof *m)
            return 0;
        if (r >= 0)
            return EIO;
        if (errno == EAGAIN) { /* the controller reads on */
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        } else if (errno != EINTR) {
            return errno;
        }
    }
}
