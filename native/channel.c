/* The fds the controller hands a replica down: its private channel
 * (llft_abi.h), how the program's virtual sockets reach the controller
 * without a name anyone else on the host could connect to; and its stream
 * file, which the shim maps from the fd (LLFT_SHM=fd:N) rather than by
 * name, so that a program that drops its privileges (setpriv, setuid)
 * before an exec still attaches; and the preload library itself
 * (LD_PRELOAD=/proc/self/fd/N), which the next image's loader opens
 * through the fd, so that the uid the program drops to needs no right to
 * the directory llft is installed in.
 *
 * The shim moves them high, out of the numbers the program's own fds take,
 * and keeps them there whatever the program closes: daemons close every fd
 * they did not open, and these must outlive them, and an exec. */
#include "channel.h"

#include "atomics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
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
int llft_library_fd = -1;

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
int llft_above_the_floor(int fd)
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
    fd = llft_above_the_floor(fd);
    ctl->channel_fd = fd;
    __atomic_store_n(&llft_channel, fd, __ATOMIC_RELEASE);
}

/* Where the environment names a kept fd: the variable's text up to the
 * number, five characters wide, and what pads a short number (LLFT_SHM's
 * "fd:" and zeros; LD_PRELOAD's /proc/self/fd/ and slashes, since procfs
 * takes no leading zero).  A fixed width, so that rewriting it in place
 * never moves the environment (nor the stack layout, which is the same at
 * every replica). */
#define FD_DIGITS 5

struct env_fd {
    const char *prefix;
    char pad;
};

static const struct env_fd STREAM_VAR = {"LLFT_SHM=fd:", '0'};
static const struct env_fd LIBRARY_VAR = {"LD_PRELOAD=/proc/self/fd/", '/'};

/* The environment entry's number field for var, or NULL. */
static char *env_fd_field(const struct env_fd *var)
{
    extern char **environ;
    size_t n = strlen(var->prefix);
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, var->prefix, n) != 0 || strlen(*e + n) < FD_DIGITS)
            continue;
        char end = (*e)[n + FD_DIGITS];
        if (end == 0 || end == ' ' || end == ':')
            return *e + n;
    }
    return NULL;
}

static void note_fd(const struct env_fd *var, int fd)
{
    char *d = env_fd_field(var);
    if (!d)
        return;
    int i = FD_DIGITS - 1, v = fd;
    do {
        d[i--] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i >= 0);
    while (i >= 0)
        d[i--] = var->pad;
}

void llft_stream_keep(int fd)
{
    fd = llft_above_the_floor(fd);
    note_fd(&STREAM_VAR, fd);
    __atomic_store_n(&llft_stream_fd, fd, __ATOMIC_RELEASE);
}

char llft_library_path[256];

void llft_library_keep(void)
{
    const char *d = env_fd_field(&LIBRARY_VAR);
    if (!d)
        return;
    int fd = 0;
    for (int i = 0; i < FD_DIGITS; i++)
        if (d[i] >= '0' && d[i] <= '9')
            fd = fd * 10 + (d[i] - '0');
    if (syscall(SYS_fcntl, fd, F_GETFD) < 0)
        return;
    char link[40];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    long n = syscall(SYS_readlink, link, llft_library_path, sizeof llft_library_path - 1);
    llft_library_path[n > 0 ? n : 0] = 0;
    fd = llft_above_the_floor(fd);
    note_fd(&LIBRARY_VAR, fd);
    __atomic_store_n(&llft_library_fd, fd, __ATOMIC_RELEASE);
}

int llft_kept_move(int fd)
{
    int moved = (int)syscall(SYS_fcntl, fd, F_DUPFD, channel_floor());
    if (moved < 0)
        return -1;
    if (fd == __atomic_load_n(&llft_stream_fd, __ATOMIC_ACQUIRE)) {
        note_fd(&STREAM_VAR, moved);
        __atomic_store_n(&llft_stream_fd, moved, __ATOMIC_RELEASE);
    } else if (fd == __atomic_load_n(&llft_library_fd, __ATOMIC_ACQUIRE)) {
        note_fd(&LIBRARY_VAR, moved);
        __atomic_store_n(&llft_library_fd, moved, __ATOMIC_RELEASE);
    } else if (fd == __atomic_load_n(&llft_inbox, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&llft_inbox, moved, __ATOMIC_RELEASE);
        if (llft_ctl)
            llft_ctl->inbox_fd = moved;
    } else if (fd == __atomic_load_n(&llft_lease_fd, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&llft_lease_fd, moved, __ATOMIC_RELEASE);
        if (llft_ctl)
            llft_ctl->lease_fd = moved;
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
    /* The outcome is the result: errno stays as the program had it. */
    int saved = errno, err;
    for (;;) {
        /* Raw: a wrapped sendmsg would take this for the program's. */
        long r = syscall(SYS_sendmsg, ch, &msg, MSG_NOSIGNAL);
        if (r == (long)sizeof *m) {
            err = 0;
            break;
        }
        if (r >= 0) {
            err = EIO;
            break;
        }
        if (errno == EAGAIN) { /* the controller reads on */
            struct timespec ms = {0, 1000000};
            llft_nap(&ms);
        } else if (errno != EINTR) {
            err = errno;
            break;
        }
    }
    errno = saved;
    return err;
}
