/* Every way the program opens a file by path: open, openat, their 64-bit
 * and fortified variants, and fopen.  Each takes the number the kernel
 * gave the primary (llft_open_numbered): programs size things by fd
 * numbers (lighttpd its connection budget by the number open("/dev/null")
 * returns) and name files by them in poll sets.  A random device or a
 * /proc file is marked for recorded reads (wrap_random.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

DEFINE_REAL(openat64)
DEFINE_REAL(close)

struct open_args {
    int dirfd;
    const char *path;
    int flags;
    mode_t mode;
};

/* Every variant is openat64 underneath: open(p) is openat(AT_FDCWD, p),
 * and on x86-64 the 64-bit names are the same calls. */
static int make_open(void *ctx)
{
    const struct open_args *a = ctx;
    return REAL(openat64)(a->dirfd, a->path, a->flags, a->mode);
}

static int open_file(int dirfd, const char *path, int flags, mode_t mode)
{
    struct open_args a = {dirfd, path, flags, mode};
    int fd = llft_open_numbered(make_open, &a, flags & O_CLOEXEC);
    if (fd >= 0) {
        int kind = llft_recorded_path(path);
        struct llft_thread *t;
        if (kind != FD_LOCAL && llft_mode(&t) != LLFT_ROLE_OFF)
            llft_fd_set(fd, kind);
    }
    return fd;
}

static inline mode_t open_mode(int flags, va_list ap)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
}

#define OPEN_WRAPPER(name)                                                          \
    EXPORT int name(const char *path, int flags, ...)                               \
    {                                                                               \
        va_list ap;                                                                 \
        va_start(ap, flags);                                                        \
        mode_t mode = open_mode(flags, ap);                                         \
        va_end(ap);                                                                 \
        return open_file(AT_FDCWD, path, flags, mode);                              \
    }
#define OPENAT_WRAPPER(name)                                                        \
    EXPORT int name(int dirfd, const char *path, int flags, ...)                    \
    {                                                                               \
        va_list ap;                                                                 \
        va_start(ap, flags);                                                        \
        mode_t mode = open_mode(flags, ap);                                         \
        va_end(ap);                                                                 \
        return open_file(dirfd, path, flags, mode);                                 \
    }

OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

/* Fortified variants (-D_FORTIFY_SOURCE) of open without a mode. */
EXPORT int __open_2(const char *path, int flags) { return open_file(AT_FDCWD, path, flags, 0); }
EXPORT int __open64_2(const char *path, int flags) { return open_file(AT_FDCWD, path, flags, 0); }
EXPORT int __openat_2(int d, const char *path, int flags) { return open_file(d, path, flags, 0); }
EXPORT int __openat64_2(int d, const char *path, int flags) { return open_file(d, path, flags, 0); }

/* fopen's open flags for mode ("r", "w+", "ae", "wx", ...), or -1. */
static int fopen_flags(const char *mode)
{
    int flags;
    switch (mode[0]) {
    case 'r': flags = O_RDONLY; break;
    case 'w': flags = O_WRONLY | O_CREAT | O_TRUNC; break;
    case 'a': flags = O_WRONLY | O_CREAT | O_APPEND; break;
    default: return -1;
    }
    for (const char *c = mode + 1; *c && *c != ','; c++) {
        if (*c == '+')
            flags = (flags & ~O_WRONLY) | O_RDWR;
        else if (*c == 'x')
            flags |= O_EXCL;
        else if (*c == 'e')
            flags |= O_CLOEXEC;
    }
    return flags;
}

/* A file opened through stdio is an open() (numbered as the primary's)
 * that fdopen wraps in a FILE. */
static FILE *open_stream(const char *path, const char *mode)
{
    if (llft_recorded_path(path) != FD_LOCAL) {
        struct llft_thread *t;
        if (llft_mode(&t) != LLFT_ROLE_OFF)
            return llft_recorded_file(path, mode);
    }
    int flags = fopen_flags(mode);
    if (flags < 0) {
        errno = EINVAL;
        return NULL;
    }
    int fd = open_file(AT_FDCWD, path, flags, 0666);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int err = errno;
        close(fd);
        errno = err;
    }
    return f;
}

EXPORT FILE *fopen(const char *restrict path, const char *restrict mode) { return open_stream(path, mode); }
EXPORT FILE *fopen64(const char *restrict path, const char *restrict mode) { return open_stream(path, mode); }
