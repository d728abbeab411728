/* The fd table, and the backup's exact-count transfers. */
#include "atomics.h"
#include "fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct llft_fd llft_fds[LLFT_FD_MAX];
uint32_t llft_fd_transfers[LLFT_FD_MAX];

DEFINE_REAL(read)
DEFINE_REAL(write)
DEFINE_REAL(recv)
DEFINE_REAL(poll)
DEFINE_REAL(sendfile)
DEFINE_REAL(fcntl)
DEFINE_REAL(close)

void llft_fd_set(int fd, int kind)
{
    if ((unsigned)fd < LLFT_FD_MAX) {
        memset(&llft_fds[fd], 0, sizeof llft_fds[fd]);
        llft_fds[fd].kind = (uint8_t)kind;
    }
}

void llft_wait_zero(const uint32_t *count, uint64_t max_ms)
{
    struct llft_waited waited = {0, 0};
    for (unsigned spins = 0; __atomic_load_n(count, __ATOMIC_ACQUIRE); spins++) {
        if (spins < 64) {
            __builtin_ia32_pause();
        } else if (spins < 128) {
            llft_yield();
        } else {
            if (llft_waited_ms(&waited) > max_ms)
                return;
            struct timespec us = {0, 20000};
            llft_nap(&us);
        }
    }
}

void llft_fd_channel(int a, int b)
{
    static uint32_t channels;
    uint32_t c = __atomic_add_fetch(&channels, 1, __ATOMIC_RELAXED);
    if ((unsigned)a < LLFT_FD_MAX)
        llft_fds[a].channel = c;
    if ((unsigned)b < LLFT_FD_MAX)
        llft_fds[b].channel = c;
}

/* Under --fork replicate the child is a replica's process too: what it
 * writes is the same at every replica, and a pipe to it is the replica's
 * own IPC, read for real (a backup's read then waits for its own child,
 * as the primary's did). */
void llft_fds_shared_with_child(void)
{
    if (llft_ctl && llft_ctl->fork_mode == LLFT_FORKS_REPLICATED)
        return;
    for (int fd = 0; fd < LLFT_FD_MAX; fd++)
        if (llft_fds[fd].kind == FD_IPC)
            llft_fds[fd].kind = FD_CHILD_IPC;
}

void llft_fd_forget(int fd)
{
    if ((unsigned)fd < LLFT_FD_MAX && llft_fds[fd].kind != FD_LOCAL)
        memset(&llft_fds[fd], 0, sizeof llft_fds[fd]);
}

void llft_fd_copy(int from, int to)
{
    if ((unsigned)from < LLFT_FD_MAX && (unsigned)to < LLFT_FD_MAX && from != to) {
        llft_fds[to] = llft_fds[from];
        llft_fds[to].handover = 0; /* the original keeps it */
    }
}

/* fd moved out of the way, to one of the highest numbers allowed: while
 * it waits for its number, it must not hold one another thread waits for
 * (two threads would wait for each other's). */
int llft_park_fd(int fd)
{
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < 256)
        return fd;
    int parked = REAL(fcntl)(fd, F_DUPFD_CLOEXEC, (int)(lim.rlim_cur - 64));
    if (parked < 0)
        return fd;
    REAL(close)(fd);
    return parked;
}

/* An fd the shim holds for itself (a socket's other end until the channel
 * hands it over), moved to the top quarter of the fd numbers, out of the
 * numbers the program's fds take, at every replica alike. */
int llft_out_of_the_way(int fd, int cloexec)
{
    static int base;
    if (!base) {
        struct rlimit lim;
        int b = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur >= 256 ? (int)(lim.rlim_cur - lim.rlim_cur / 4)
                                                                            : -1;
        __atomic_store_n(&base, b, __ATOMIC_RELAXED);
    }
    int b = __atomic_load_n(&base, __ATOMIC_RELAXED);
    if (b < 0 || fd >= b)
        return fd;
    int err = errno;
    int moved = REAL(fcntl)(fd, cloexec ? F_DUPFD_CLOEXEC : F_DUPFD, b);
    if (moved >= 0) {
        REAL(close)(fd);
        fd = moved;
    }
    errno = err;
    return fd;
}

/* fd (parked) under the number want once that is free here, then closed.
 * F_DUPFD takes the lowest free number from want on: want itself only if
 * free, atomically (dup3 would close whatever another thread had just
 * opened there, between a check and the dup). */
static void place_fd(struct llft_thread *t, uint16_t op, const llft_rec_t *e, int fd, int want, int cloexec)
{
    struct llft_waited waited = {0, 0};
    for (;;) {
        int got = REAL(fcntl)(fd, cloexec ? F_DUPFD_CLOEXEC : F_DUPFD, want);
        if (got == want)
            break;
        if (got >= 0)
            REAL(close)(got);
        if (llft_waited_ms(&waited) > llft_ctl->stall_timeout_ms) {
            char link[32], what[96] = "?";
            snprintf(link, sizeof link, "/proc/self/fd/%d", want);
            ssize_t n = readlink(link, what, sizeof what - 1);
            what[n > 0 ? n : 1] = 0;
            llft_diverge(t, op, e, LLFT_EXIT_DIVERGED, "the primary's fd %d stayed in use here (by %s, kind %d)",
                         want, what, llft_fd_kind(want));
        }
        struct timespec ms = {0, 1000000};
        llft_nap(&ms);
    }
    REAL(close)(fd);
}

