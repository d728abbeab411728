/* Inputs only this process sees: randomness (getrandom, getentropy,
 * arc4random*, /dev/urandom and /dev/random) and files under /proc (its
 * own statistics: redis reads its RSS there), whether read through an fd
 * (open + read) or stdio (fopen + fread, whose internal read never reaches
 * a read() wrapper: such a FILE is served by a cookie that records each
 * read).  So are the bytes on a pipe from a process the program forked,
 * which runs unrecorded.  The primary records the bytes; backups return
 * them.  The
 * opens that mark such fds and FILEs are in wrap_open.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fdtable.h"

#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

DEFINE_REAL(getrandom)
DEFINE_REAL(getentropy)
DEFINE_REAL(arc4random)
DEFINE_REAL(arc4random_buf)
DEFINE_REAL(arc4random_uniform)
DEFINE_REAL(read)
DEFINE_REAL(poll)
DEFINE_REAL(open)
DEFINE_REAL(close)

#define MAX_RANDOM_READ ((LLFT_MAX_GROUP - 1) * LLFT_DATA_BYTES) /* longer reads return short */

static int random_path(const char *p)
{
    return p && (strcmp(p, "/dev/urandom") == 0 || strcmp(p, "/dev/random") == 0);
}

static int proc_path(const char *p)
{
    return p && strncmp(p, "/proc/", 6) == 0;
}

/* The fd kind a path gets when opened, or FD_LOCAL. */
int llft_recorded_path(const char *p)
{
    return random_path(p) ? FD_RANDOM : proc_path(p) ? FD_PROCFS : FD_LOCAL;
}

/* Backup: the primary's bytes for a recorded random read, in *res; or
 * LLFT_PROMOTED if this replica has just taken over. */
static int replay_bytes(struct llft_thread *t, uint16_t op, uint64_t obj, void *buf, uint64_t cap, int64_t *res)
{
    llft_rec_t e;
    if (llft_replay_next(t, op, &e))
        return LLFT_PROMOTED;
    if (UNLIKELY(e.obj != obj || (uint64_t)e.val > cap))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "asked for %llu random bytes (kind %llu)",
                     (unsigned long long)cap, (unsigned long long)obj);
    if (e.val > 0)
        llft_replay_data(t, buf, (uint64_t)e.val);
    if (e.err)
        errno = e.err;
    *res = e.ret;
    return 0;
}

/* A read-like random source: primary records what fill() produced. */

int64_t llft_recorded_call(uint16_t op, uint64_t obj, void *buf, uint64_t n, fill_fn fill)
{
    /* A read of a child's pipe may block: a census waits for it to end. */
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        int64_t res;
        if (!replay_bytes(t, op, obj, buf, n, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        if (n > MAX_RANDOM_READ)
            n = MAX_RANDOM_READ;
        int64_t r = fill(buf, n, obj);
        int err = r < 0 ? errno : 0;
        llft_record_data(t, op, obj, 0, r, err, buf, r > 0 ? (uint64_t)r : 0);
        if (err)
            errno = err;
        return r;
    }
    return fill(buf, n, obj);
}

static int64_t fill_getrandom(void *buf, uint64_t n, uint64_t flags)
{
    return REAL(getrandom)(buf, n, (unsigned)flags);
}

static int64_t fill_fd(void *buf, uint64_t n, uint64_t fd) { return REAL(read)((int)fd, buf, n); }

/* A cookie reads its own fd; random_call's obj is 0 for stdio reads, so the
 * fd travels in a thread-local. */
static __thread int cookie_fd TLS_IE;
static int64_t fill_cookie(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    return REAL(read)(cookie_fd, buf, n);
}
static fill_fn fill_fd_cookie(intptr_t fd)
{
    cookie_fd = (int)fd;
    return fill_cookie;
}

static int64_t fill_urandom(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    return REAL(getrandom)(buf, n, 0);
}

static int64_t fill_getentropy(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    return REAL(getentropy)(buf, n) == 0 ? (int64_t)n : -1;
}

static int64_t fill_arc4(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    REAL(arc4random_buf)(buf, n);
    return (int64_t)n;
}

EXPORT ssize_t getrandom(void *buf, size_t n, unsigned flags)
{
    return llft_recorded_call(LLFT_OP_GETRANDOM, flags, buf, n, fill_getrandom);
}

EXPORT int getentropy(void *buf, size_t n)
{
    if (n > 256) {
        errno = EIO;
        return -1;
    }
    return llft_recorded_call(LLFT_OP_GETENTROPY, 0, buf, n, fill_getentropy) < 0 ? -1 : 0;
}

EXPORT void arc4random_buf(void *buf, size_t n)
{
    char *p = buf;
    while (n) { /* one record per chunk: a record holds at most MAX_RANDOM_READ bytes */
        size_t k = n < MAX_RANDOM_READ ? n : MAX_RANDOM_READ;
        llft_recorded_call(LLFT_OP_ARC4RANDOM, 0, p, k, fill_arc4);
        p += k;
        n -= k;
    }
}

EXPORT uint32_t arc4random(void)
{
    uint32_t v;
    arc4random_buf(&v, sizeof v);
    return v;
}

EXPORT uint32_t arc4random_uniform(uint32_t bound)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_ARC4RANDOM, &e)) {
            if (e.obj != 1 || e.val != bound)
                llft_diverge(t, LLFT_OP_ARC4RANDOM, &e, LLFT_EXIT_DIVERGED, "arc4random_uniform(%u)", bound);
            return (uint32_t)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        uint32_t v = REAL(arc4random_uniform)(bound);
        llft_record(t, LLFT_OP_ARC4RANDOM, 1, 0, v, 0, bound);
        return v;
    }
    return REAL(arc4random_uniform)(bound);
}

