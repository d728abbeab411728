/* Consistent Socket Communication Service, the data path: reads and writes
 * on the program's connections, pipes, socketpairs, eventfds and timerfds.
 *
 * The primary records each call's result: a byte count (the bytes
 * themselves are in the connection's stream, which every replica receives),
 * EAGAIN, EOF or an error; a counter fd's 8-byte value.  Transfers take a
 * turn on the fd, so reads of one fd happen in the primary's order.  A
 * backup moves exactly the recorded number of bytes through its own socket,
 * waiting for them if need be, and returns the primary's result.  Files
 * (FD_LOCAL) pass straight through. */
#include "fdtable.h"

#include <errno.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

DEFINE_REAL(read)
DEFINE_REAL(readv)
DEFINE_REAL(recv)
DEFINE_REAL(recvfrom)
DEFINE_REAL(recvmsg)
DEFINE_REAL(write)
DEFINE_REAL(writev)
DEFINE_REAL(send)
DEFINE_REAL(sendto)
DEFINE_REAL(sendmsg)

int64_t llft_recorded_read(int fd, void *buf, size_t n); /* wrap_random.c */

static inline int recorded_kind(int kind) { return kind == FD_CONN || kind == FD_IPC || kind == FD_COUNTER; }

/* ---- primary -------------------------------------------------------- */

/* Threads of the program that talk through a pipe or socketpair of its
 * own (a worker's notify pipe): a reader may get bytes whose writer has
 * not recorded its write yet.  Were the primary to die between
 * the two records, a backup would hold the read without the write: its
 * reader would wait for bytes no replayed write brings, and since a read
 * must end before a takeover, no backup could take over.  So at the
 * primary a reader records only once the writes under way on its channel
 * are recorded; at most WRITES_WAIT_MS, since a writer blocked on a full
 * pipe may need more reads than this one.  Counted by channel, in a small
 * table (channels that share a count only wait for each other).  (An
 * eventfd's read replays the count recorded, waiting for no write.) */
#define CHANNEL_SLOTS 4096
#define WRITES_WAIT_MS 20
static uint32_t channel_writes[CHANNEL_SLOTS];

static inline uint32_t *writes_on(int fd)
{
    uint32_t c = (unsigned)fd < LLFT_FD_MAX ? llft_fds[fd].channel : 0;
    return c ? &channel_writes[c % CHANNEL_SLOTS] : NULL;
}

static inline void write_begin(int fd)
{
    llft_transfer_begin(fd);
    uint32_t *w = writes_on(fd);
    if (w)
        __atomic_add_fetch(w, 1, __ATOMIC_SEQ_CST);
}

static ssize_t record_transfer(struct llft_thread *t, uint16_t op, int fd, ssize_t r, int err, const void *buf)
{
    uint32_t *w = writes_on(fd);
    if (w && op == LLFT_OP_READ && r > 0)
        llft_wait_zero(w, WRITES_WAIT_MS);
    if (r > 0) {
        struct llft_obj *o = llft_obj_get(llft_fd_object(fd), t);
        uint64_t turn = llft_obj_take_turn(o);
        if (op == LLFT_OP_READ && llft_fd_kind(fd) == FD_COUNTER && r == 8)
            llft_record_data_aux(t, op, o->id, turn, r, 0, buf, 8, (uint32_t)fd);
        else
            llft_record_aux(t, op, o->id, turn, r, 0, 0, (uint32_t)fd);
    } else {
        llft_record_aux(t, op, 0, 0, r, r < 0 ? err : 0, 0, (uint32_t)fd);
    }
    llft_transfer_end(fd);
    if (w && op == LLFT_OP_WRITE)
        __atomic_sub_fetch(w, 1, __ATOMIC_SEQ_CST);
    if (r < 0)
        errno = err;
    return r;
}

/* A transfer a census interrupted (nothing moved): it starts again. */
static void transfer_cancel(uint16_t op, int fd)
{
    uint32_t *w = writes_on(fd);
    llft_transfer_end(fd);
    if (w && op == LLFT_OP_WRITE)
        __atomic_sub_fetch(w, 1, __ATOMIC_SEQ_CST);
}

