/* Which of the process's threads sit in the kernel in a transfer on a
 * given fd: read from /proc/self/task/<tid>/syscall, which shows the
 * system call a blocked thread is in and its arguments ("running" for a
 * thread that is not blocked in one).  A primary's close uses it when a
 * transfer on the fd has not ended within its short wait (wrap_fd.c):
 * only a thread blocked in the kernel may be left behind, never one that
 * returned and has yet to take its turn.  System calls only: this is the
 * close's slow path. */
#include "shim.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* x86-64 system calls that move data through their first argument, an fd. */
static int transfer_call(long nr)
{
    switch (nr) {
    case SYS_read: case SYS_write: case SYS_readv: case SYS_writev: case SYS_pread64: case SYS_pwrite64:
    case SYS_preadv: case SYS_pwritev: case SYS_sendfile: case SYS_accept: case SYS_accept4:
    case SYS_sendto: case SYS_recvfrom: case SYS_sendmsg: case SYS_recvmsg: case SYS_sendmmsg:
    case SYS_recvmmsg:
        return 1;
    default:
        return 0;
    }
}

/* 1 if task tid is blocked in a transfer on fd. */
static int blocked_on(const char *tid, int fd)
{
    char path[300], text[256];
    snprintf(path, sizeof path, "/proc/self/task/%s/syscall", tid);
    if (llft_read_small_file(path, text, sizeof text) <= 0)
        return 0;
    char *end;
    long nr = strtol(text, &end, 10);
    if (end == text || !transfer_call(nr))
        return 0; /* "running", or another call */
    return strtoul(end, NULL, 16) == (unsigned long)fd;
}

int llft_threads_in_transfer(int fd)
{
    int dir = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return 0;
    char buf[4096];
    int blocked = 0;
    long n;
    while ((n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            if (d->d_name[0] >= '0' && d->d_name[0] <= '9')
                blocked += blocked_on(d->d_name, fd);
        }
    }
    syscall(SYS_close, dir);
    return blocked;
}