/* ---- /dev/urandom through file descriptors -------------------------- */

/* Backup: as many bytes as the primary read, taken off its own pipe
 * without waiting and dropped: its own forked child wrote them, and must
 * not be left blocked on a full pipe. */
static void drop_own_bytes(int fd, int64_t n)
{
    char scratch[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n > 0 && REAL(poll)(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
        ssize_t r = REAL(read)(fd, scratch, (size_t)n < sizeof scratch ? (size_t)n : sizeof scratch);
        if (r <= 0)
            break;
        n -= r;
    }
}

/* read() of an fd opened on a random device or under /proc, or of a pipe
 * shared with a forked child (wrap_io.c). */
int64_t llft_recorded_read(int fd, void *buf, size_t n)
{
    int kind = llft_fd_kind(fd);
    if (kind == FD_CHILD_IPC) {
        int64_t r = llft_recorded_call(LLFT_OP_CHILD_READ, (uint64_t)fd, buf, n, fill_fd);
        struct llft_thread *t;
        if (r > 0 && llft_mode(&t) == LLFT_ROLE_BACKUP)
            drop_own_bytes(fd, r);
        return r;
    }
    uint16_t op = kind == FD_PROCFS ? LLFT_OP_PROC_READ : LLFT_OP_RANDOM_READ;
    return llft_recorded_call(op, (uint64_t)fd, buf, n, fill_fd);
}

/* ---- the same through stdio ----------------------------------------- */

/* A cookie's fd: -1 for a random device (served by getrandom), else the
 * /proc file, opened for real in every replica (the primary reads it). */
static ssize_t cookie_read(void *cookie, char *buf, size_t n)
{
    intptr_t fd = (intptr_t)cookie;
    if (fd < 0)
        return llft_recorded_call(LLFT_OP_RANDOM_FREAD, 0, buf, n, fill_urandom);
    return llft_recorded_call(LLFT_OP_PROC_FREAD, 0, buf, n, fill_fd_cookie(fd));
}

static int cookie_close(void *cookie)
{
    intptr_t fd = (intptr_t)cookie;
    return fd < 0 ? 0 : REAL(close)((int)fd);
}

FILE *llft_recorded_file(const char *path, const char *mode)
{
    if (strchr(mode, 'w') || strchr(mode, 'a') || strchr(mode, '+')) {
        errno = EACCES; /* a replicated input is read-only */
        return NULL;
    }
    intptr_t fd = -1;
    if (proc_path(path)) {
        fd = REAL(open)(path, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0)
            return NULL;
    }
    cookie_io_functions_t io = {.read = cookie_read, .close = cookie_close};
    FILE *f = fopencookie((void *)fd, mode, io);
    if (f) /* unbuffered: each fread is one recorded read of the size asked */
        setvbuf(f, NULL, _IONBF, 0);
    else if (fd >= 0)
        REAL(close)((int)fd);
    return f;
}