/* A primary's real transfer of op on fd: its result; or, interrupted by a
 * census (nothing moved), the wrapper's call `again`, made from its entry. */
#define PRIMARY_TRANSFER(t, op, fd, real_call, again)                               \
    ({                                                                              \
        if (((op) == LLFT_OP_WRITE || (op) == LLFT_OP_SENDFILE) && llft_fd_kind(fd) == FD_CONN) \
            llft_wait_committed(t); /* a client sees nothing a failover undoes */  \
        if ((op) == LLFT_OP_WRITE)                                                  \
            write_begin(fd);                                                        \
        else                                                                        \
            llft_transfer_begin(fd);                                                \
        ssize_t r_ = LLFT_BLOCKING(t, real_call);                                   \
        llft_transfer_returned(fd);                                                 \
        if (llft_kicked(t, r_)) {                                                   \
            transfer_cancel(op, fd);                                                \
            return LLFT_AGAIN(t, again);                                            \
        }                                                                           \
        r_;                                                                         \
    })

/* ---- backup --------------------------------------------------------- */

static size_t iov_total(const struct iovec *iov, int n)
{
    size_t s = 0;
    for (int i = 0; i < n; i++)
        s += iov[i].iov_len;
    return s;
}

/* The primary's record of a transfer on fd into *e, its result into *res
 * (and errno, if it failed): 0, or LLFT_PROMOTED (see below). */
int llft_replay_head(struct llft_thread *t, uint16_t op, int fd, llft_rec_t *e, ssize_t *res)
{
    if (llft_replay_next(t, op, e))
        return LLFT_PROMOTED;
    if (UNLIKELY(e->aux != (uint32_t)fd))
        llft_diverge(t, op, e, LLFT_EXIT_DIVERGED, "used fd %d where the primary used fd %u", fd, e->aux);
    *res = (ssize_t)e->ret;
    if (e->ret < 0)
        errno = e->err;
    return 0;
}

/* Replays one transfer of the primary's: exactly its byte count through
 * this replica's fd, into or out of the caller's buffers.  The result goes
 * to *res; LLFT_PROMOTED means this replica has just taken over.  The end
 * of a pipe of the program's own is waited for as the primary's read
 * waited: a daemon's parent that reads its child's close as the word that
 * it is up (dnsmasq) leaves only once its own child has said so. */
static int replay_transfer(struct llft_thread *t, uint16_t op, int fd, const struct iovec *iov, int niov,
                           int peek, ssize_t *res)
{
    llft_rec_t e;
    if (llft_replay_head(t, op, fd, &e, res))
        return LLFT_PROMOTED;
    if (e.ret == 0 && op == LLFT_OP_READ && llft_fd_kind(fd) == FD_IPC) {
        int err = llft_await_end(fd);
        if (UNLIKELY(err))
            llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "the primary read the end of this pipe or socketpair "
                         "here, where it is not at its end (error %d)", err);
    }
    if (e.ret <= 0)
        return 0;
    size_t want = (size_t)e.ret;
    if (UNLIKELY(want > iov_total(iov, niov)))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "buffer of %zu bytes where the primary moved %zu",
                     iov_total(iov, niov), want);
    uint8_t value[8];
    int counter = op == LLFT_OP_READ && llft_fd_kind(fd) == FD_COUNTER && e.nslots > 1;
    if (counter)
        llft_replay_data(t, value, sizeof value);
    struct turnstile *ts = llft_turn_wait(t, &e);
    int err = 0;
    size_t left = counter ? 0 : want;
    if (counter) /* writes coalesce differently here: drain what is there, never wait */
        llft_drain_counter(fd);
    for (int i = 0; i < niov && left && !err; i++) {
        size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
        err = op == LLFT_OP_READ ? llft_read_exact(fd, iov[i].iov_base, n, peek)
                                 : llft_write_exact(fd, iov[i].iov_base, n);
        left -= n;
        if (peek)
            break; /* a peek fills the first buffer only */
    }
    llft_turn_done(t, ts, llft_fd_object(fd), e.turn);
    if (UNLIKELY(err))
        llft_diverge(t, op, &e, LLFT_EXIT_DIVERGED, "could not %s the %zu bytes the primary did here (error %d)",
                     op == LLFT_OP_READ ? "read" : "write", want, err);
    if (counter) /* the kernel's count here may differ: hand out the primary's */
        memcpy(iov[0].iov_base, value, sizeof value);
    return 0;
}

