/* Consistent Socket Communication Service, the socket calls (LLFT §V-E).
 *
 * A TCP socket of the program is really one end of an AF_UNIX stream
 * socketpair; the shim keeps the other end (its handover) until listen()
 * or connect() hands it to the controller through the replica's private
 * channel (channel.c), which no other process can reach.  For each client
 * connection the controller sends one byte on a listening socket with the
 * connection's fd, and writes an llft_conn_header_t first on the
 * connection; accept() takes both, so the program sees an ordinary TCP
 * connection from the client's address while its bytes come from the
 * controller.  At the primary the kernel decides readiness and ordering;
 * the accept is recorded with the connection id, and a backup accepts the
 * same connection, checks its id, and gives it the primary's fd number. */
#include "atomics.h"
#include "channel.h"
#include "fdtable.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

DEFINE_REAL(socket)
DEFINE_REAL(socketpair)
DEFINE_REAL(bind)
DEFINE_REAL(listen)
DEFINE_REAL(accept)
DEFINE_REAL(accept4)
DEFINE_REAL(recvmsg)
DEFINE_REAL(connect)
DEFINE_REAL(dup3)
DEFINE_REAL(getsockname)
DEFINE_REAL(getpeername)
DEFINE_REAL(setsockopt)
DEFINE_REAL(getsockopt)
DEFINE_REAL(close)
DEFINE_REAL(poll)
DEFINE_REAL(fcntl)

static inline int replicated(void)
{
    if (UNLIKELY(__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) != 2))
        llft_init_slow();
    return llft_ctl != NULL;
}

static inline int virtual_kind(int kind)
{
    return kind == FD_VSOCK || kind == FD_LISTEN || kind == FD_CONN || kind == FD_DGRAM;
}

/* The controller's end of the socket make_socket made last on this thread. */
static __thread int made_handover TLS_IE;

struct socket_args { int type; };

/* A pair: the program's socket, returned, and its handover, moved out of
 * the numbers the program's fds take (it is never the program's). */
static int make_socket(void *a)
{
    int sv[2];
    if (REAL(socketpair)(AF_UNIX, ((struct socket_args *)a)->type | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    made_handover = llft_out_of_the_way(sv[1], 1);
    if (!(((struct socket_args *)a)->type & SOCK_CLOEXEC))
        REAL(fcntl)(sv[0], F_SETFD, 0);
    return sv[0];
}

/* TCP and UDP sockets are made under the primary's fd number (see llft_new_fd). */
static int virtual_socket(int domain, int type, int kind)
{
    struct socket_args a = {type};
    int fd = llft_new_fd(make_socket, &a, type & SOCK_CLOEXEC);
    if (fd >= 0) {
        llft_fd_set(fd, kind);
        llft_fds[fd].family = (uint8_t)domain;
        llft_fds[fd].handover = made_handover;
    }
    return fd;
}

EXPORT int socket(int domain, int type, int protocol)
{
    if ((domain == AF_INET || domain == AF_INET6) && (type & 0xff) == SOCK_STREAM && replicated())
        return virtual_socket(domain, type, FD_VSOCK);
    if ((domain == AF_INET || domain == AF_INET6) && (type & 0xff) == SOCK_DGRAM &&
        (protocol == 0 || protocol == IPPROTO_UDP) && replicated())
        return virtual_socket(domain, type, FD_DGRAM); /* a UDP socket: see wrap_udp.c */
    return REAL(socket)(domain, type, protocol);
}

int llft_hand_over(int fd, uint32_t kind, uint32_t type)
{
    struct llft_fd *f = &llft_fds[fd];
    int other = __atomic_exchange_n(&f->handover, 0, __ATOMIC_ACQ_REL);
    if (other <= 0) { /* handed over before (a failed connect): a new pair under fd's number */
        int sv[2];
        int sotype = f->kind == FD_DGRAM ? SOCK_DGRAM : SOCK_STREAM;
        if (REAL(socketpair)(AF_UNIX, sotype | SOCK_CLOEXEC, 0, sv) != 0)
            return errno;
        int fl = REAL(fcntl)(fd, F_GETFL), fdfl = REAL(fcntl)(fd, F_GETFD);
        int r = REAL(dup3)(sv[0], fd, (fdfl > 0 && (fdfl & FD_CLOEXEC)) ? O_CLOEXEC : 0);
        REAL(close)(sv[0]);
        if (r < 0) {
            REAL(close)(sv[1]);
            return errno;
        }
        if (fl >= 0)
            REAL(fcntl)(fd, F_SETFL, fl);
        other = sv[1];
    }
    llft_channel_msg_t m = {.kind = kind, .port = f->port, .family = f->family, .type = type};
    memcpy(m.addr, f->addr, sizeof m.addr);
    int err = llft_channel_send(&m, other);
    REAL(close)(other);
    return err;
}

static int make_socketpair(void *a, int *sv)
{
    const int *dtp = a;
    return REAL(socketpair)(dtp[0], dtp[1], dtp[2], sv);
}

EXPORT int socketpair(int domain, int type, int protocol, int sv[2])
{
    int dtp[3] = {domain, type, protocol};
    return llft_ipc_pair(make_socketpair, dtp, type & SOCK_CLOEXEC, sv);
}

/* ---- addresses ------------------------------------------------------ */

static socklen_t make_sockaddr(int family, uint16_t port_host, const uint8_t *addr, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port_host);
        memcpy(&a->sin6_addr, addr, 16);
        return sizeof *a;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)out;
    a->sin_family = AF_INET;
    a->sin_port = htons(port_host);
    memcpy(&a->sin_addr, addr, 4);
    return sizeof *a;
}

