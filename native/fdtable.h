/* What the shim knows about each file descriptor of the program. */
#ifndef LLFT_FDTABLE_H
#define LLFT_FDTABLE_H

#include "shim.h"
#include "listeners.h"

#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#define LLFT_FD_MAX 65536

enum llft_fd_kind {
    FD_LOCAL = 0,     /* files, terminals: each replica's own, not recorded */
    FD_RANDOM,        /* /dev/urandom, /dev/random */
    FD_PROCFS,        /* a file under /proc: what this process reads there is its own */
    FD_VSOCK,         /* a TCP socket of the program, not yet listening (an AF_UNIX socket) */
    FD_LISTEN,        /* ...listening: the controller connects here per client connection */
    FD_CONN,          /* a client connection accepted from a virtual listener, or an outgoing one (connect) */
    FD_IPC,           /* pipes and socketpairs between the program's threads */
    FD_COUNTER,       /* eventfd, timerfd: a read returns an 8-byte value */
    FD_EPOLL,
    FD_DGRAM,         /* a UDP socket of the program (an AF_UNIX datagram socket) */
    FD_CHILD_IPC,     /* a pipe or socketpair the program shares with a process it forked: that process
                       * runs unrecorded, so what the program reads there is an input, recorded whole */
};

struct llft_fd {
    uint8_t kind;
    uint8_t family;          /* AF_INET / AF_INET6 the program asked for */
    uint16_t port;           /* bound port (host order) */
    uint8_t addr[16];        /* bound address */
    llft_conn_header_t peer; /* FD_CONN: who the client (or the remote server) is */
    int32_t so_error;        /* a non-blocking connect's result, until SO_ERROR (or connect) reports it */
    int32_t handover;        /* FD_VSOCK, FD_DGRAM: the controller's end of the program's socket, until the
                              * channel hands it over (listen, bind, connect); 0: none */
    uint64_t *epoll_data;    /* FD_EPOLL: the program's epoll_data, indexed by fd */
    uint32_t channel;        /* FD_IPC: which pipe or socketpair (both ends, dups too); 0: none */
};

extern struct llft_fd llft_fds[LLFT_FD_MAX];

static inline int llft_fd_kind(int fd)
{
    return (unsigned)fd < LLFT_FD_MAX ? llft_fds[fd].kind : FD_LOCAL;
}

void llft_fd_set(int fd, int kind);
void llft_fd_forget(int fd);
void llft_fd_copy(int from, int to);

/* Identity of an fd as an ordered object (reads, writes, accepts on one fd
 * take turns).  Not an address: a tag in the object table. */
static inline const void *llft_fd_object(int fd)
{
    return (const void *)(uintptr_t)(0xF000000000000000ull | (unsigned)fd);
}

/* Primary: transfers on each fd between the start of their real call and
 * the turn they take after it, in the low half; in the high half, those
 * of them whose real call has returned.  A close takes its turn after
 * theirs (wrap_fd.c): a reply written, read by the client, whose EOF led
 * another thread to close the connection, is ordered before the close
 * even when its writer had not yet taken its turn.  Not reset with the
 * fd's entry: a transfer may still be under way on a number just reused.
 * Every transfer marks llft_transfer_returned before it ends. */
#define LLFT_TRANSFER_RETURNED (1u << 16)
extern uint32_t llft_fd_transfers[LLFT_FD_MAX];
static inline void llft_transfer_begin(int fd)
{
    if ((unsigned)fd < LLFT_FD_MAX)
        __atomic_add_fetch(&llft_fd_transfers[fd], 1, __ATOMIC_SEQ_CST);
}
static inline void llft_transfer_returned(int fd)
{
    if ((unsigned)fd < LLFT_FD_MAX)
        __atomic_add_fetch(&llft_fd_transfers[fd], LLFT_TRANSFER_RETURNED, __ATOMIC_SEQ_CST);
}
static inline void llft_transfer_end(int fd)
{
    if ((unsigned)fd < LLFT_FD_MAX)
        __atomic_sub_fetch(&llft_fd_transfers[fd], LLFT_TRANSFER_RETURNED + 1, __ATOMIC_RELEASE);
}
/* How many threads are blocked in the kernel in a transfer on fd
 * (blocked_threads.c). */
int llft_threads_in_transfer(int fd);

/* Primary: waits until *count is 0 (the calls it counts have been
 * recorded), at most max_ms: one may stay blocked in the kernel. */
void llft_wait_zero(const uint32_t *count, uint64_t max_ms);

/* A pipe's or socketpair's two ends made a channel of their own, between
 * the program's threads (wrap_io.c). */
void llft_fd_channel(int a, int b);

/* fd kinds whose fd object takes turns (transfers, accepts, datagrams):
 * closing one takes a turn too, so that a backup closes it after the
 * transfers the primary made before, and before the next fd to get the
 * number is used. */
static inline int llft_ordered_kind(int kind)
{
    return kind == FD_CONN || kind == FD_IPC || kind == FD_COUNTER || kind == FD_LISTEN || kind == FD_DGRAM ||
           kind == FD_CHILD_IPC;
}

/* The fds through which the program meets its clients: the replicas'
 * alone, never a forked child's (llft_forked_use). */
static inline int llft_client_kind(int kind)
{
    return kind == FD_VSOCK || kind == FD_LISTEN || kind == FD_CONN || kind == FD_DGRAM;
}

/* At a fork, in the parent: its pipes and socketpairs are the child's
 * too (FD_CHILD_IPC). */
void llft_fds_shared_with_child(void);