/* The primary's fd numbers are handed out in one order, which its backups
 * follow (a turn of one object): two threads placing their numbers in
 * another order could each hold one the other waits for (fds of one
 * thread's round at the primary that another's later round reuses).  The
 * turn is taken with the number, under a lock, so that the two orders are
 * one (the shim's one system call under a spinlock: a pipe() or socket(),
 * a few microseconds, only where fds are made).  Accepted connections take
 * a turn too, after the kernel numbered them (llft_fd_numbered). */
static uint32_t numbering_lock;

static int new_fds_primary(struct llft_thread *t, int n, int (*make)(void *ctx, int *fds), void *ctx, int *fds)
{
    spin_lock(&numbering_lock);
    int r = make(ctx, fds);
    int err = errno;
    struct llft_obj *o = llft_obj_get(LLFT_FD_NUMBERS, t);
    uint64_t turn = llft_obj_take_turn(o);
    spin_unlock(&numbering_lock);
    llft_record(t, LLFT_OP_NEW_FD, o->id, turn, r == 0 ? fds[0] : -1, r == 0 ? 0 : err, r == 0 && n == 2 ? fds[1] : 0);
    errno = err;
    return r;
}

static void new_fds_replay(struct llft_thread *t, const llft_rec_t *e, int n, int (*make)(void *ctx, int *fds),
                           void *ctx, int cloexec, int *fds)
{
    struct turnstile *ts = llft_turn_wait(t, e);
    if (make(ctx, fds) != 0)
        llft_diverge(t, LLFT_OP_NEW_FD, e, LLFT_EXIT_DIVERGED, "could not make fd %lld here (error %d)",
                     (long long)e->ret, errno);
    int want[2] = {(int)e->ret, n == 2 ? (int)e->val : -1};
    /* Both parked first: each may sit on the other's number. */
    for (int i = 0; i < n; i++)
        if (fds[i] != want[i])
            fds[i] = llft_park_fd(fds[i]);
    for (int i = 0; i < n; i++)
        if (fds[i] != want[i])
            place_fd(t, LLFT_OP_NEW_FD, e, fds[i], want[i], cloexec);
    for (int i = 0; i < n; i++)
        fds[i] = want[i];
    llft_turn_done(t, ts, LLFT_FD_NUMBERS, e->turn);
}

int llft_new_fds(int n, int (*make)(void *ctx, int *fds), void *ctx, int cloexec, int *fds)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    llft_rec_t e;
    if (role == LLFT_ROLE_BACKUP && !llft_replay_next(t, LLFT_OP_NEW_FD, &e)) {
        if (e.ret < 0) {
            llft_turn_done(t, llft_turn_wait(t, &e), LLFT_FD_NUMBERS, e.turn);
            errno = e.err;
            return -1;
        }
        new_fds_replay(t, &e, n, make, ctx, cloexec, fds);
        return 0;
    }
    if (role == LLFT_ROLE_OFF)
        return make(ctx, fds);
    return new_fds_primary(t, n, make, ctx, fds); /* the primary, or a backup that has just taken over */
}

/* Primary: fd, numbered by the kernel outside the lock above (an accepted
 * connection), takes the next turn of the fd numbers after the fact.  That
 * is enough for a backup: the number was free here, so whoever had it
 * before took its turn and closed it first.  (Placed in its listener's
 * turn only, a backup's accepted connection could take the number of a fd
 * the primary made and closed before, whose thread then waited for the
 * number while the accepting thread waited for it, on a lock.) */
void llft_fd_numbered(struct llft_thread *t, int fd)
{
    struct llft_obj *o = llft_obj_get(LLFT_FD_NUMBERS, t);
    llft_record(t, LLFT_OP_NEW_FD, o->id, llft_obj_take_turn(o), fd, 0, 0);
}

/* Backup: fd (parked: made here outside the turns) goes to the number the
 * primary's llft_fd_numbered recorded, in its turn; returns that number.
 * A backup that takes over before the record numbers it as the primary
 * does: the lowest free number, as the kernel's accept gives. */
int llft_place_numbered(struct llft_thread *t, int fd, int cloexec)
{
    llft_rec_t e;
    if (llft_replay_next(t, LLFT_OP_NEW_FD, &e)) {
        int moved = REAL(fcntl)(fd, cloexec ? F_DUPFD_CLOEXEC : F_DUPFD, 0);
        if (moved >= 0) {
            REAL(close)(fd);
            fd = moved;
        }
        llft_fd_numbered(t, fd);
        return fd;
    }
    struct turnstile *ts = llft_turn_wait(t, &e);
    if (fd != (int)e.ret)
        place_fd(t, LLFT_OP_NEW_FD, &e, fd, (int)e.ret, cloexec);
    llft_turn_done(t, ts, LLFT_FD_NUMBERS, e.turn);
    return (int)e.ret;
}

