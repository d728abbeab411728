/* Consistent Socket Communication Service, UDP sockets (LLFT §V-E).
 *
 * A UDP socket of the program is really one end of an AF_UNIX datagram
 * socketpair.  bind() hands the other end to the controller through the
 * replica's private channel and lists the port, with type SOCK_DGRAM, in
 * the control block.  The controller sends every client datagram, in the
 * same order, to each replica's socket, headed by an llft_conn_header_t:
 * the datagram's number on the port and the client's address.  A receive
 * strips the header and gives the program the client's address, so
 * datagram boundaries are the client's own.  A send (sendto/sendmsg with
 * the client's address) goes to the controller, headed by the destination;
 * only the primary's replies leave the host.
 *
 * A socket that sends or connects before any bind (outgoing UDP) is bound
 * to port 0 first, as the kernel would: the controller serves that port on
 * any free public port (llft/serving/outgoing.py).
 *
 * The primary records each receive (payload length, the datagram's number,
 * msg_flags, or the error) and each send (payload length), taking turns on
 * the fd like stream transfers.  A backup receives its own copy of the same
 * datagram (checking its number), sends its own reply (which the controller
 * only digests), and returns the primary's results. */
#include "fdtable.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

DEFINE_REAL(recvmsg)
DEFINE_REAL(sendmsg)
DEFINE_REAL(poll)

#define HDR sizeof(llft_conn_header_t)
#define MAX_IOV 64

/* The header's buffer first, then the program's. */
static int with_header(struct iovec *v, llft_conn_header_t *h, const struct msghdr *m)
{
    if (m->msg_iovlen >= MAX_IOV) {
        errno = EMSGSIZE;
        return -1;
    }
    v[0] = (struct iovec){h, HDR};
    if (m->msg_iovlen)
        memcpy(v + 1, m->msg_iov, m->msg_iovlen * sizeof *v);
    return (int)m->msg_iovlen + 1;
}

static size_t payload_len(const struct msghdr *m)
{
    size_t s = 0;
    for (size_t i = 0; i < m->msg_iovlen; i++)
        s += m->msg_iov[i].iov_len;
    return s;
}

/* ---- receive -------------------------------------------------------- */

/* The next datagram from the controller: its payload length (the whole
 * length with MSG_TRUNC), or -1 with errno. */
static ssize_t recv_real(int fd, struct msghdr *m, int flags, llft_conn_header_t *h, int *mflags)
{
    struct iovec v[MAX_IOV];
    struct msghdr k = {0};
    int n = with_header(v, h, m);
    if (n < 0)
        return -1;
    for (;;) {
        k.msg_iov = v;
        k.msg_iovlen = (size_t)n;
        ssize_t r = REAL(recvmsg)(fd, &k, flags);
        if (r < 0)
            return r;
        if ((size_t)r >= HDR) {
            *mflags = k.msg_flags & ~MSG_CTRUNC;
            return r - (ssize_t)HDR;
        }
        /* Only the controller holds the other end, and it heads every
         * datagram: a shorter one is a bug there; dropped. */
        if (flags & MSG_PEEK)
            (void)REAL(recvmsg)(fd, &k, (flags & ~MSG_PEEK) | MSG_DONTWAIT);
        llft_log("llft: dropped a datagram of %zd bytes without its header on a UDP socket", r);
    }
}

static void give_source(struct msghdr *m, const llft_conn_header_t *h, int mflags)
{
    if (m->msg_name)
        llft_give_addr(m->msg_name, &m->msg_namelen, h->family, ntohs(h->port), h->addr);
    m->msg_controllen = 0; /* ancillary data (IP_PKTINFO, timestamps) is not replicated */
    m->msg_flags = mflags;
}

