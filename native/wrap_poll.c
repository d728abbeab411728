/* Consistent Socket Communication Service, readiness: poll, select and
 * epoll (LLFT §V-E).  The primary records what the kernel said was ready
 * (and, for select, the time left); a backup returns the same without
 * asking its kernel, and then reads exactly what the primary read.
 *
 * epoll hands back the program's epoll_data, often a pointer, which differs
 * between replicas.  So the kernel is given the fd as the data, the
 * program's data is kept per epoll instance and fd, and readiness is
 * recorded and replayed by fd. */
#include "fdtable.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>

DEFINE_REAL(poll)
DEFINE_REAL(ppoll)
DEFINE_REAL(select)
DEFINE_REAL(pselect)
DEFINE_REAL(epoll_create1)
DEFINE_REAL(epoll_ctl)
DEFINE_REAL(epoll_wait)
DEFINE_REAL(epoll_pwait)

struct ready { uint32_t index; uint32_t events; }; /* poll: pollfd index; epoll: fd */

#define STACK_READY 256
#define MAX_READY ((LLFT_MAX_GROUP - 1) * LLFT_DATA_BYTES / sizeof(struct ready))

/* Backup: the primary's ready list for this call, checked against obj, and
 * its result in *res; LLFT_PROMOTED if this replica has just taken over. */
static int replay_ready(struct llft_thread *t, uint16_t op, uint64_t obj, struct ready **out,
                        struct ready *stack, size_t max, int64_t *res)
{
    llft_rec_t e;
    if (llft_replay_next(t, op, &e))
        return LLFT_PROMOTED;
    if (UNLIKELY(e.obj != obj))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "waited on %llu where the primary waited on %llu",
                     (unsigned long long)obj, (unsigned long long)e.obj);
    size_t n = (size_t)e.val / sizeof(struct ready);
    if (UNLIKELY(n > max))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "room for %zu ready entries, the primary had %zu", max, n);
    *out = n <= STACK_READY ? stack : malloc(n * sizeof **out);
    if (n)
        llft_replay_data(t, *out, n * sizeof **out);
    if (e.ret < 0)
        errno = e.err;
    *res = e.ret;
    return 0;
}

static void record_ready(struct llft_thread *t, uint16_t op, uint64_t obj, int r, int err,
                         const struct ready *list, size_t n)
{
    llft_record_data(t, op, obj, 0, r, r < 0 ? err : 0, n ? list : NULL, n * sizeof *list);
}

/* ---- poll ----------------------------------------------------------- */

static int poll_primary(struct llft_thread *t, struct pollfd *fds, nfds_t n, int r, int err)
{
    struct ready stack[STACK_READY], *list = stack;
    size_t k = 0;
    if (r > 0) {
        if ((size_t)r > STACK_READY)
            list = malloc((size_t)r * sizeof *list);
        for (nfds_t i = 0; i < n && k < (size_t)r && list; i++)
            if (fds[i].revents)
                list[k++] = (struct ready){(uint32_t)i, (uint32_t)(uint16_t)fds[i].revents};
    }
    record_ready(t, LLFT_OP_POLL, n, r, err, list, k);
    if (list != stack)
        free(list);
    errno = err;
    return r;
}

static int poll_backup(struct llft_thread *t, struct pollfd *fds, nfds_t n, int *res)
{
    struct ready stack[STACK_READY], *list;
    int64_t r;
    if (replay_ready(t, LLFT_OP_POLL, n, &list, stack, n, &r))
        return LLFT_PROMOTED;
    int err = errno;
    for (nfds_t i = 0; i < n; i++)
        fds[i].revents = 0;
    for (int64_t i = 0; r > 0 && i < r; i++) {
        if (list[i].index >= n)
            llft_diverge(t, LLFT_OP_POLL, NULL, LLFT_EXIT_DIVERGED, "pollfd index %u out of %lu", list[i].index,
                         (unsigned long)n);
        fds[list[i].index].revents = (short)list[i].events;
    }
    if (list != stack)
        free(list);
    errno = err;
    *res = (int)r;
    return 0;
}

/* A forked child that polls the program's clients' sockets is refused. */
static void forked_poll_check(const struct pollfd *fds, nfds_t n)
{
    for (nfds_t i = 0; i < n; i++)
        if (llft_client_kind(llft_fd_kind(fds[i].fd)))
            llft_forked_use(fds[i].fd, "polls the program's clients' sockets");
}

SWITCHING(int, poll, (struct pollfd *fds, nfds_t n, int timeout), (fds, n, timeout))
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    int res;
    if (role == LLFT_ROLE_BACKUP && !poll_backup(t, fds, n, &res))
        return res;
    if (role != LLFT_ROLE_OFF) {
        int r = LLFT_BLOCKING(t, REAL(poll)(fds, n, timeout));
        if (llft_kicked(t, r))
            return LLFT_AGAIN(t, poll_call(fds, n, timeout));
        return poll_primary(t, fds, n, r, errno);
    }
    if (UNLIKELY(llft_forked_from))
        forked_poll_check(fds, n);
    return REAL(poll)(fds, n, timeout);
}

