/* The shared-memory ABI between the preload library (libllft.so) and the
 * Python controller: one file per replica holding a control block and a ring
 * of fixed-size OrderInfo records.  Nothing here allocates or locks. */
#ifndef LLFT_ABI_H
#define LLFT_ABI_H

#include <stdint.h>
#include <stddef.h>

#define LLFT_ABI_VERSION 10u
#define LLFT_CTL_MAGIC  0x4c4c4654434f4e31ull /* "LLFTCON1" */
#define LLFT_RING_MAGIC 0x4c4c465452494e31ull /* "LLFTRIN1" */

#define LLFT_REC_SIZE   64u   /* one cache line: concurrent writers never share a line */
#define LLFT_DATA_BYTES 48u   /* payload bytes in one continuation slot */
#define LLFT_MAX_GROUP  4097u /* slots in one record group: header + 4096 data slots */
#define LLFT_NCLOCKS    16    /* clock ids that carry a group-clock offset */
#define LLFT_CTL_BYTES  8192u
#define LLFT_RING_HDR   512u

/* LLFT_ROLE_COPY: a copy of the primary's checkpoint, restored to be a
 * backup; its first call makes it one (LLFT_ROLE_DEMOTING meanwhile:
 * native/demote.c). */
enum llft_role {
    LLFT_ROLE_OFF = 0, LLFT_ROLE_PRIMARY = 1, LLFT_ROLE_BACKUP = 2, LLFT_ROLE_COPY = 3, LLFT_ROLE_DEMOTING = 4
};

/* What a replica's forked processes are (llft-run --fork). */
enum llft_fork_mode {
    LLFT_FORKS_UNRECORDED = 0,    /* they run unrecorded; one that reaches a client is refused (wrap_fork.c) */
    LLFT_FORKS_REPLICATED = 1     /* each has a record stream of its own (fork_stream.c) */
};
#define LLFT_CHILD_SLOTS (1u << 15) /* a forked process's ring: 2 MiB */

/* Exit codes of a replica stopped by the shim itself. */
#define LLFT_EXIT_DIVERGED 86
#define LLFT_EXIT_NOSTREAM 87
#define LLFT_EXIT_UNREACHABLE 88   /* the program execs an image the library cannot reach (div_text says why) */

/* Operation kinds (the "O" of LLFT's (T, O, N, D) names the object; this
 * names the call).  Values are part of the wire format: append only. */
