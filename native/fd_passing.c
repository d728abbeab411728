/* Descriptors passed between a replica's processes (SCM_RIGHTS on a
 * socketpair: nginx's master hands its workers each other's channels so).
 * The bytes of such a sendmsg or recvmsg are a transfer like any other
 * (wrap_io.c: the primary records the count, a backup moves as many
 * through its own socket); what rides with them is each replica's own:
 * a backup's sender passes its own descriptors for real, and its receiver
 * takes them for real and numbers them as the primary's were numbered
 * (each received fd takes a turn of the fd numbers, as an accepted
 * connection does: fdtable.c). */
#include "fdtable.h"

#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

DEFINE_REAL(recvmsg)
DEFINE_REAL(sendmsg)
DEFINE_REAL(poll)

#define MAX_IOV 64

int llft_replay_head(struct llft_thread *t, uint16_t op, int fd, llft_rec_t *e, ssize_t *res); /* wrap_io.c */

/* The received fds of msg, in order, into out (at most max); how many. */
static int received_fds(struct msghdr *msg, int **slots, int max)
{
    int n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int *fds = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n < max; i++)
            slots[n++] = &fds[i];
    }
    return n;
}

/* A socket or a pipe received is IPC of the replica's own, as a
 * socketpair() is; anything else is left as the program's. */
static void note_received(int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode)))
        llft_fd_set(fd, FD_IPC);
}

void llft_number_received_fds(struct llft_thread *t, struct msghdr *msg)
{
    int *slots[64];
    int n = received_fds(msg, slots, 64);
    for (int i = 0; i < n; i++) {
        llft_fd_numbered(t, *slots[i]);
        note_received(*slots[i]);
    }
}

/* iov cut to its first n bytes, into out (MAX_IOV entries); its length. */
static int iov_prefix(const struct iovec *iov, int niov, size_t n, struct iovec *out)
{
    int k = 0;
    for (int i = 0; i < niov && n && k < MAX_IOV; i++) {
        size_t take = iov[i].iov_len < n ? iov[i].iov_len : n;
        out[k].iov_base = iov[i].iov_base;
        out[k++].iov_len = take;
        n -= take;
    }
    return k;
}

/* The bytes after the first `got` of a transfer of `want`, moved by
 * step (a read or a write of exactly that many). */
static int rest_exact(const struct iovec *iov, int niov, size_t got, size_t want,
                      int (*step)(int fd, void *buf, size_t n, int peek), int fd)
{
    size_t at = 0;
    for (int i = 0; i < niov && got < want; i++) {
        size_t len = iov[i].iov_len;
        if (at + len <= got) {
            at += len;
            continue;
        }
        size_t off = got - at, n = len - off < want - got ? len - off : want - got;
        int err = step(fd, (char *)iov[i].iov_base + off, n, 0);
        if (err)
            return err;
        got += n;
        at += len;
    }
    return 0;
}

/* One real sendmsg or recvmsg of a backup's, made however the socket is
 * set to block: its peer (the backup's other process) may lag. */
static ssize_t whole_call(ssize_t (*call)(int, struct msghdr *, int), int fd, struct msghdr *m, int flags,
                          short events)
{
    for (;;) {
        ssize_t r = call(fd, m, flags | MSG_DONTWAIT);
        if (r >= 0 || (errno != EAGAIN && errno != EINTR))
            return r;
        struct pollfd p = {.fd = fd, .events = events};
        REAL(poll)(&p, 1, 100);
    }
}

static ssize_t recv_call(int fd, struct msghdr *m, int flags) { return REAL(recvmsg)(fd, m, flags); }
static ssize_t send_call(int fd, struct msghdr *m, int flags) { return REAL(sendmsg)(fd, m, flags); }

static int write_step(int fd, void *buf, size_t n, int unused)
{
    (void)unused;
    return llft_write_exact(fd, buf, n);
}

/* A backup's transfer of the primary's byte count through fd, with what
 * rides with it: one real call (recvmsg or sendmsg) of at most those
 * bytes, then the rest plain.  0, or LLFT_PROMOTED. */
static int replay_with_control(struct llft_thread *t, uint16_t op, int fd, struct msghdr *msg, int flags,
                               ssize_t *res)
{
    llft_rec_t e;
    if (llft_replay_head(t, op, fd, &e, res))
        return LLFT_PROMOTED;
    if (e.ret <= 0) {
        if (op == LLFT_OP_READ)
            msg->msg_controllen = 0;
        return 0;
    }
    int reading = op == LLFT_OP_READ;
    struct iovec cut[MAX_IOV];
    struct msghdr m = *msg;
    m.msg_iov = cut;
    m.msg_iovlen = (size_t)iov_prefix(msg->msg_iov, (int)msg->msg_iovlen, (size_t)e.ret, cut);
    struct turnstile *ts = llft_turn_wait(t, &e);
    ssize_t moved = reading ? whole_call(recv_call, fd, &m, flags & ~MSG_DONTWAIT, POLLIN)
                            : whole_call(send_call, fd, &m, (flags & ~MSG_DONTWAIT) | MSG_NOSIGNAL, POLLOUT);
    int err = moved < 0 ? errno : moved == 0 && reading ? ECONNRESET
            : rest_exact(msg->msg_iov, (int)msg->msg_iovlen, (size_t)moved, (size_t)e.ret,
                         reading ? llft_read_exact : write_step, fd);
    llft_turn_done(t, ts, llft_fd_object(fd), e.turn);
    if (err)
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED,
                     "could not %s the %lld bytes the primary did here, with what went with them (error %d)",
                     reading ? "receive" : "send", (long long)e.ret, err);
    if (reading) {
        msg->msg_controllen = m.msg_controllen;
        msg->msg_flags = m.msg_flags;
    }
    return 0;
}

int llft_replay_recvmsg_fds(struct llft_thread *t, int fd, struct msghdr *msg, int flags, ssize_t *res)
{
    int r = replay_with_control(t, LLFT_OP_READ, fd, msg, flags, res);
    if (r || *res <= 0)
        return r;
    int *slots[64];
    int n = received_fds(msg, slots, 64);
    for (int i = 0; i < n; i++) {
        *slots[i] = llft_place_numbered(t, llft_park_fd(*slots[i]), flags & MSG_CMSG_CLOEXEC);
        note_received(*slots[i]);
    }
    return 0;
}

int llft_replay_sendmsg_fds(struct llft_thread *t, int fd, const struct msghdr *msg, int flags, ssize_t *res)
{
    struct msghdr m = *msg;
    return replay_with_control(t, LLFT_OP_WRITE, fd, &m, flags, res);
}