int llft_give_addr(struct sockaddr *addr, socklen_t *len, int family, uint16_t port_host, const uint8_t *a)
{
    if (!addr || !len)
        return 0;
    struct sockaddr_storage ss;
    socklen_t n = make_sockaddr(family, port_host, a, &ss);
    memcpy(addr, &ss, *len < n ? *len : n);
    *len = n;
    return 0;
}

static inline int fd_socktype(int fd) { return llft_fd_kind(fd) == FD_DGRAM ? SOCK_DGRAM : SOCK_STREAM; }

/* ---- bind / listen -------------------------------------------------- */

/* Ports of bind() to port 0 (and of a UDP socket's first send) come from
 * LLFT_EPHEMERAL_FIRST on, as Linux's do.  Threads bind in any order, so
 * the primary records each one's port and a backup takes the recorded
 * one.  The replica's first process numbers its ports itself (a backup
 * that takes over numbers on past every port it replayed); a process it
 * forked would count on from its parent's count, and take its parent's
 * ports, so it asks the controller, which knows every port the replica's
 * processes hold (BIND_PORT's aux says so). */
#define PORT_FROM_CONTROLLER 1u
static uint32_t next_ephemeral;

/* The port the controller gives this forked process for a socket of
 * type, or 0 if it gives none. */