/* Backup: receive the datagram the primary received, waiting for it. */
static int recv_replay(struct llft_thread *t, int fd, struct msghdr *m, int flags, ssize_t *res)
{
    llft_rec_t e;
    if (llft_replay_head(t, LLFT_OP_DGRAM_RECV, fd, &e, res))
        return LLFT_PROMOTED;
    if (e.ret < 0) /* a datagram may be empty: 0 bytes is a datagram too */
        return 0;
    struct turnstile *ts = llft_turn_wait(t, &e);
    llft_conn_header_t h;
    int mflags = 0;
    ssize_t r;
    while ((r = recv_real(fd, m, flags | MSG_DONTWAIT, &h, &mflags)) < 0 && (errno == EAGAIN || errno == EINTR)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        REAL(poll)(&p, 1, 100);
    }
    if (UNLIKELY(r < 0))
        llft_diverge(t, LLFT_OP_DGRAM_RECV, &e, LLFT_EXIT_DIVERGED, "no datagram to receive here (error %d)", errno);
    if (UNLIKELY(h.conn_id != (uint64_t)e.val || r != e.ret))
        llft_diverge(t, LLFT_OP_DGRAM_RECV, &e, LLFT_EXIT_DIVERGED,
                     "received datagram %llu (%zd bytes) where the primary received datagram %llu (%lld bytes)",
                     (unsigned long long)h.conn_id, r, (unsigned long long)e.val, (long long)e.ret);
    llft_turn_done(t, ts, llft_fd_object(fd), e.turn);
    give_source(m, &h, e.err);
    return 0;
}