enum llft_op {
    LLFT_OP_NONE = 0,
    LLFT_OP_DATA = 1,            /* continuation slot: raw bytes of the preceding record */
    LLFT_OP_END = 2,             /* end of stream: the primary has exited */
    LLFT_OP_PROMOTE = 3,         /* end of the failed primary's stream: this backup takes over */
    LLFT_OP_CLOCK_GETTIME = 10,
    LLFT_OP_GETTIMEOFDAY = 11,
    LLFT_OP_TIME = 12,
    LLFT_OP_GETPID = 13,         /* val: the primary's pid */
    LLFT_OP_THREAD_CREATE = 20,
    LLFT_OP_THREAD_EXIT = 21,
    LLFT_OP_EXEC = 22,           /* the program image ends here (execve) */
    LLFT_OP_EXEC_FAILED = 23,    /* ...unless execve returned: its error */
    LLFT_OP_MUTEX_LOCK = 30,
    LLFT_OP_MUTEX_TRYLOCK = 31,
    LLFT_OP_MUTEX_TIMEDLOCK = 32,
    LLFT_OP_COND_WAIT = 33,
    LLFT_OP_COND_TIMEDWAIT = 34,
    LLFT_OP_RWLOCK_RDLOCK = 40,
    LLFT_OP_RWLOCK_WRLOCK = 41,
    LLFT_OP_RWLOCK_TRYRDLOCK = 42,
    LLFT_OP_RWLOCK_TRYWRLOCK = 43,
    LLFT_OP_RWLOCK_TIMEDRDLOCK = 44,
    LLFT_OP_RWLOCK_TIMEDWRLOCK = 45,
    LLFT_OP_SEM_WAIT = 50,
    LLFT_OP_SEM_TRYWAIT = 51,
    LLFT_OP_SEM_TIMEDWAIT = 52,
    LLFT_OP_GETRANDOM = 60,
    LLFT_OP_RANDOM_READ = 61,    /* read() of an fd opened on /dev/urandom or /dev/random */
    LLFT_OP_RANDOM_FREAD = 62,   /* stdio read of a FILE opened on those paths */
    LLFT_OP_GETENTROPY = 63,
    LLFT_OP_ARC4RANDOM = 64,
    LLFT_OP_PROC_READ = 65,      /* read() of an fd opened under /proc: its bytes */
    LLFT_OP_PROC_FREAD = 66,     /* stdio read of a FILE opened under /proc */
    LLFT_OP_GETRUSAGE = 67,      /* data: struct rusage */
    LLFT_OP_TIMES = 68,          /* data: struct tms */
    LLFT_OP_CLOCK = 69,          /* clock(): process CPU time */
    LLFT_OP_ACCEPT = 70,         /* val: connection id; data: the connection header */
    LLFT_OP_READ = 71,           /* read/recv*: byte count (data only for counter fds) */
    LLFT_OP_WRITE = 72,          /* write/send*: byte count */
    LLFT_OP_POLL = 73,           /* poll/ppoll: data: revents of each pollfd */
    LLFT_OP_SELECT = 74,         /* select/pselect: data: the three result sets */
    LLFT_OP_EPOLL_WAIT = 75,     /* epoll_wait/pwait: data: (fd, events) pairs */
    LLFT_OP_SENDFILE = 80,       /* sendfile to a connection: byte count (the bytes come from a local file) */
    LLFT_OP_DGRAM_RECV = 81,     /* recv* of a UDP socket: payload bytes; val: datagram number; err: msg_flags */
    LLFT_OP_DGRAM_SEND = 82,     /* send* on a UDP socket: payload bytes */
    LLFT_OP_CONNECT = 83,        /* connect on a TCP socket: aux: fd; data: llft_connect_reply_t */
    LLFT_OP_NEW_FD = 84,         /* socket() of a TCP socket, epoll_create*: the fd number */
    LLFT_OP_BIND_PORT = 85,      /* bind() to port 0 (or by a send) of a UDP or TCP socket: the port */
    LLFT_OP_CLOSE = 86,          /* close (or dup2 over) a connection, pipe, counter or listener: aux: fd */
    LLFT_OP_CHILD_READ = 87,     /* read() of a pipe shared with a process the program forked: its bytes */
    LLFT_OP_SERIAL_TURN = 88,    /* --serialize: the thread takes the replica's turn (turn: its order) */
    LLFT_OP_SIGNAL_SELF = 89,    /* raise, or kill of its own process: val: the signal */
    LLFT_OP_FORK = 90,           /* fork (--fork replicate): ret: the child's pid at the primary, or -1;
                                  * val: the child's stream id; aux: this process's n-th fork */
    LLFT_OP_WAIT = 91,           /* wait, waitpid, wait3, wait4, waitid: ret; val: the status; aux: which
                                  * call; data: the rusage or siginfo it filled */
    LLFT_OP_GETPPID = 92,        /* val: the parent's pid as the program sees it */
    LLFT_OP_SIGNAL = 93,         /* --fork replicate: the program's handler of signal val ran here (before
                                  * this thread's next call); data: its siginfo_t (wrap_signal.c) */
    LLFT_OP_SIGSUSPEND = 94,     /* sigsuspend or pause returned (aux: 1 for pause) */
    LLFT_OP_KILL = 95,           /* --fork replicate: kill of another process: val: the signal */
    LLFT_OP_MAX = 96
};

/* What the controller writes first on each connection it hands to a
 * program's listening socket: which client connection it is.  On a UDP
 * port it heads every datagram: in a client's datagram, its number on the
 * port (conn_id) and the client's address; in a reply, the destination. */
typedef struct llft_conn_header {
    uint64_t conn_id;
    uint16_t family;              /* AF_INET or AF_INET6 of the client */
    uint16_t port;                /* client port, network byte order */
    uint32_t _pad;
    uint8_t  addr[16];            /* client address, network byte order */
} llft_conn_header_t;

