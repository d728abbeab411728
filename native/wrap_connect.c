/* Consistent Socket Communication Service, outgoing connections: connect()
 * on a TCP socket of the program (docs/serving.md, "Outgoing connections").
 *
 * The socket is one end of an AF_UNIX stream socketpair.  connect() hands
 * the other end to the controller through the replica's private channel
 * (LLFT_CHAN_CONNECT) and writes an llft_connect_request_t on it: the
 * program's k-th outgoing connection and the address it asked for.  At the
 * primary the controller makes the real TCP connection and answers with an
 * llft_connect_reply_t (the real connect's error, the local address); the
 * shim records the answer.  A backup returns the recorded result and, when
 * the primary's connect succeeded, hands over its own socket for
 * connection k without waiting for an answer.  From then on the socket is
 * an FD_CONN like an accepted one: the controller gives every replica the
 * remote server's bytes in the same order, and sends the remote only the
 * primary's writes; reads and writes are recorded and replayed as on any
 * connection (wrap_io.c).
 *
 * A non-blocking connect waits for the answer as well (the TCP handshake,
 * made by the controller), then says EINPROGRESS; the socket is writable at
 * once and its pending error (SO_ERROR) is the real connect's result. */
#include "fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

DEFINE_REAL(fcntl)

/* The next outgoing connection's number at the primary.  A backup keeps it
 * past every number it replays, so that it continues the sequence should
 * it take over. */
static uint64_t next_conn_id = 1;

#define CONN_COUNT_MASK 0xffffffffull

/* The number of this process's k-th connection.  A process the program
 * forked (--fork replicate) counts on from its parent's count, or from 1
 * after an exec: its numbers carry its stream id's high half (with the top
 * bit set, which the first process's never have), so that no two processes
 * of a replica take one number. */
static uint64_t conn_number(uint64_t k)
{
    uint64_t sid = llft_ctl ? llft_ctl->stream_id : 0;
    return sid ? ((sid | 1ull << 63) & ~CONN_COUNT_MASK) | (k & CONN_COUNT_MASK) : k;
}

static void note_conn_id(uint64_t number)
{
    uint64_t k = number & CONN_COUNT_MASK;
    uint64_t cur = __atomic_load_n(&next_conn_id, __ATOMIC_RELAXED);
    while (cur <= k && !__atomic_compare_exchange_n(&next_conn_id, &cur, k + 1, 0, __ATOMIC_RELAXED,
                                                    __ATOMIC_RELAXED))
        ;
}

/* The address the program asked for, into rq; 0 or an errno. */
static int parse_target(const struct sockaddr *addr, socklen_t len, llft_connect_request_t *rq)
{
    memset(rq, 0, sizeof *rq);
    if (!addr)
        return EFAULT;
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
        rq->port = a->sin_port;
        memcpy(rq->addr, &a->sin_addr, 4);
    } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
        rq->port = a->sin6_port;
        memcpy(rq->addr, &a->sin6_addr, 16);
    } else {
        return addr->sa_family == AF_INET || addr->sa_family == AF_INET6 ? EINVAL : EAFNOSUPPORT;
    }
    rq->family = addr->sa_family;
    return 0;
}

/* Hands fd's other end to the controller and writes the request on it;
 * 0 or an errno. */
static int reach_controller(int fd, const llft_connect_request_t *rq)
{
    int err = llft_hand_over(fd, LLFT_CHAN_CONNECT, 0);
    return err ? err : llft_write_exact(fd, rq, sizeof *rq);
}

/* fd is connected (or not) as the reply says: an FD_CONN whose peer is the
 * remote server and whose local address is the real connection's. */
static void settle(int fd, const llft_connect_request_t *rq, const llft_connect_reply_t *rep, int in_progress)
{
    if (rep->err == 0) {
        uint8_t family = llft_fds[fd].family;
        llft_fd_set(fd, FD_CONN);
        struct llft_fd *f = &llft_fds[fd];
        f->family = family;
        f->port = ntohs(rep->port);
        memcpy(f->addr, rep->addr, 16);
        f->peer = (llft_conn_header_t){.conn_id = rq->conn_id, .family = rq->family, .port = rq->port};
        memcpy(f->peer.addr, rq->addr, 16);
    }
    if (in_progress)
        __atomic_store_n(&llft_fds[fd].so_error, rep->err, __ATOMIC_RELAXED);
}