/* At a backup, replay and return; fall through as the primary if this
 * replica has just taken over. */
#define REPLAY_OR_PROMOTE(role, call)                                               \
    if (UNLIKELY((role) == LLFT_ROLE_BACKUP)) {                                     \
        ssize_t res_;                                                               \
        if (!(call))                                                                \
            return res_;                                                            \
        (role) = LLFT_ROLE_PRIMARY;                                                 \
    }

/* The role for a transfer on fd, or OFF when it is not recorded. */
static inline int transfer_mode(int fd, struct llft_thread **t)
{
    int kind = llft_fd_kind(fd);
    if (!recorded_kind(kind))
        return LLFT_ROLE_OFF;
    int role = llft_call_mode(t);
    if (UNLIKELY(role == LLFT_ROLE_OFF && kind == FD_CONN && llft_forked_from))
        llft_forked_use(fd, "used a client connection");
    return role;
}

/* recvfrom/recvmsg source address: the client for a connection (as TCP
 * reports it through getpeername, which is ours), none for a pipe. */
static void no_peer_address(int fd, struct sockaddr *addr, socklen_t *len)
{
    if (!addr || !len)
        return;
    if (llft_fd_kind(fd) == FD_CONN)
        getpeername(fd, addr, len);
    else
        *len = 0;
}

/* ---- reads ---------------------------------------------------------- */

SWITCHING(ssize_t, read, (int fd, void *buf, size_t n), (fd, buf, n))
{
    int kind = llft_fd_kind(fd);
    if (LIKELY(kind == FD_LOCAL))
        return REAL(read)(fd, buf, n);
    if (kind == FD_RANDOM || kind == FD_PROCFS || kind == FD_CHILD_IPC)
        return llft_recorded_read(fd, buf, n);
    if (UNLIKELY(kind == FD_DGRAM))
        return llft_dgram_recv(fd, buf, n, 0, NULL, NULL);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    struct iovec v = {buf, n};
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_READ, fd, &v, 1, 0, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_READ, fd, REAL(read)(fd, buf, n), read_call(fd, buf, n));
        return record_transfer(t, LLFT_OP_READ, fd, r, errno, buf);
    }
    return REAL(read)(fd, buf, n);
}

/* A read into the first non-empty buffer: short, as a read may be. */
static ssize_t recorded_readv(int fd, const struct iovec *iov, int niov)
{
    for (int i = 0; i < niov; i++)
        if (iov[i].iov_len)
            return llft_recorded_read(fd, iov[i].iov_base, iov[i].iov_len);
    return 0;
}

SWITCHING(ssize_t, readv, (int fd, const struct iovec *iov, int niov), (fd, iov, niov))
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_readv(fd, iov, niov);
    if (UNLIKELY(llft_fd_kind(fd) == FD_CHILD_IPC))
        return recorded_readv(fd, iov, niov);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_READ, fd, iov, niov, 0, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_READ, fd, REAL(readv)(fd, iov, niov), readv_call(fd, iov, niov));
        return record_transfer(t, LLFT_OP_READ, fd, r, errno, niov ? iov[0].iov_base : NULL);
    }
    return REAL(readv)(fd, iov, niov);
}