static uint16_t port_from_controller(int family, int type)
{
    int sv[2];
    if (REAL(socketpair)(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 0;
    llft_channel_msg_t m = {.kind = LLFT_CHAN_PORT, .family = (uint16_t)family, .type = (uint32_t)type};
    int err = llft_channel_send(&m, sv[1]);
    REAL(close)(sv[1]);
    uint32_t port = 0;
    if (!err)
        err = llft_read_exact(sv[0], &port, sizeof port, 0);
    REAL(close)(sv[0]);
    if (err || port < LLFT_EPHEMERAL_FIRST + LLFT_EPHEMERAL_OWN || port >= LLFT_EPHEMERAL_FIRST + LLFT_EPHEMERAL_COUNT)
        return 0;
    return (uint16_t)port;
}

static uint16_t ephemeral_port(int family, int type)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    llft_rec_t e;
    if (role == LLFT_ROLE_BACKUP) {
        if (!llft_replay_next(t, LLFT_OP_BIND_PORT, &e)) {
            if (e.aux == PORT_FROM_CONTROLLER)
                return (uint16_t)e.val;
            uint32_t taken = (uint32_t)e.val + 1, cur = __atomic_load_n(&next_ephemeral, __ATOMIC_RELAXED);
            while (cur < taken &&
                   !__atomic_compare_exchange_n(&next_ephemeral, &cur, taken, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
            return (uint16_t)(LLFT_EPHEMERAL_FIRST + (uint32_t)e.val % LLFT_EPHEMERAL_OWN);
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (llft_ctl->stream_id) {
        uint16_t port = port_from_controller(family, type);
        if (role == LLFT_ROLE_PRIMARY)   /* (0 too: the backups' bind fails as the primary's did) */
            llft_record_aux(t, LLFT_OP_BIND_PORT, 0, 0, 0, 0, port, PORT_FROM_CONTROLLER);
        return port;
    }
    uint32_t n = __atomic_fetch_add(&next_ephemeral, 1, __ATOMIC_RELAXED);
    if (role == LLFT_ROLE_PRIMARY)
        llft_record(t, LLFT_OP_BIND_PORT, 0, 0, 0, 0, n);
    return (uint16_t)(LLFT_EPHEMERAL_FIRST + n % LLFT_EPHEMERAL_OWN);
}

static int publish_listener(int fd, uint32_t type);

/* Whether this replica listens on port already (TCP), or has bound it
 * (UDP): two sockets on one port is EADDRINUSE, as the kernel says. */
static int port_in_use(uint16_t port, int family, int type)
{
    llft_listener_t l[LLFT_MAX_LISTENERS];
    int n = llft_listeners_read(llft_ctl, (uint32_t)type, l, LLFT_MAX_LISTENERS);
    for (int i = 0; i < n; i++)
        if (l[i].port == port && l[i].family == family)
            return 1;
    return 0;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    int kind = llft_fd_kind(fd);
    if (kind != FD_VSOCK && kind != FD_DGRAM)
        return REAL(bind)(fd, addr, len);
    struct llft_fd *f = &llft_fds[fd];
    uint16_t port;
    uint8_t a[16] = {0};
    if (!addr) {
        errno = EFAULT;
        return -1;
    }
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        port = ntohs(((const struct sockaddr_in *)addr)->sin_port);
        memcpy(a, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    } else if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        port = ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
        memcpy(a, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
    } else {
        errno = EAFNOSUPPORT;
        return -1;
    }
    if (f->port != 0) { /* bound already */
        errno = EINVAL;
        return -1;
    }
    int any_port = port == 0;
    if (any_port) {
        port = ephemeral_port(addr->sa_family, fd_socktype(fd));
        if (port == 0) {
            errno = EADDRNOTAVAIL;   /* (the controller gave none: Linux's answer when its range is used up) */
            return -1;
        }
    }
    else if (port_in_use(port, addr->sa_family, fd_socktype(fd))) {
        errno = EADDRINUSE;
        return -1;
    }
    f->port = port;
    f->family = (uint8_t)addr->sa_family;
    memcpy(f->addr, a, sizeof a);
    if (kind == FD_DGRAM) /* a bound UDP socket receives at once: no listen() */
        return publish_listener(fd, SOCK_DGRAM | (any_port ? LLFT_LISTENER_ANY_PORT : 0));
    return 0;
}

/* Hands the socket's other end to the controller and lists the port. */
static int publish_listener(int fd, uint32_t type)
{
    const struct llft_fd *f = &llft_fds[fd];
    int err = llft_hand_over(fd, (type & 0xff) == SOCK_DGRAM ? LLFT_CHAN_DGRAM : LLFT_CHAN_LISTEN, type);
    if (err) {
        llft_log("llft: port %u cannot be served: the controller's channel failed (error %d)", f->port, err);
        errno = EADDRNOTAVAIL;
        return -1;
    }
    if (llft_listener_publish(llft_ctl, f->port, f->family, type, f->addr) != 0)
        llft_log("llft: more than %d listening ports; port %u is not listed", LLFT_MAX_LISTENERS, f->port);
    return 0;
}

void llft_listener_closed(int fd)
{
    if (llft_ctl)
        llft_listener_close(llft_ctl, llft_fds[fd].port, llft_fds[fd].family, (uint32_t)fd_socktype(fd));
}

EXPORT int listen(int fd, int backlog)
{
    if (llft_fd_kind(fd) == FD_LISTEN)
        return 0; /* listening already: a new backlog */
    if (llft_fd_kind(fd) != FD_VSOCK)
        return REAL(listen)(fd, backlog);
    struct llft_fd *f = &llft_fds[fd];
    if (f->port == 0) { /* listen() on an unbound socket binds an ephemeral port */
        struct sockaddr_storage ss;
        static const uint8_t any[16];
        socklen_t n = make_sockaddr(f->family ? f->family : AF_INET, 0, any, &ss);
        if (bind(fd, (struct sockaddr *)&ss, n) != 0)
            return -1;
    }
    if (publish_listener(fd, SOCK_STREAM) != 0)
        return -1;
    f->kind = FD_LISTEN;
    return 0;
}

/* ---- accept --------------------------------------------------------- */

static void conn_setup(int fd, int lfd, const llft_conn_header_t *h)
{
    llft_fd_set(fd, FD_CONN);
    llft_fds[fd].family = llft_fds[lfd].family;
    llft_fds[fd].port = llft_fds[lfd].port;
    memcpy(llft_fds[fd].addr, llft_fds[lfd].addr, 16);
    llft_fds[fd].peer = *h;
}

int llft_give_peer(struct sockaddr *addr, socklen_t *len, const llft_conn_header_t *h)
{
    return llft_give_addr(addr, len, h->family, ntohs(h->port), h->addr);
}

/* The next connection the controller handed to listening socket lfd: one
 * byte with the connection's fd.  As accept4 would: EAGAIN when lfd does
 * not block and none is there, flags applied to the connection. */
static int take_conn(int lfd, int flags)
{
    char byte;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } c;
    struct iovec v = {&byte, 1};
    for (;;) {
        struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof c.buf};
        ssize_t r = REAL(recvmsg)(lfd, &m, (flags & SOCK_CLOEXEC) ? MSG_CMSG_CLOEXEC : 0);
        if (r < 0)
            return -1;
        if (r == 0) { /* the controller is gone */
            errno = ECONNABORTED;
            return -1;
        }
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        if (!h || h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS || h->cmsg_len != CMSG_LEN(sizeof(int)))
            continue; /* no connection with it: nothing to accept */
        int fd;
        memcpy(&fd, CMSG_DATA(h), sizeof fd);
        if (flags & SOCK_NONBLOCK) {
            int fl = REAL(fcntl)(fd, F_GETFL);
            REAL(fcntl)(fd, F_SETFL, fl | O_NONBLOCK);
        }
        return fd;
    }
}

/* Backup: the next connection the controller made, however the listening
 * socket is set to block. */
static int accept_blocking(int lfd, int flags)
{
    for (;;) {
        int fd = take_conn(lfd, flags);
        if (fd >= 0 || (errno != EAGAIN && errno != EINTR))
            return fd;
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        REAL(poll)(&p, 1, 100);
    }
}

static int accept_replay(struct llft_thread *t, int lfd, struct sockaddr *addr, socklen_t *len, int flags,
                         int *res);
#define ACCEPT_AGAIN (-2)   /* a census interrupted the wait: nothing taken, the accept starts again */

static int accept_primary(struct llft_thread *t, int lfd, struct sockaddr *addr, socklen_t *len, int flags);

/* Backup: connections that reached a listener here before the one the
 * primary accepted next.  Every replica gets the same connections, but not
 * always in one order: those of two gateways interleave as messaging
 * delivered them to each member.  Kept (parked above the numbers the
 * primary's fds have) until the accept the primary made of each. */
#define EARLY_MAX 256
static struct early_conn {
    int lfd, fd;
    llft_conn_header_t h;
} early[EARLY_MAX];
static int nearly;
static uint32_t early_lock;

/* The kept connection conn_id of listener lfd (any, the first kept, if
 * conn_id is 0), or -1. */
static int take_early(int lfd, uint64_t conn_id, llft_conn_header_t *h)
{
    int fd = -1;
    if (!__atomic_load_n(&nearly, __ATOMIC_RELAXED))
        return -1;
    spin_lock(&early_lock);
    for (int i = 0; i < nearly; i++)
        if (early[i].lfd == lfd && (!conn_id || early[i].h.conn_id == conn_id)) {
            fd = early[i].fd;
            *h = early[i].h;
            memmove(&early[i], &early[i + 1], (size_t)(nearly - i - 1) * sizeof early[0]);
            nearly--;
            break;
        }
    spin_unlock(&early_lock);
    return fd;
}

/* A forked process starts with none: its parent's are its parent's. */
void llft_early_forget(void)
{
    for (int i = 0; i < nearly; i++)
        REAL(close)(early[i].fd);
    nearly = 0;
}

static int keep_early(int lfd, int fd, const llft_conn_header_t *h)
{
    fd = llft_park_fd(fd); /* (system calls: not under the lock) */
    spin_lock(&early_lock);
    int ok = nearly < EARLY_MAX;
    if (ok)
        early[nearly++] = (struct early_conn){.lfd = lfd, .fd = fd, .h = *h};
    spin_unlock(&early_lock);
    return ok;
}

/* A kept connection gets the blocking mode this accept asks for. */
static void accept_mode(int fd, int flags)
{
    int fl = REAL(fcntl)(fd, F_GETFL);
    if (fl >= 0)
        REAL(fcntl)(fd, F_SETFL, (flags & SOCK_NONBLOCK) ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

static int accept_common(int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        int res;
        if (!accept_replay(t, lfd, addr, len, flags, &res))
            return res;
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        llft_transfer_begin(lfd);
        int fd = accept_primary(t, lfd, addr, len, flags);
        llft_transfer_returned(lfd);
        llft_transfer_end(lfd);
        if (fd == ACCEPT_AGAIN)
            return LLFT_AGAIN(t, accept_common(lfd, addr, len, flags));
        return fd;
    }
    if (UNLIKELY(llft_forked_from))
        llft_forked_use(lfd, "accepted a client connection");
    return REAL(accept4)(lfd, addr, len, flags);
}

static int accept_primary(struct llft_thread *t, int lfd, struct sockaddr *addr, socklen_t *len, int flags)
{
    llft_conn_header_t h = {0}; /* conn_id 0: not read yet (ids start at 1) */
    /* A backup that has just taken over may hold connections kept
     * while it replayed: they came first. */
    int fd = take_early(lfd, 0, &h);
    if (fd >= 0) {
        accept_mode(fd, flags);
        int moved = REAL(fcntl)(fd, (flags & SOCK_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 0);
        if (moved >= 0) { /* the lowest free number, as the kernel's accept gives */
            REAL(close)(fd);
            fd = moved;
        }
    } else {
        fd = LLFT_BLOCKING(t, take_conn(lfd, flags));
        if (llft_kicked(t, fd))
            return ACCEPT_AGAIN;
    }
    if (fd >= 0 && !h.conn_id && llft_read_exact(fd, &h, sizeof h, 0) != 0) {
        REAL(close)(fd); /* the controller gave up on it before saying who it is */
        fd = -1;
        errno = ECONNABORTED;
    }
    if (fd < 0) {
        int err = errno;
        llft_record(t, LLFT_OP_ACCEPT, 0, 0, -1, err, 0);
        errno = err;
        return -1;
    }
    conn_setup(fd, lfd, &h);
    struct llft_obj *o = llft_obj_get(llft_fd_object(lfd), t);
    llft_record_data(t, LLFT_OP_ACCEPT, o->id, llft_obj_take_turn(o), fd, 0, &h, sizeof h);
    llft_fd_numbered(t, fd);
    llft_give_peer(addr, len, &h);
    return fd;
}

/* Backup: accept the connection the primary accepted, under its fd number. */
static int accept_replay(struct llft_thread *t, int lfd, struct sockaddr *addr, socklen_t *len, int flags,
                         int *res)
{
    {
        llft_rec_t e;
        if (llft_replay_next(t, LLFT_OP_ACCEPT, &e))
            return LLFT_PROMOTED;
        if (e.ret < 0) {
            errno = e.err;
            *res = -1;
            return 0;
        }
        llft_conn_header_t want, h;
        llft_replay_data(t, &want, sizeof want);
        struct turnstile *ts = llft_turn_wait(t, &e);
        /* Under --fork replicate the connection comes to this process's
         * inbox, whichever listener it was for (fork_stream.c). */
        int inbox = __atomic_load_n(&llft_inbox, __ATOMIC_ACQUIRE);
        int from = inbox >= 0 ? inbox : lfd, key = inbox >= 0 ? -1 : lfd;
        int fd = take_early(key, want.conn_id, &h);
        if (fd >= 0)
            accept_mode(fd, flags);
        while (fd < 0) {
            fd = accept_blocking(from, flags);
            if (fd < 0 || llft_read_exact(fd, &h, sizeof h, 0) != 0)
                llft_diverge(t, LLFT_OP_ACCEPT, &e, LLFT_EXIT_DIVERGED, "no connection to accept here (error %d)",
                             errno);
            if (h.conn_id == want.conn_id)
                break;
            if (!keep_early(key, fd, &h))
                llft_diverge(t, LLFT_OP_ACCEPT, &e, LLFT_EXIT_DIVERGED,
                             "%d connections came here before connection %llu, which the primary accepted",
                             EARLY_MAX, (unsigned long long)want.conn_id);
            fd = -1;
        }
        /* Parked until its number's turn, after the listener's: each is
         * waited for alone (an accept that held its listener's turn while
         * it waited for the fd numbers' could wait for another accept). */
        fd = llft_park_fd(fd);
        llft_turn_done(t, ts, llft_fd_object(lfd), e.turn);
        fd = llft_place_numbered(t, fd, flags & SOCK_CLOEXEC);
        conn_setup(fd, lfd, &h);
        llft_give_peer(addr, len, &h);
        *res = fd;
        return 0;
    }
}

SWITCHING(int, accept4, (int fd, struct sockaddr *addr, socklen_t *len, int flags), (fd, addr, len, flags))
{
    if (llft_fd_kind(fd) != FD_LISTEN)
        return REAL(accept4)(fd, addr, len, flags);
    return accept_common(fd, addr, len, flags);
}

SWITCHING(int, accept, (int fd, struct sockaddr *addr, socklen_t *len), (fd, addr, len))
{
    if (llft_fd_kind(fd) != FD_LISTEN)
        return REAL(accept)(fd, addr, len);
    return accept_common(fd, addr, len, 0);
}

/* ---- the rest of the socket API on virtual sockets ------------------- */

SWITCHING(int, connect, (int fd, const struct sockaddr *addr, socklen_t len), (fd, addr, len))
{
    int kind = llft_fd_kind(fd);
    if (LIKELY(!virtual_kind(kind)))
        return REAL(connect)(fd, addr, len);
    if (kind == FD_DGRAM)
        return llft_dgram_connect(fd, addr, len);
    return llft_connect(fd, addr, len);
}

EXPORT int getsockname(int fd, struct sockaddr *restrict addr, socklen_t *restrict len)
{
    int kind = llft_fd_kind(fd);
    if (!virtual_kind(kind))
        return REAL(getsockname)(fd, addr, len);
    const struct llft_fd *f = &llft_fds[fd];
    return llft_give_addr(addr, len, f->family ? f->family : AF_INET, f->port, f->addr);
}

EXPORT int getpeername(int fd, struct sockaddr *restrict addr, socklen_t *restrict len)
{
    int kind = llft_fd_kind(fd);
    if (!virtual_kind(kind))
        return REAL(getpeername)(fd, addr, len);
    if (kind != FD_CONN && !(kind == FD_DGRAM && llft_fds[fd].peer.family)) {
        errno = ENOTCONN;
        return -1;
    }
    return llft_give_peer(addr, len, &llft_fds[fd].peer);
}

/* TCP and IP options mean nothing on the AF_UNIX socket underneath: accept
 * them, as a TCP socket would. */
EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    if (!virtual_kind(llft_fd_kind(fd)))
        return REAL(setsockopt)(fd, level, name, val, len);
    if (level != SOL_SOCKET)
        return 0;
    int r = REAL(setsockopt)(fd, level, name, val, len);
    if (r != 0 && (errno == ENOPROTOOPT || errno == EOPNOTSUPP || errno == EINVAL))
        return 0;
    return r;
}

EXPORT int getsockopt(int fd, int level, int name, void *restrict val, socklen_t *restrict len)
{
    if (!virtual_kind(llft_fd_kind(fd)))
        return REAL(getsockopt)(fd, level, name, val, len);
    int v;
    if (level == SOL_SOCKET && name == SO_DOMAIN)
        v = llft_fds[fd].family ? llft_fds[fd].family : AF_INET;
    else if (level == SOL_SOCKET && name == SO_PROTOCOL)
        v = llft_fd_kind(fd) == FD_DGRAM ? IPPROTO_UDP : IPPROTO_TCP;
    else if (level == SOL_SOCKET && name == SO_ERROR) /* a non-blocking connect's result, reported once */
        v = __atomic_exchange_n(&llft_fds[fd].so_error, 0, __ATOMIC_RELAXED);
    else if (level == SOL_SOCKET)
        return REAL(getsockopt)(fd, level, name, val, len);
    else
        v = (level == IPPROTO_TCP && name == TCP_NODELAY) ? 1 : 0;
    if (val && len && *len >= sizeof v) {
        memcpy(val, &v, sizeof v);
        *len = sizeof v;
    }
    return 0;
}