/* The replica's channel to its controller: one end of a SOCK_SEQPACKET
 * socketpair the controller made and handed down at fd LLFT_CHANNEL (the
 * environment; the control block's channel_fd once the shim has moved it
 * out of the program's way).  No name: no other process can reach it, nor
 * any socket the replica gets through it.  Each message carries one fd:
 * the controller's end of a socketpair whose other end is the program's
 * socket.
 *
 *   LISTEN   a TCP socket the program listens on (a SOCK_STREAM pair): per
 *            client connection the controller sends one byte on it with
 *            the connection's fd (SCM_RIGHTS), and writes an
 *            llft_conn_header_t first on the connection itself;
 *   DGRAM    a UDP socket the program bound (a SOCK_DGRAM pair): client
 *            datagrams in, replies out, each headed by llft_conn_header_t;
 *   CONNECT  an outgoing connection (a SOCK_STREAM pair) on which the shim
 *            writes an llft_connect_request_t first;
 *   STREAM   the record stream of a process the program forked (--fork
 *            replicate): the fd is the child's stream file (a memfd); type
 *            is its role, addr[0..8) its stream id and addr[8..16) its
 *            parent's (native/fork_stream.c);
 *   INBOX    under --fork replicate, a backup process's own listener for
 *            every connection its primary counterpart accepted (a
 *            SOCK_STREAM pair used as LISTEN's): addr[0..8) its stream id;
 *   PORT     under --fork replicate, a primary's forked process asks for
 *            an ephemeral port (family and type: SOCK_STREAM or
 *            SOCK_DGRAM): the controller writes the port as a uint32_t on
 *            the fd, a SOCK_STREAM pair, and closes it. */
enum llft_channel_kind {
    LLFT_CHAN_LISTEN = 1, LLFT_CHAN_DGRAM = 2, LLFT_CHAN_CONNECT = 3, LLFT_CHAN_STREAM = 4, LLFT_CHAN_INBOX = 5,
    LLFT_CHAN_PORT = 6
};

/* The ephemeral ports of bind() to port 0 (and of a UDP socket's first
 * send), as Linux's: the replica's first process numbers its own from the
 * first LLFT_EPHEMERAL_OWN; the controller gives the processes it forks
 * theirs from the rest (LLFT_CHAN_PORT), apart from every port the
 * replica's processes hold. */
#define LLFT_EPHEMERAL_FIRST 49152u
#define LLFT_EPHEMERAL_COUNT 16384u
#define LLFT_EPHEMERAL_OWN 8192u
typedef struct llft_channel_msg {
    uint32_t kind;                /* enum llft_channel_kind */
    uint16_t port;                /* LISTEN, DGRAM: host byte order */
    uint16_t family;              /* AF_INET or AF_INET6 */
    uint32_t type;                /* DGRAM: LLFT_LISTENER_ANY_PORT when bound to port 0 or by a send */
    uint8_t  addr[16];            /* LISTEN, DGRAM: the address the program bound, network byte order */
    uint32_t _pad;
} llft_channel_msg_t;

/* An outgoing connection (the program's connect() on a TCP socket): the
 * shim hands the controller the other end of the program's socket
 * (LLFT_CHAN_CONNECT) and writes a request on it: the program's conn_id-th
 * outgoing connection and where to.  Only the primary's request carries
 * LLFT_CONNECT_ASK: the controller makes the real connection (or finds the
 * one it made for this number already) and answers with a reply; a
 * backup's request gets no answer.  Then the connection carries the remote
 * server's bytes to the replica and the program's bytes to the
 * controller. */
#define LLFT_CONNECT_ASK 1u
typedef struct llft_connect_request {
    uint64_t conn_id;             /* 1, 2, ...: the same number at every replica */
    uint16_t family;              /* AF_INET or AF_INET6 */
    uint16_t port;                /* network byte order */
    uint32_t flags;               /* LLFT_CONNECT_ASK */
    uint8_t  addr[16];            /* network byte order */
} llft_connect_request_t;