SWITCHING(int, ppoll, (struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask), (fds, n, ts, mask))
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    int res;
    if (role == LLFT_ROLE_BACKUP && !poll_backup(t, fds, n, &res))
        return res;
    if (role != LLFT_ROLE_OFF) {
        sigset_t buf;
        int r = LLFT_BLOCKING(t, REAL(ppoll)(fds, n, ts, llft_mask_without_ours(mask, &buf)));
        if (llft_kicked(t, r))
            return LLFT_AGAIN(t, ppoll_call(fds, n, ts, mask));
        return poll_primary(t, fds, n, r, errno);
    }
    if (UNLIKELY(llft_forked_from))
        forked_poll_check(fds, n);
    return REAL(ppoll)(fds, n, ts, mask);
}

/* ---- select --------------------------------------------------------- */
/* Recorded as ready entries too: index = fd, events = which set (1, 2, 4). */

static int select_primary(struct llft_thread *t, int n, fd_set *sets[3], int r, int err)
{
    struct ready stack[STACK_READY], *list = stack;
    size_t k = 0;
    if (r > 0) {
        if ((size_t)r > STACK_READY)
            list = malloc((size_t)r * sizeof *list);
        for (int fd = 0; fd < n && list; fd++) {
            uint32_t in = 0;
            for (int s = 0; s < 3; s++)
                if (sets[s] && FD_ISSET(fd, sets[s]))
                    in |= 1u << s;
            if (in && k < (size_t)r)
                list[k++] = (struct ready){(uint32_t)fd, in};
        }
    }
    record_ready(t, LLFT_OP_SELECT, (uint64_t)n, r, err, list, k);
    if (list != stack)
        free(list);
    errno = err;
    return r;
}

static int select_backup(struct llft_thread *t, int n, fd_set *sets[3], int *res)
{
    struct ready stack[STACK_READY], *list;
    int64_t r;
    if (replay_ready(t, LLFT_OP_SELECT, (uint64_t)n, &list, stack, (size_t)n * 3, &r))
        return LLFT_PROMOTED;
    int err = errno;
    for (int s = 0; s < 3; s++)
        if (sets[s] && r >= 0)
            FD_ZERO(sets[s]);
    size_t k = r > 0 ? (size_t)r : 0;
    for (size_t i = 0; i < k; i++)
        for (int s = 0; s < 3; s++)
            if ((list[i].events & (1u << s)) && sets[s] && list[i].index < FD_SETSIZE)
                FD_SET((int)list[i].index, sets[s]);
    if (list != stack)
        free(list);
    errno = err;
    *res = (int)r;
    return 0;
}

SWITCHING(int, select, (int n, fd_set *restrict rd, fd_set *restrict wr, fd_set *restrict ex, struct timeval *restrict tv),
          (n, rd, wr, ex, tv))
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    fd_set *sets[3] = {rd, wr, ex};
    int res;
    if (role == LLFT_ROLE_BACKUP && !select_backup(t, n, sets, &res))
        return res;
    if (role != LLFT_ROLE_OFF) {
        int r = LLFT_BLOCKING(t, REAL(select)(n, rd, wr, ex, tv));
        if (llft_kicked(t, r)) /* the sets are as given; tv holds the time left */
            return LLFT_AGAIN(t, select_call(n, rd, wr, ex, tv));
        return select_primary(t, n, sets, r, errno);
    }
    return REAL(select)(n, rd, wr, ex, tv);
}

SWITCHING(int, pselect,
          (int n, fd_set *restrict rd, fd_set *restrict wr, fd_set *restrict ex, const struct timespec *restrict ts,
           const sigset_t *restrict mask),
          (n, rd, wr, ex, ts, mask))
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    fd_set *sets[3] = {rd, wr, ex};
    int res;
    if (role == LLFT_ROLE_BACKUP && !select_backup(t, n, sets, &res))
        return res;
    if (role != LLFT_ROLE_OFF) {
        sigset_t buf;
        int r = LLFT_BLOCKING(t, REAL(pselect)(n, rd, wr, ex, ts, llft_mask_without_ours(mask, &buf)));
        if (llft_kicked(t, r))
            return LLFT_AGAIN(t, pselect_call(n, rd, wr, ex, ts, mask));
        return select_primary(t, n, sets, r, errno);
    }
    return REAL(pselect)(n, rd, wr, ex, ts, mask);
}

/* ---- epoll ---------------------------------------------------------- */

static int epoll_made(int epfd)
{
    if (epfd < 0 || llft_fd_kind(epfd) != FD_LOCAL || !llft_ctl || (unsigned)epfd >= LLFT_FD_MAX)
        return epfd;
    void *m = mmap(NULL, sizeof(uint64_t) * LLFT_FD_MAX, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m != MAP_FAILED) {
        llft_fd_set(epfd, FD_EPOLL);
        llft_fds[epfd].epoll_data = m; /* never unmapped: a dup of the epoll fd may still use it */
    }
    return epfd;
}