ssize_t llft_dgram_recvmsg(int fd, struct msghdr *m, int flags)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (UNLIKELY(role == LLFT_ROLE_OFF && llft_forked_from))
        llft_forked_use(fd, "received on the program's UDP socket");
    if (role == LLFT_ROLE_BACKUP) {
        ssize_t res;
        if (!recv_replay(t, fd, m, flags, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    llft_conn_header_t h;
    int mflags = 0;
    ssize_t r;
    if (role == LLFT_ROLE_PRIMARY) {
        llft_transfer_begin(fd);
        r = LLFT_BLOCKING(t, recv_real(fd, m, flags, &h, &mflags));
        llft_transfer_returned(fd);
        if (llft_kicked(t, r)) {
            llft_transfer_end(fd);
            return LLFT_AGAIN(t, llft_dgram_recvmsg(fd, m, flags));
        }
    } else {
        r = recv_real(fd, m, flags, &h, &mflags);
    }
    int err = errno;
    if (r >= 0)
        give_source(m, &h, mflags);
    if (role == LLFT_ROLE_PRIMARY) {
        if (r >= 0) {
            struct llft_obj *o = llft_obj_get(llft_fd_object(fd), t);
            llft_record_aux(t, LLFT_OP_DGRAM_RECV, o->id, llft_obj_take_turn(o), r, mflags, (int64_t)h.conn_id,
                            (uint32_t)fd);
        } else {
            llft_record_aux(t, LLFT_OP_DGRAM_RECV, 0, 0, -1, err, 0, (uint32_t)fd);
        }
        llft_transfer_end(fd);
    }
    errno = err;
    return r;
}

/* ---- send ----------------------------------------------------------- */

/* A UDP socket that sends (or connects) before it is bound gets a port of
 * its own, as the kernel gives it: bind() to port 0 picks the same one at
 * every replica and publishes it for the controller to serve on any free
 * port (outgoing UDP: a DNS lookup, a client of a UDP service). */
static int bind_any_port(int fd)
{
    if (llft_fds[fd].port)
        return 0;
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (llft_fds[fd].family == AF_INET6) {
        ((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
        len = sizeof(struct sockaddr_in6);
    } else {
        ((struct sockaddr_in *)&ss)->sin_family = AF_INET;
        len = sizeof(struct sockaddr_in);
    }
    return bind(fd, (struct sockaddr *)&ss, len) == 0 ? 0 : errno;
}

/* An address into a header (the destination, or a connected peer). */
static int to_header(const struct sockaddr *a, socklen_t len, llft_conn_header_t *h)
{
    memset(h, 0, sizeof *h);
    if (a->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)a;
        h->port = in->sin_port;
        memcpy(h->addr, &in->sin_addr, 4);
    } else if (a->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;
        h->port = in6->sin6_port;
        memcpy(h->addr, &in6->sin6_addr, 16);
    } else {
        return EAFNOSUPPORT;
    }
    h->family = a->sa_family;
    return 0;
}

/* The header for a datagram to dest (or the connected peer), or an errno.
 * Outcomes decided here are the same at every replica: nothing is
 * recorded for them. */
static int dest_header(int fd, const struct msghdr *m, llft_conn_header_t *h)
{
    int err;
    if (m->msg_name)
        err = to_header(m->msg_name, m->msg_namelen, h);
    else if (llft_fds[fd].peer.family)
        *h = llft_fds[fd].peer, err = 0;
    else
        err = EDESTADDRREQ;
    return err ? err : bind_any_port(fd);
}

/* connect() on a UDP socket: sends without an address go to the peer.
 * Nothing filters what is received (the kernel would keep only the
 * peer's datagrams).  AF_UNSPEC dissolves the association. */
int llft_dgram_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    if (addr && addr->sa_family == AF_UNSPEC) {
        memset(&llft_fds[fd].peer, 0, sizeof llft_fds[fd].peer);
        return 0;
    }
    llft_conn_header_t h;
    int err = addr ? to_header(addr, len, &h) : EFAULT;
    if (!err)
        err = bind_any_port(fd);
    if (err) {
        errno = err;
        return -1;
    }
    llft_fds[fd].peer = h;
    return 0;
}

/* Sends the datagram to the controller; returns the payload length. */
static ssize_t send_real(int fd, const struct msghdr *m, int flags, llft_conn_header_t *h)
{
    struct iovec v[MAX_IOV];
    int n = with_header(v, h, m);
    if (n < 0)
        return -1;
    struct msghdr k = {.msg_iov = v, .msg_iovlen = (size_t)n};
    ssize_t r = REAL(sendmsg)(fd, &k, flags | MSG_NOSIGNAL);
    if (r < 0 && (errno == ECONNREFUSED || errno == EPIPE || errno == ECONNRESET))
        return (ssize_t)payload_len(m); /* the controller is gone: lost, as UDP allows */
    return r < 0 ? r : r - (ssize_t)HDR;
}

/* Backup: send this replica's copy (the controller digests it) and return
 * the primary's result. */
static int send_replay(struct llft_thread *t, int fd, const struct msghdr *m, int flags, llft_conn_header_t *h,
                       ssize_t *res)
{
    llft_rec_t e;
    if (llft_replay_head(t, LLFT_OP_DGRAM_SEND, fd, &e, res))
        return LLFT_PROMOTED;
    if (e.ret < 0) /* a datagram may be empty: 0 bytes is a datagram too */
        return 0;
    if (UNLIKELY((size_t)e.ret != payload_len(m)))
        llft_diverge(t, LLFT_OP_DGRAM_SEND, &e, LLFT_EXIT_DIVERGED,
                     "sent a datagram of %zu bytes where the primary sent %lld", payload_len(m), (long long)e.ret);
    struct turnstile *ts = llft_turn_wait(t, &e);
    while (send_real(fd, m, flags | MSG_DONTWAIT, h) < 0 && (errno == EAGAIN || errno == EINTR)) {
        struct timespec ms = {0, 1000000}; /* the controller's queue is full: it reads on */
        llft_nap(&ms);
    }
    llft_turn_done(t, ts, llft_fd_object(fd), e.turn);
    return 0;
}

ssize_t llft_dgram_sendmsg(int fd, const struct msghdr *m, int flags)
{
    llft_conn_header_t h;
    int bad = dest_header(fd, m, &h);
    if (bad) {
        errno = bad;
        return -1;
    }
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (UNLIKELY(role == LLFT_ROLE_OFF && llft_forked_from))
        llft_forked_use(fd, "sent on the program's UDP socket");
    if (role == LLFT_ROLE_BACKUP) {
        ssize_t res;
        if (!send_replay(t, fd, m, flags, &h, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    ssize_t r;
    if (role == LLFT_ROLE_PRIMARY) {
        llft_transfer_begin(fd);
        r = LLFT_BLOCKING(t, send_real(fd, m, flags, &h));
        llft_transfer_returned(fd);
        if (llft_kicked(t, r)) {
            llft_transfer_end(fd);
            return LLFT_AGAIN(t, llft_dgram_sendmsg(fd, m, flags));
        }
    } else {
        r = send_real(fd, m, flags, &h);
    }
    int err = errno;
    if (role == LLFT_ROLE_PRIMARY) {
        if (r >= 0) {
            struct llft_obj *o = llft_obj_get(llft_fd_object(fd), t);
            llft_record_aux(t, LLFT_OP_DGRAM_SEND, o->id, llft_obj_take_turn(o), r, 0, 0, (uint32_t)fd);
        } else {
            llft_record_aux(t, LLFT_OP_DGRAM_SEND, 0, 0, -1, err, 0, (uint32_t)fd);
        }
        llft_transfer_end(fd);
    }
    errno = err;
    return r;
}

/* ---- the other calls, as one msghdr ------------------------------- */

ssize_t llft_dgram_recv(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *len)
{
    struct iovec v = {buf, n};
    struct msghdr m = {.msg_name = len ? addr : NULL, .msg_namelen = len ? *len : 0, .msg_iov = &v, .msg_iovlen = 1};
    ssize_t r = llft_dgram_recvmsg(fd, &m, flags);
    if (r >= 0 && addr && len)
        *len = m.msg_namelen;
    return r;
}

ssize_t llft_dgram_send(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t len)
{
    struct iovec v = {(void *)buf, n};
    struct msghdr m = {.msg_name = (void *)addr, .msg_namelen = len, .msg_iov = &v, .msg_iovlen = 1};
    return llft_dgram_sendmsg(fd, &m, flags);
}

ssize_t llft_dgram_readv(int fd, const struct iovec *iov, int n)
{
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = n > 0 ? (size_t)n : 0};
    return llft_dgram_recvmsg(fd, &m, 0);
}

ssize_t llft_dgram_writev(int fd, const struct iovec *iov, int n)
{
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = n > 0 ? (size_t)n : 0};
    return llft_dgram_sendmsg(fd, &m, 0);
}

/* ---- several datagrams at once -------------------------------------- */
/* One recorded call per datagram.  recvmmsg's timeout is not honoured. */

DEFINE_REAL(recvmmsg)
DEFINE_REAL(sendmmsg)

SWITCHING(int, recvmmsg, (int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *timeout),
          (fd, v, n, flags, timeout))
{
    if (llft_fd_kind(fd) != FD_DGRAM)
        return REAL(recvmmsg)(fd, v, n, flags, timeout);
    unsigned int i = 0;
    for (; i < n; i++) {
        int f = flags & ~MSG_WAITFORONE;
        if (i && (flags & MSG_WAITFORONE))
            f |= MSG_DONTWAIT;
        ssize_t r = llft_dgram_recvmsg(fd, &v[i].msg_hdr, f);
        if (r < 0)
            break;
        v[i].msg_len = (unsigned int)r;
    }
    return i ? (int)i : -1;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
    if (llft_fd_kind(fd) != FD_DGRAM)
        return REAL(sendmmsg)(fd, v, n, flags);
    unsigned int i = 0;
    for (; i < n; i++) {
        ssize_t r = llft_dgram_sendmsg(fd, &v[i].msg_hdr, flags);
        if (r < 0)
            break;
        v[i].msg_len = (unsigned int)r;
    }
    return i ? (int)i : -1;
}