typedef struct llft_connect_reply {
    uint64_t conn_id;
    int32_t  err;                 /* 0: connected; else the errno of the real connect */
    uint16_t family;              /* the real connection's local address */
    uint16_t port;                /* network byte order */
    uint8_t  addr[16];
} llft_connect_reply_t;

#define LLFT_MAX_LISTENERS 16
#define LLFT_QUIESCE_KICKS 1024
/* The signals of a quiesce's census (native/quiesce.c): SIGRTMAX and the
 * one below it, which programs seldom use. */
#define LLFT_CENSUS_SIGNAL 64
#define LLFT_KICK_SIGNAL 63

/* A TCP or UDP port the program listens on, for llft-status and for the
 * gateway's choice of public ports (the sockets themselves come through
 * the channel).  type: SOCK_STREAM or SOCK_DGRAM, with
 * LLFT_LISTENER_ANY_PORT for a UDP port bound to port 0, or implicitly by a
 * send or a connect (outgoing UDP): the controller serves it on any free
 * port.  Threads of the program publish at once and the controller reads
 * while they do: a slot is claimed (state 3) before it is written, and
 * gen, bumped at each claim, lets a reader tell a slot rewritten under it
 * (native/listeners.c). */
#define LLFT_LISTENER_ANY_PORT 0x100u
typedef struct llft_listener {
    uint32_t state;               /* 0 free, 1 listening, 2 closed, 3 being written; written last */
    uint16_t port;                /* host byte order */
    uint16_t family;
    uint32_t type;                /* SOCK_STREAM (TCP) or SOCK_DGRAM (UDP) */
    uint32_t gen;                 /* claims of this slot so far */
    uint8_t  addr[16];            /* the address the program bound, network byte order */
} llft_listener_t;


/* One OrderInfo entry (T, O, N, D).  seq is written last, with release
 * ordering: it is the commit marker (ring position + 1; 0 = never written). */
typedef struct llft_rec {
    uint64_t seq;
    uint32_t check;   /* integrity check over bytes 12..63 */
    uint16_t op;      /* enum llft_op */
    uint16_t nslots;  /* slots in this group: 1 + continuation slots */
    uint32_t tid;     /* T: logical thread id (creation order; main = 0) */
    uint32_t tn;      /* N: this thread's n-th recorded call (1-based) */
    uint64_t obj;     /* O: logical object id (mutex, clock id, ...) */
    uint64_t turn;    /* k-th acquisition of obj (1-based); 0 = takes no turn */
    int64_t  ret;     /* return value */
    int32_t  err;     /* errno, when the call failed */
    uint32_t aux;     /* call-specific (e.g. rwlock kind) */
    int64_t  val;     /* call-specific output: time in ns, child tid, ... */
} llft_rec_t;

typedef struct llft_data {
    uint64_t seq;
    uint32_t check;
    uint16_t op;      /* LLFT_OP_DATA */
    uint16_t len;     /* payload bytes used, <= LLFT_DATA_BYTES */
    uint8_t  bytes[LLFT_DATA_BYTES];
} llft_data_t;

/* Ring header.  Producer and consumer fields live on separate lines. */
typedef struct llft_ring {
    uint64_t magic;
    uint32_t version;
    uint32_t rec_size;
    uint64_t capacity;            /* slots, a power of two */
    uint64_t _pad0[5];
    uint64_t head;                /* next position to reserve (producers) */
    uint64_t _pad1[7];
    uint64_t tail;                /* next position to consume */
    uint64_t _pad2[7];
    uint32_t data_futex;          /* bumped when data arrives and a consumer waits */
    uint32_t consumer_waiting;
    uint32_t space_futex;         /* bumped when space frees and a producer waits */
    uint32_t producer_waiting;
    uint32_t closed;              /* the producer will write no more */
    uint32_t _pad3[11];
} llft_ring_t;