/* The fd numbers themselves, as an ordered object: the primary's new fds
 * (llft_new_fds) take its turns. */
#define LLFT_FD_NUMBERS ((const void *)(uintptr_t)0xF100000000000000ull)

/* Backup helpers: move exactly n bytes, waiting as long as needed, whatever
 * the fd's blocking mode.  Return 0, or an errno. */
int llft_read_exact(int fd, void *buf, size_t n, int peek);
int llft_write_exact(int fd, const void *buf, size_t n);
/* ...until a pipe or stream socket is at its end (its writers gone) and
 * empty, as it was where the primary read its end: a backup's reader then
 * waits for its own writers, its own forked processes among them.  EIO if
 * bytes wait in it instead. */
int llft_await_end(int fd);
/* ...n bytes of file in (at *off, or its position) through out. */
int llft_sendfile_exact(int out, int in, off_t *off, size_t n);
/* Backup: the primary's record of a transfer on fd (wrap_io.c): 0, with
 * the result in *res (and errno), or LLFT_PROMOTED. */
int llft_replay_head(struct llft_thread *t, uint16_t op, int fd, llft_rec_t *e, ssize_t *res);

/* fd moved to one of the highest numbers allowed (out of the way of the
 * numbers the primary's fds had); returns it, or fd if it cannot. */
int llft_park_fd(int fd);
/* An fd made by make(ctx) under the number the primary's got: recorded
 * (LLFT_OP_NEW_FD) at the primary, moved there at a backup.  The kernel
 * numbers fds lowest-free, and a thread blocked in accept() holds the
 * number it will return: another thread's new fd gets the next one at the
 * primary, the lowest one at a backup, whose accept is replayed later. */
int llft_new_fd(int (*make)(void *ctx), void *ctx, int cloexec);
/* ...n (1 or 2) fds made together (a pipe, a socketpair) by make(ctx, fds),
 * which returns 0 or -1 as pipe() does; the same result. */
int llft_new_fds(int n, int (*make)(void *ctx, int *fds), void *ctx, int cloexec, int *fds);
/* An fd the kernel numbered outside the shim (an accepted connection):
 * the primary records its number in the fd numbers' turns, a backup puts
 * its own (parked) there in that turn (fdtable.c). */
void llft_fd_numbered(struct llft_thread *t, int fd);
int llft_place_numbered(struct llft_thread *t, int fd, int cloexec);

/* Descriptors passed with a sendmsg or recvmsg (fd_passing.c). */
struct msghdr;
void llft_number_received_fds(struct llft_thread *t, struct msghdr *msg);
int  llft_replay_recvmsg_fds(struct llft_thread *t, int fd, struct msghdr *msg, int flags, ssize_t *res);
int  llft_replay_sendmsg_fds(struct llft_thread *t, int fd, const struct msghdr *msg, int flags, ssize_t *res);
/* A file the program opens (or dups), made by make(ctx) outside the
 * numbering lock and numbered after the fact: at a backup under the
 * primary's number (fdtable.c). */
int llft_open_numbered(int (*make)(void *ctx), void *ctx, int cloexec);
/* Files whose reads are recorded (wrap_random.c): the fd kind a path
 * gets when opened (FD_RANDOM, FD_PROCFS, or FD_LOCAL), and such a path
 * opened through stdio. */
int llft_recorded_path(const char *path);
FILE *llft_recorded_file(const char *path, const char *mode);
/* A pipe or socketpair between the program's threads (FD_IPC), made by
 * make(ctx, fds) under the primary's numbers when replicated (wrap_fd.c). */
int llft_ipc_pair(int (*make)(void *ctx, int *fds), void *ctx, int cloexec, int fds[2]);
/* An fd the shim holds for itself (a socket's other end until it is
 * handed over), moved above the numbers the program's fds take. */
int llft_out_of_the_way(int fd, int cloexec);

/* Addresses of virtual sockets (wrap_socket.c). */
int llft_give_addr(struct sockaddr *addr, socklen_t *len, int family, uint16_t port_host, const uint8_t *a);
int llft_give_peer(struct sockaddr *addr, socklen_t *len, const llft_conn_header_t *h);

/* Hands the controller fd's other end (its handover) through the channel,
 * as a socket of this kind (LLFT_CHAN_*): 0, or an errno.  A socket whose
 * other end went already (a connect that failed, tried again) gets a new
 * pair under its number first (wrap_socket.c). */
int llft_hand_over(int fd, uint32_t kind, uint32_t type);

/* Outgoing connections (wrap_connect.c): connect() on a TCP socket. */
int llft_connect(int fd, const struct sockaddr *addr, socklen_t len);

/* UDP sockets (wrap_udp.c): every receive and send on an FD_DGRAM fd. */
struct msghdr;
ssize_t llft_dgram_recvmsg(int fd, struct msghdr *m, int flags);
ssize_t llft_dgram_sendmsg(int fd, const struct msghdr *m, int flags);
ssize_t llft_dgram_recv(int fd, void *buf, size_t n, int flags, struct sockaddr *addr, socklen_t *len);
ssize_t llft_dgram_send(int fd, const void *buf, size_t n, int flags, const struct sockaddr *addr, socklen_t len);
int llft_dgram_connect(int fd, const struct sockaddr *addr, socklen_t len);
struct iovec;
ssize_t llft_dgram_readv(int fd, const struct iovec *iov, int n);
ssize_t llft_dgram_writev(int fd, const struct iovec *iov, int n);

/* Backup: empty an eventfd or timerfd if it has a value, without waiting. */
void llft_drain_counter(int fd);

#endif