SWITCHING(ssize_t, recv, (int fd, void *buf, size_t n, int flags), (fd, buf, n, flags))
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_recv(fd, buf, n, flags, NULL, NULL);
    if (UNLIKELY(llft_fd_kind(fd) == FD_CHILD_IPC && !(flags & MSG_PEEK)))
        return llft_recorded_read(fd, buf, n);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    struct iovec v = {buf, n};
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_READ, fd, &v, 1, flags & MSG_PEEK, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_READ, fd, REAL(recv)(fd, buf, n, flags), recv_call(fd, buf, n, flags));
        return record_transfer(t, LLFT_OP_READ, fd, r, errno, buf);
    }
    return REAL(recv)(fd, buf, n, flags);
}

SWITCHING(ssize_t, recvfrom,
          (int fd, void *restrict buf, size_t n, int flags, struct sockaddr *restrict addr, socklen_t *restrict len),
          (fd, buf, n, flags, addr, len))
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_recv(fd, buf, n, flags, addr, len);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    if (role == LLFT_ROLE_OFF)
        return REAL(recvfrom)(fd, buf, n, flags, addr, len);
    ssize_t r;
    struct iovec v = {buf, n};
    if (role == LLFT_ROLE_PRIMARY || replay_transfer(t, LLFT_OP_READ, fd, &v, 1, flags & MSG_PEEK, &r)) {
        r = PRIMARY_TRANSFER(t, LLFT_OP_READ, fd, REAL(recvfrom)(fd, buf, n, flags, NULL, NULL),
                             recvfrom_call(fd, buf, n, flags, addr, len));
        r = record_transfer(t, LLFT_OP_READ, fd, r, errno, buf);
    }
    if (r >= 0)
        no_peer_address(fd, addr, len);
    return r;
}

SWITCHING(ssize_t, recvmsg, (int fd, struct msghdr *msg, int flags), (fd, msg, flags))
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_recvmsg(fd, msg, flags);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    if (role == LLFT_ROLE_OFF)
        return REAL(recvmsg)(fd, msg, flags);
    ssize_t r;
    int fds_too = msg->msg_controllen && !(flags & MSG_PEEK); /* descriptors may come: fd_passing.c */
    if (role == LLFT_ROLE_BACKUP && fds_too && !llft_replay_recvmsg_fds(t, fd, msg, flags, &r)) {
        /* (what came with the bytes is this replica's own) */
    } else if (role == LLFT_ROLE_BACKUP && !fds_too &&
               !replay_transfer(t, LLFT_OP_READ, fd, msg->msg_iov, (int)msg->msg_iovlen, flags & MSG_PEEK, &r)) {
        msg->msg_controllen = 0;
        msg->msg_flags = 0;
    } else {
        r = PRIMARY_TRANSFER(t, LLFT_OP_READ, fd, REAL(recvmsg)(fd, msg, flags), recvmsg_call(fd, msg, flags));
        r = record_transfer(t, LLFT_OP_READ, fd, r, errno, msg->msg_iovlen ? msg->msg_iov[0].iov_base : NULL);
        if (r > 0 && fds_too)
            llft_number_received_fds(t, msg);
    }
    if (r >= 0)
        no_peer_address(fd, msg->msg_name, &msg->msg_namelen);
    return r;
}

