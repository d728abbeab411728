/* Keeping the fd table true: every way a descriptor is made, copied or
 * closed.  A descriptor the replicas share by number (a pipe, an eventfd or
 * timerfd, a copy of a socket: epoll sets, poll arrays and the program's
 * own tables name them so) is made under the primary's number
 * (llft_new_fds): threads make them in any order, and the kernel gives the
 * lowest free number, so a backup's thread would get another one.  A copy
 * of a file is numbered after the fact, as the file is (wrap_open.c). */
#include "atomics.h"
#include "channel.h"
#include "fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <stdarg.h>
#include <time.h>
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

/* What retiring an fd does for real: close it, or put a copy of another
 * fd in its place (dup2, dup3). */
struct retire {
    int fd;
    int from;          /* dup2/dup3: the fd copied over fd; -1 for close */
    int flags;         /* dup3's */
    int is_dup3;
};

/* What the shim keeps for fd goes with it: its listed port, the other end
 * of a socket never handed to the controller. */
static void forget(int fd)
{
    if ((unsigned)fd >= LLFT_FD_MAX)
        return;
    int kind = llft_fd_kind(fd);
    if (kind == FD_LISTEN || (kind == FD_DGRAM && llft_fds[fd].port))
        llft_listener_closed(fd);
    int other = __atomic_exchange_n(&llft_fds[fd].handover, 0, __ATOMIC_ACQ_REL);
    if (other > 0)
        REAL(close)(other);
    llft_fd_forget(fd); /* before the number is free for another thread's new fd */
}

static int retire_real(const struct retire *r)
{
    if (r->from < 0) {
        forget(r->fd);
        return REAL(close)(r->fd);
    }
    if (llft_is_kept(r->fd) && llft_kept_move(r->fd) != 0) {
        errno = EMFILE;
        return -1;
    }
    forget(r->fd);
    int res = r->is_dup3 ? REAL(dup3)(r->from, r->fd, r->flags) : REAL(dup2)(r->from, r->fd);
    if (res >= 0)
        llft_fd_copy(r->from, res);
    return res;
}

/* Primary: the transfers under way on fd end (take their turns) before
 * the close takes its own.  One that stays blocked in the kernel (a
 * thread reading a connection another thread closes) is not waited for
 * past a few milliseconds; one whose call has returned always is, however
 * long the scheduler keeps its thread from its turn.  Between a call's
 * return and its mark a thread looks blocked to the counters alone:
 * /proc tells (blocked_threads.c). */
#define TRANSFERS_WAIT_MS 2
#define TRANSFERS_WAIT_MAX_MS 2000
static void wait_transfers(int fd)
{
    uint32_t *w = &llft_fd_transfers[fd];
    llft_wait_zero(w, TRANSFERS_WAIT_MS);
    uint64_t since = llft_now_ms();
    for (;;) {
        uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        uint32_t begun = v & (LLFT_TRANSFER_RETURNED - 1);
        if (!begun)
            return;
        if (v < LLFT_TRANSFER_RETURNED && (int)begun <= llft_threads_in_transfer(fd))
            return; /* each one left is blocked in the kernel */
        if (llft_now_ms() - since > TRANSFERS_WAIT_MAX_MS) {
            llft_log("llft: close of fd %d: %u transfer(s) on it neither ended nor blocked after %d ms", fd,
                     begun, TRANSFERS_WAIT_MAX_MS);
            return;
        }
        struct timespec us = {0, 200000};
        llft_nap(&us);
    }
}

/* Primary, closing: the file goes, but its number stays taken (by a copy
 * of the read-only library fd) until the close is recorded, so that
 * another thread's new fd of that number is recorded after it.  A backup
 * that got the reuse without the close would wait for the number, and a
 * primary dying between the two would leave it waiting for good.  1 when
 * so held (the close's own errors are lost, as dup2's are); 0 when the
 * caller must retire it for real. */
static int hold_number(const struct retire *r)
{
    int hold = __atomic_load_n(&llft_library_fd, __ATOMIC_ACQUIRE);
    if (r->from >= 0 || hold < 0)
        return 0;
    forget(r->fd);
    return REAL(dup2)(hold, r->fd) == r->fd;
}

/* An fd whose object takes turns (llft_ordered_kind) is retired in a turn
 * of its own: at a backup after every transfer the primary made on it
 * before, and before any on the next fd to get its number.  A backup's
 * thread whose next record is another call closes unordered: at the
 * primary this thread never got here (its process ended first, as when a
 * racy shutdown flag let the backup's thread leave its loop one turn
 * earlier), and its next recorded call says whether it diverged. */