/* The call's result: a non-blocking socket says EINPROGRESS and keeps the
 * outcome as its pending error. */
static int outcome(int nonblock, int err)
{
    errno = nonblock ? EINPROGRESS : err;
    return nonblock || err ? -1 : 0;
}

static int connect_primary(struct llft_thread *t, int fd, llft_connect_request_t *rq, int nonblock)
{
    rq->conn_id = conn_number(__atomic_fetch_add(&next_conn_id, 1, __ATOMIC_RELAXED));
    rq->flags = LLFT_CONNECT_ASK;
    llft_connect_reply_t rep = {.conn_id = rq->conn_id};
    int err = reach_controller(fd, rq);
    if (!err)
        err = llft_read_exact(fd, &rep, sizeof rep, 0);
    if (err || rep.conn_id != rq->conn_id) {
        llft_log("llft: outgoing connection %llu: no answer from the controller (error %d)",
                 (unsigned long long)rq->conn_id, err);
        rep = (llft_connect_reply_t){.conn_id = rq->conn_id, .err = ECONNABORTED};
    }
    int r = outcome(nonblock, rep.err);
    int call_err = errno;
    if (t)
        llft_record_data_aux(t, LLFT_OP_CONNECT, 0, 0, r, r < 0 ? call_err : 0, &rep, sizeof rep, (uint32_t)fd);
    settle(fd, rq, &rep, r < 0 && call_err == EINPROGRESS);
    errno = call_err;
    return r;
}

/* Backup: the primary's result; the same connection, without an answer. */
static int connect_replay(struct llft_thread *t, int fd, llft_connect_request_t *rq, int *res)
{
    llft_rec_t e;
    if (llft_replay_next(t, LLFT_OP_CONNECT, &e))
        return LLFT_PROMOTED;
    if (UNLIKELY(e.aux != (uint32_t)fd))
        llft_diverge(t, LLFT_OP_CONNECT, &e, LLFT_EXIT_DIVERGED, "connected fd %d where the primary connected fd %u",
                     fd, e.aux);
    llft_connect_reply_t rep;
    llft_replay_data(t, &rep, sizeof rep);
    note_conn_id(rep.conn_id);
    rq->conn_id = rep.conn_id;
    if (rep.err == 0) {
        int err = reach_controller(fd, rq);
        if (err)
            llft_diverge(t, LLFT_OP_CONNECT, &e, LLFT_EXIT_DIVERGED,
                         "cannot reach the controller for outgoing connection %llu (error %d)",
                         (unsigned long long)rep.conn_id, err);
    }
    settle(fd, rq, &rep, e.ret < 0 && e.err == EINPROGRESS);
    *res = (int)e.ret;
    errno = e.err;
    return 0;
}

int llft_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    struct llft_fd *f = &llft_fds[fd];
    if (f->kind != FD_VSOCK) { /* connected already, or listening: as TCP says */
        errno = f->kind == FD_CONN ? EISCONN : EINVAL;
        return -1;
    }
    int pending = __atomic_exchange_n(&f->so_error, 0, __ATOMIC_RELAXED);
    if (pending) { /* a failed non-blocking connect: connecting again reports it, as TCP does */
        errno = pending;
        return -1;
    }
    llft_connect_request_t rq;
    int err = parse_target(addr, len, &rq);
    if (err) {
        errno = err;
        return -1;
    }
    /* A connect waits for the controller's answer: a census waits for it. */
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        int res;
        if (!connect_replay(t, fd, &rq, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    int nonblock = (REAL(fcntl)(fd, F_GETFL) & O_NONBLOCK) != 0;
    /* A thread llft does not track (role OFF) still connects, unrecorded. */
    return connect_primary(role == LLFT_ROLE_PRIMARY ? t : NULL, fd, &rq, nonblock);
}