static int make_epoll(void *flags) { return REAL(epoll_create1)(*(int *)flags); }

/* Under the primary's fd number (llft_new_fd): servers make one per
 * connection thread. */
EXPORT int epoll_create1(int flags)
{
    if (!llft_ctl)
        return REAL(epoll_create1)(flags);
    return epoll_made(llft_new_fd(make_epoll, &flags, flags & EPOLL_CLOEXEC));
}

EXPORT int epoll_create(int size)
{
    if (size <= 0) {
        errno = EINVAL;
        return -1;
    }
    return epoll_create1(0);
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    if (UNLIKELY(llft_forked_from) && op != EPOLL_CTL_DEL && llft_client_kind(llft_fd_kind(fd)))
        llft_forked_use(fd, "watches the program's clients' sockets");
    if (llft_fd_kind(epfd) != FD_EPOLL || (unsigned)fd >= LLFT_FD_MAX || !ev || op == EPOLL_CTL_DEL)
        return REAL(epoll_ctl)(epfd, op, fd, ev);
    struct epoll_event k = *ev;
    k.data.u64 = (uint64_t)fd;
    int r = REAL(epoll_ctl)(epfd, op, fd, &k);
    if (r == 0)
        llft_fds[epfd].epoll_data[fd] = ev->data.u64;
    return r;
}

static int epoll_primary(struct llft_thread *t, int epfd, struct epoll_event *evs, int r, int err)
{
    struct ready stack[STACK_READY], *list = stack;
    if (t && r > STACK_READY)
        list = malloc((size_t)r * sizeof *list);
    const uint64_t *data = llft_fds[epfd].epoll_data;
    for (int i = 0; i < r; i++) {
        uint32_t fd = (uint32_t)evs[i].data.u64;
        if (t && list)
            list[i] = (struct ready){fd, evs[i].events};
        evs[i].data.u64 = fd < LLFT_FD_MAX ? data[fd] : 0;
    }
    if (t)
        record_ready(t, LLFT_OP_EPOLL_WAIT, (uint64_t)epfd, r, err, list, r > 0 && list ? (size_t)r : 0);
    if (list != stack)
        free(list);
    errno = err;
    return r;
}

static int epoll_backup(struct llft_thread *t, int epfd, struct epoll_event *evs, int max, int *res)
{
    struct ready stack[STACK_READY], *list;
    int64_t r;
    if (replay_ready(t, LLFT_OP_EPOLL_WAIT, (uint64_t)epfd, &list, stack, max > 0 ? (size_t)max : 0, &r))
        return LLFT_PROMOTED;
    int err = errno;
    const uint64_t *data = llft_fds[epfd].epoll_data;
    for (int64_t i = 0; i < r; i++) {
        evs[i].events = list[i].events;
        evs[i].data.u64 = list[i].index < LLFT_FD_MAX ? data[list[i].index] : 0;
    }
    if (list != stack)
        free(list);
    errno = err;
    *res = (int)r;
    return 0;
}

/* epoll_wait and epoll_pwait (mask == NULL and pwait == 0: plain wait). */
static int epoll_common(int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask, int pwait)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    int res;
    if (role == LLFT_ROLE_BACKUP) {
        if (!epoll_backup(t, epfd, evs, max, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    sigset_t buf;
    int r;
    if (role == LLFT_ROLE_PRIMARY) {
        r = LLFT_BLOCKING(t, pwait ? REAL(epoll_pwait)(epfd, evs, max, timeout, llft_mask_without_ours(mask, &buf))
                                   : REAL(epoll_wait)(epfd, evs, max, timeout));
        if (llft_kicked(t, r))
            return LLFT_AGAIN(t, epoll_common(epfd, evs, max, timeout, mask, pwait));
    } else {
        r = pwait ? REAL(epoll_pwait)(epfd, evs, max, timeout, mask) : REAL(epoll_wait)(epfd, evs, max, timeout);
    }
    return epoll_primary(role == LLFT_ROLE_PRIMARY ? t : NULL, epfd, evs, r, errno);
}

SWITCHING(int, epoll_wait, (int epfd, struct epoll_event *evs, int max, int timeout), (epfd, evs, max, timeout))
{
    if (llft_fd_kind(epfd) != FD_EPOLL)
        return REAL(epoll_wait)(epfd, evs, max, timeout);
    return epoll_common(epfd, evs, max, timeout, NULL, 0);
}

SWITCHING(int, epoll_pwait, (int epfd, struct epoll_event *evs, int max, int timeout, const sigset_t *mask),
          (epfd, evs, max, timeout, mask))
{
    if (llft_fd_kind(epfd) != FD_EPOLL)
        return REAL(epoll_pwait)(epfd, evs, max, timeout, mask);
    return epoll_common(epfd, evs, max, timeout, mask, 1);
}