static int retire_ordered(const struct retire *r)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        int next = llft_replay_next_if(t, LLFT_OP_CLOSE, &e);
        if (next == LLFT_NOT_NEXT)
            return retire_real(r);
        ssize_t res = (ssize_t)e.ret;
        if (next == 0) {
            if (UNLIKELY(e.aux != (uint32_t)r->fd))
                llft_diverge(t, LLFT_OP_CLOSE, &e, LLFT_EXIT_DIVERGED, "closed fd %d where the primary closed fd %u",
                             r->fd, e.aux);
            struct turnstile *ts = llft_turn_wait(t, &e);
            retire_real(r);
            llft_turn_done(t, ts, llft_fd_object(r->fd), e.turn);
            if (e.ret < 0)
                errno = e.err;
            return (int)res;
        }
        role = LLFT_ROLE_PRIMARY; /* taken over */
    }
    if (role == LLFT_ROLE_OFF)
        return retire_real(r);
    wait_transfers(r->fd);
    struct llft_obj *o = llft_obj_get(llft_fd_object(r->fd), t);
    uint64_t turn = llft_obj_take_turn(o);
    int res, err, held = hold_number(r);
    if (held) {
        res = 0;
        err = 0;
    } else {
        res = retire_real(r);
        err = errno;
    }
    llft_record_aux(t, LLFT_OP_CLOSE, o->id, turn, res, res < 0 ? err : 0, 0, (uint32_t)r->fd);
    if (held)
        REAL(close)(r->fd); /* recorded: now the number may go to another thread's new fd */
    errno = err;
    return res;
}

static int retire(const struct retire *r)
{
    if (llft_ordered_kind(llft_fd_kind(r->fd)) && r->from != r->fd)
        return retire_ordered(r);
    return retire_real(r);
}

EXPORT int close(int fd)
{
    if (UNLIKELY(llft_is_kept(fd)))
        return 0; /* the program closing what it did not open (a daemon's every fd): kept */
    return retire(&(struct retire){.fd = fd, .from = -1});
}

/* close_range and closefrom close many at once: each one the shim tracks,
 * and the channel, goes through close(); the rest in a few ranges. */
DEFINE_REAL(close_range)

EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    if (!replicated() || (flags & ~CLOSE_RANGE_CLOEXEC) != 0)
        return REAL(close_range)(first, last, flags);
    unsigned from = first;
    for (unsigned fd = first; fd <= last && fd < LLFT_FD_MAX; fd++) {
        if (!llft_is_kept((int)fd) && llft_fd_kind((int)fd) == FD_LOCAL && !llft_fds[fd].handover)
            continue;
        if (from < fd && REAL(close_range)(from, fd - 1, flags) != 0)
            return -1;
        if (!llft_is_kept((int)fd)) {
            if (flags & CLOSE_RANGE_CLOEXEC)
                fcntl((int)fd, F_SETFD, FD_CLOEXEC);
            else
                close((int)fd);
        }
        from = fd + 1;
        if (fd == last)
            return 0;
    }
    return from <= last ? REAL(close_range)(from, last, flags) : 0;
}

EXPORT void closefrom(int first)
{
    close_range(first < 0 ? 0 : (unsigned)first, ~0u, 0);
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
    if (llft_fd_kind(fd) != FD_LOCAL)
        r = llft_new_fd(make_dup, &a, cmd == F_DUPFD_CLOEXEC);
    else
        r = llft_open_numbered(make_dup, &a, cmd == F_DUPFD_CLOEXEC); /* as the file itself (wrap_open.c) */
    if (r >= 0)
        llft_fd_copy(fd, r);
    return r;
}

EXPORT int dup(int fd) { return dup_common(fd, F_DUPFD, 0); }

EXPORT int dup2(int fd, int to)
{
    if (fd == to)
        return REAL(dup2)(fd, to);
    return retire(&(struct retire){.fd = to, .from = fd});
}

EXPORT int dup3(int fd, int to, int flags)
{
    if (fd == to)
        return REAL(dup3)(fd, to, flags); /* EINVAL */
    return retire(&(struct retire){.fd = to, .from = fd, .flags = flags, .is_dup3 = 1});
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
        llft_fd_channel(fds[0], fds[1]);
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
