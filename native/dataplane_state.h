/* The data plane's state, shared by its files (dataplane.c: the thread,
 * the connections done and the API; dataplane_client.c and
 * dataplane_legs.c: each side of a connection; dataplane_bytes.c: byte
 * queues and input files; dataplane_replicas.c: replicas joining, parked,
 * leaving, promoted; dataplane_clone.c: a replica cloned from another).
 * Not part of the API: dataplane.h is. */
#ifndef LLFT_DATAPLANE_STATE_H
#define LLFT_DATAPLANE_STATE_H

#include "dataplane.h"
#include "idmap.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define READ_CHUNK 65536
#define TAG_SLOT_SHIFT 48             /* epoll tag: (leg slot + 1) << 48 | connection id; 0 << 48: the client */
#define TAG_ID_MASK ((1ull << TAG_SLOT_SHIFT) - 1)
#define TAG_WAKE UINT64_MAX

/* A byte queue: p[off..len). */
struct bytes {
    char *p;
    size_t off, len, cap;
};

/* One replica's side of one client connection. */
struct leg {
    int fd;                  /* -1 before attach and once its output ended */
    bool attached;           /* has been connected: it has an output summary */
    bool registered;         /* in the epoll set */
    bool in_done;            /* takes no more input: EOF sent, write failed, replica removed */
    bool eof_wanted;         /* the client's input ended: shut down writing once pending is out */
    bool rd_paused;          /* the client has too much queued: not read (primary only) */
    bool out_ended;          /* the program closed it (or the replica died) */
    bool waiting;            /* a new connection its replica's relay has yet to hand over (counted) */
    uint32_t events;
    struct bytes pending;    /* input not written yet */
    int replay_fd;           /* a joining replica's logged input, sent before pending */
    uint64_t replay_off, replay_left;
    uint64_t out_bytes;
    EVP_MD_CTX *sha;
    char hex[65];            /* the final digest once out_ended */
    int log_fd;              /* --log-output */
    struct bytes unsent;     /* a backup's output the client has not had, for a takeover */
    uint64_t unsent_from;    /* stream offset of unsent's first byte */
    bool parked;             /* its replica is a stored checkpoint: input from the log when it wakes */
    uint64_t parked_at;      /* the client's input written to fd when it was parked */
};

struct conn {
    uint64_t id;
    int cfd;                 /* the client; -1 once closed */
    bool registered;
    bool in_ended;           /* the client's input ended */
    bool closing;            /* close once out is sent */
    bool rd_paused;          /* not read: its own backlog, or a replica's (then listed in paused_ids) */
    bool listed;             /* in paused_ids: read again when the replicas catch up */
    uint32_t events;
    uint64_t in_bytes;       /* read from the client */
    uint64_t sent;           /* output stream offset the client has been sent up to */
    struct bytes out;        /* to the client, not written yet */
    int in_fd;               /* the input log file while the client's input lasts */
    struct leg **legs;       /* by replica slot; NULL: the replica was not live when it opened */
    int nlegs;
    bool replayed;           /* brought back for a joining replica after it was done */
};

struct replica {
    int pid, pidfd;
    bool live;
    bool held;               /* its legs take no input for now (queued): a checkpoint is being taken of it */
    bool parked;             /* a stored checkpoint's: no new legs, no input until it wakes (llft_dp_park) */
    uint64_t parked_after;   /* the last connection id when it was parked */
    char *log_dir;
    uint64_t queued;         /* input bytes queued in its legs */
    int open_legs;
    uint64_t waiting;        /* new connections its relay has yet to hand it (not a joiner's catch-up) */
    /* Connections done on every side and freed (conn_settle): how many, the
     * bytes this replica sent on them, and the XOR of a SHA-256 per
     * connection (id, bytes, digest): one value whatever the order they
     * were done in, equal at two replicas that sent the same. */
    uint64_t closed_conns, closed_bytes;
    unsigned char closed_xor[32];
};

/* What a replica joining later needs of a connection that is done and
 * freed: its logged input (with an input directory only). */
struct gone {
    uint64_t id, in_bytes;
};

struct llft_dp {
    pthread_mutex_t mu;
    pthread_t thread;
    bool started, stopped;
    int ep, wake;
    char *input_dir;
    uint64_t last_id;        /* the newest connection's id */
    uint64_t queue_limit;
    bool paused;             /* clients are not read: a replica is too far behind */
    llft_idmap_t conns;      /* the connections not done yet, by id */
    struct gone *gone;       /* with an input directory: the connections done, for joiners */
    size_t ngone, capgone;
    struct replica *reps;
    int nreps;
    int primary;
    llft_dp_stats_t st;
    uint64_t *paused_ids;    /* clients found readable while paused */
    size_t npaused, cappaused;
    char buf[READ_CHUNK];
};

/* What the data plane's files call of each other; called with dp->mu held. */
int dp_bytes_put(struct bytes *b, const void *data, size_t n);
size_t dp_bytes_size(const struct bytes *b);
void dp_bytes_drop(struct bytes *b, size_t n);
void dp_bytes_free(struct bytes *b);
ssize_t dp_send_or_queue(int fd, struct bytes *q, const char *data, size_t n, bool now);
void dp_set_nonblocking(int fd);
int dp_write_file(int fd, const char *p, size_t n);
void dp_epoll_set(llft_dp_t *dp, int fd, bool *registered, uint32_t *events, uint32_t want, uint64_t tag);
void dp_client_events(llft_dp_t *dp, struct conn *c);
void dp_client_release(llft_dp_t *dp, struct conn *c);
void dp_client_readable(llft_dp_t *dp, struct conn *c, uint32_t events);
void dp_client_writable(llft_dp_t *dp, struct conn *c);
void dp_leg_send(llft_dp_t *dp, struct conn *c, int slot, const char *data, size_t n);
void dp_leg_writable(llft_dp_t *dp, struct conn *c, int slot);
void dp_leg_free(llft_dp_t *dp, struct leg *l);
void dp_hex_digest(EVP_MD_CTX *ctx, char hex[65]);
struct conn *dp_conn_get(llft_dp_t *dp, uint64_t id);
struct leg *dp_leg_get(struct conn *c, int slot);
struct leg *dp_leg_new(void);
int dp_conn_add_leg(struct conn *c, int slot, struct leg *l);
void dp_leg_connect(llft_dp_t *dp, struct conn *c, int slot, int fd);
void dp_leg_events(llft_dp_t *dp, struct conn *c, int slot);
void dp_leg_readable(llft_dp_t *dp, struct conn *c, int slot);
int dp_open_conn_file(const char *dir, uint64_t id, int flags);
void dp_unlink_conn_file(const char *dir, uint64_t id);
int dp_new_replica(llft_dp_t *dp, int pid, int pidfd, const char *log_dir);
void dp_leg_input_failed(llft_dp_t *dp, struct conn *c, int slot);
void dp_conn_settle(llft_dp_t *dp, struct conn *c);
void dp_queued_less(llft_dp_t *dp, int slot, uint64_t n);
void dp_resume_legs(llft_dp_t *dp, struct conn *c);
void dp_reply(llft_dp_t *dp, struct conn *c, int slot, const char *data, size_t n, uint64_t offset);
void dp_client_close_when_sent(llft_dp_t *dp, struct conn *c);

#endif