/* A file the program opens, or a copy (dup) of one: made outside the
 * numbering lock (an open may wait on a disk, or on a FIFO's other end),
 * then numbered after the fact like an accepted connection.  A backup
 * opens its own file (nothing else: the primary's failed open fails here
 * unmade, with its errno) and moves it to the primary's number, so that
 * the program sees the numbers the kernel gave the primary (programs
 * size things by them: lighttpd its connection budget by the number
 * open("/dev/null") returns). */
int llft_open_numbered(int (*make)(void *ctx), void *ctx, int cloexec)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_NEW_FD, &e)) {
            if (e.ret < 0) {
                llft_turn_done(t, llft_turn_wait(t, &e), LLFT_FD_NUMBERS, e.turn);
                errno = e.err;
                return -1;
            }
            int fd = make(ctx);
            if (fd < 0)
                llft_diverge(t, LLFT_OP_NEW_FD, &e, LLFT_EXIT_DIVERGED,
                             "could not open what the primary opened as fd %lld (error %d here)", (long long)e.ret,
                             errno);
            /* Parked even on its own number: an earlier turn may want it. */
            fd = llft_park_fd(fd);
            struct turnstile *ts = llft_turn_wait(t, &e);
            place_fd(t, LLFT_OP_NEW_FD, &e, fd, (int)e.ret, cloexec);
            llft_turn_done(t, ts, LLFT_FD_NUMBERS, e.turn);
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_OFF)
        return make(ctx);
    int fd = make(ctx), err = errno;
    struct llft_obj *o = llft_obj_get(LLFT_FD_NUMBERS, t);
    llft_record(t, LLFT_OP_NEW_FD, o->id, llft_obj_take_turn(o), fd, fd < 0 ? err : 0, 0);
    errno = err;
    return fd;
}

struct one_fd {
    int (*make)(void *ctx);
    void *ctx;
};

static int make_one(void *c, int *fds)
{
    const struct one_fd *o = c;
    fds[0] = o->make(o->ctx);
    return fds[0] < 0 ? -1 : 0;
}

int llft_new_fd(int (*make)(void *ctx), void *ctx, int cloexec)
{
    struct one_fd o = {make, ctx};
    int fd;
    return llft_new_fds(1, make_one, &o, cloexec, &fd) == 0 ? fd : -1;
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

/* A zero-length read is the end of a pipe or stream socket, but only an
 * empty message of a datagram or seqpacket one. */
static int zero_read_is_end(int fd)
{
    int type = 0;
    socklen_t len = sizeof type;
    return syscall(SYS_getsockopt, fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type == SOCK_STREAM;
}

int llft_await_end(int fd)
{
    if (!zero_read_is_end(fd))
        return 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
        int r = REAL(poll)(&p, 1, 100);
        if (r < 0 && errno != EINTR)
            return errno;
        if (r <= 0)
            continue;
        if (p.revents & POLLNVAL)
            return EBADF;
        int avail = 0;
        if (ioctl(fd, FIONREAD, &avail) != 0)
            return errno;
        if (avail > 0)
            return EIO; /* bytes wait where the primary found its end */
        return 0;
    }
}

void llft_drain_counter(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint64_t v;
    if (REAL(poll)(&p, 1, 0) == 1 && (p.revents & POLLIN))
        (void)REAL(read)(fd, &v, sizeof v);
}

/* Calls step until n bytes have gone out through fd, waiting for room. */
static int put_exact(int fd, size_t n, ssize_t (*step)(void *ctx, size_t put, size_t left), void *ctx)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = step(ctx, put, n - put);
        if (r > 0) {
            put += (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            int e = wait_fd(fd, POLLOUT);
            if (e)
                return e;
        } else {
            return r < 0 ? errno : EIO; /* 0: a file that ends sooner here */
        }
    }
    return 0;
}

struct write_ctx { int fd; const char *buf; };
static ssize_t write_step(void *c, size_t put, size_t left)
{
    struct write_ctx *w = c;
    return REAL(write)(w->fd, w->buf + put, left);
}

int llft_write_exact(int fd, const void *buf, size_t n)
{
    struct write_ctx w = {fd, buf};
    return put_exact(fd, n, write_step, &w);
}

struct sendfile_ctx { int out, in; off_t *off; };
static ssize_t sendfile_step(void *c, size_t put, size_t left)
{
    struct sendfile_ctx *f = c;
    return REAL(sendfile)(f->out, f->in, f->off, left);
}

int llft_sendfile_exact(int out, int in, off_t *off, size_t n)
{
    struct sendfile_ctx f = {out, in, off};
    return put_exact(out, n, sendfile_step, &f);
}