/* ---- writes --------------------------------------------------------- */

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
    int kind = llft_fd_kind(fd);
    if (LIKELY(kind == FD_LOCAL))
        return REAL(write)(fd, buf, n);
    if (UNLIKELY(kind == FD_DGRAM))
        return llft_dgram_send(fd, buf, n, 0, NULL, 0);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    struct iovec v = {(void *)buf, n};
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_WRITE, fd, &v, 1, 0, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_WRITE, fd, REAL(write)(fd, buf, n), write(fd, buf, n));
        return record_transfer(t, LLFT_OP_WRITE, fd, r, errno, buf);
    }
    return REAL(write)(fd, buf, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int niov)
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_writev(fd, iov, niov);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_WRITE, fd, iov, niov, 0, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_WRITE, fd, REAL(writev)(fd, iov, niov), writev(fd, iov, niov));
        return record_transfer(t, LLFT_OP_WRITE, fd, r, errno, NULL);
    }
    return REAL(writev)(fd, iov, niov);
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_send(fd, buf, n, flags, NULL, 0);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    struct iovec v = {(void *)buf, n};
    REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_WRITE, fd, &v, 1, 0, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_WRITE, fd, REAL(send)(fd, buf, n, flags | MSG_NOSIGNAL),
                                     send(fd, buf, n, flags));
        return record_transfer(t, LLFT_OP_WRITE, fd, r, errno, buf);
    }
    return REAL(send)(fd, buf, n, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t len)
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_send(fd, buf, n, flags, addr, len);
    if (recorded_kind(llft_fd_kind(fd)))
        return send(fd, buf, n, flags); /* a connected stream ignores the address */
    return REAL(sendto)(fd, buf, n, flags, addr, len);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    if (UNLIKELY(llft_fd_kind(fd) == FD_DGRAM))
        return llft_dgram_sendmsg(fd, msg, flags);
    LLFT_CALL(t);
    int role = transfer_mode(fd, &t);
    if (msg->msg_controllen) { /* descriptors may go with the bytes: fd_passing.c */
        REPLAY_OR_PROMOTE(role, llft_replay_sendmsg_fds(t, fd, msg, flags, &res_))
    } else {
        REPLAY_OR_PROMOTE(role, replay_transfer(t, LLFT_OP_WRITE, fd, msg->msg_iov, (int)msg->msg_iovlen, 0, &res_))
    }
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_WRITE, fd, REAL(sendmsg)(fd, msg, flags | MSG_NOSIGNAL),
                                     sendmsg(fd, msg, flags));
        return record_transfer(t, LLFT_OP_WRITE, fd, r, errno, NULL);
    }
    return REAL(sendmsg)(fd, msg, flags);
}

/* ---- sendfile ------------------------------------------------------- */
/* The bytes come from a file of the program's, which every replica has
 * its own copy of: the primary records the count, and a backup moves
 * exactly as many from its own file (at the same offset, or its own file
 * position, which advances as the primary's did) through its own socket. */

DEFINE_REAL(sendfile)

static int replay_sendfile(struct llft_thread *t, int out, int in, off_t *off, size_t count, ssize_t *res)
{
    llft_rec_t e;
    if (llft_replay_head(t, LLFT_OP_SENDFILE, out, &e, res))
        return LLFT_PROMOTED;
    if (e.ret <= 0)
        return 0;
    if (UNLIKELY((size_t)e.ret > count))
        llft_diverge(t, LLFT_OP_SENDFILE, &e, LLFT_EXIT_DIVERGED, "asked for %zu bytes where the primary sent %lld",
                     count, (long long)e.ret);
    struct turnstile *ts = llft_turn_wait(t, &e);
    int err = llft_sendfile_exact(out, in, off, (size_t)e.ret);
    llft_turn_done(t, ts, llft_fd_object(out), e.turn);
    if (UNLIKELY(err))
        llft_diverge(t, LLFT_OP_SENDFILE, &e, LLFT_EXIT_DIVERGED,
                     "could not send the %lld bytes of fd %d the primary sent (error %d: its file is shorter here?)",
                     (long long)e.ret, in, err);
    return 0;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
    LLFT_CALL(t);
    int role = transfer_mode(out, &t);
    REPLAY_OR_PROMOTE(role, replay_sendfile(t, out, in, off, count, &res_))
    if (role == LLFT_ROLE_PRIMARY) {
        ssize_t r = PRIMARY_TRANSFER(t, LLFT_OP_SENDFILE, out, REAL(sendfile)(out, in, off, count),
                                     sendfile(out, in, off, count));
        return record_transfer(t, LLFT_OP_SENDFILE, out, r, errno, NULL);
    }
    return REAL(sendfile)(out, in, off, count);
}

_Static_assert(sizeof(off_t) == sizeof(off64_t), "sendfile64 is sendfile here");
EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count)
{
    return sendfile(out, in, (off_t *)off, count);
}