/* Control block: what the controller and the shim tell each other. */
typedef struct llft_ctl {
    uint64_t magic;
    uint32_t version;
    uint32_t role;                /* enum llft_role; the controller may change it */
    int32_t  attached_pid;        /* the one process allowed to use this stream */
    uint32_t replica;
    uint64_t records;             /* primary: records written; backup: records replayed */
    uint64_t threads;             /* threads created under llft */
    uint32_t stall_timeout_ms;    /* backup: a turn not reached by then is a divergence */
    uint32_t end_grace_ms;        /* backup: how long a call may wait past end of stream */
    uint64_t promoted_ns;         /* CLOCK_MONOTONIC when this replica took over as primary; 0: never */
    uint32_t quiesce;             /* the controller holds the primary's calls for a checkpoint (quiesce.c):
                                   * read by every call, so on the line role is on */
    uint32_t stopping;            /* the controller is stopping the group: the first process's death is
                                   * then its stop, no fault (replica_lease.c) */
    int64_t  clock_offset_ns[LLFT_NCLOCKS]; /* group clock minus local clock */
    int64_t  clock_last_ns[LLFT_NCLOCKS];   /* last group-clock value handed out */
    uint32_t diverged;            /* set once by a backup that stopped */
    uint32_t div_tid;
    uint32_t div_tn;
    uint16_t div_want_op;         /* what the backup called */
    uint16_t div_got_op;          /* what the primary's stream said */
    char     div_text[512];
    uint32_t nlisteners;
    int32_t  channel_fd;          /* the channel's fd once the shim has moved it (0: LLFT_CHANNEL's) */
    llft_listener_t listeners[LLFT_MAX_LISTENERS];
    uint32_t stopped_for_good;    /* backup: exited once its threads stopped where the primary's were (its
                                   * stdio buffers not flushed: its stdout may be short) */
    int32_t  lease_fd;            /* the replica lease's page, a memfd at this number (replica_lease.c):
                                   * kept open across exec, so that the next image maps it again; 0: none */
    int32_t  inbox_fd;            /* a backup's process's inbox (fork_stream.c), kept open across exec, so
                                   * that what the controller handed it before is still there; 0: none */
    char     div_where[1536];     /* a diverged backup's backtrace, a frame per line: kept in the run dir
                                   * whatever the program did with its stderr */
    uint32_t refused;             /* a process of the replica did what llft cannot replicate (div_text
                                   * says what): the controller stops the group (llft_refuse) */
    uint32_t serial_steals;       /* --serialize: turns taken from a thread that ran on without giving
                                   * its turn up (serialize.c) */
    char     div_before[768];     /* the diverged thread's calls just before, as the primary recorded
                                   * them, newest first, a call per line (divergence.txt) */
    uint64_t stream_id;           /* 0: the replica's own process; else a process it forked
                                   * (native/fork_stream.c): the same id at every replica */
    uint64_t parent_stream;       /* the stream id of the process that forked this one */
    uint32_t forks;               /* forks this process (and the images it exec'd) made so far */
    uint32_t fork_mode;           /* enum llft_fork_mode: set by the controller, inherited by children */
    int32_t  program_pid;         /* the pid the program sees (the primary's), once it differs from this
                                   * process's own (wrap_process.c): kept here across an exec */
    int32_t  parent_program;      /* a forked process's parent: its pid as the program sees it... */
    int32_t  parent_local;        /* ...and as this process's kernel does */
    int32_t  waited_for;          /* a forked process let go as its parent waited for it (a read of a pipe
                                   * from it, a poll: a daemon's word), before it had any thread */
    char     shared_memory[96];   /* a forked process: the first memory its parent shared with it, as a
                                   * phrase ("" if none): its writes there are not ordered */
    uint64_t q_census __attribute__((aligned(8))); /* the quiesce's census: its number (high 32
                                   * bits) and how many threads answered it (low 32), in one word so
                                   * that a late answer to an earlier census is never counted */
    int32_t  q_blocked[LLFT_QUIESCE_KICKS]; /* threads held in a blocking call the census must
                                   * interrupt, by their ids as they see them (their PID namespace's;
                                   * 0: free slot) */
} llft_ctl_t;

/* Layout of one replica's shared file: [ctl][ring header][slots]. */
static inline uint64_t llft_shm_bytes(uint64_t slots)
{
    return LLFT_CTL_BYTES + LLFT_RING_HDR + slots * LLFT_REC_SIZE;
}

#endif
