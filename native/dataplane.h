/* The controller's native data plane (llft._dataplane): the byte path of
 * the client connections on one host, on its own thread with epoll.
 *
 * Python keeps the control: it accepts clients, numbers their connections,
 * connects each replica's leg to the program's listener in connection order
 * (writing the 32-byte header), decides failovers and writes the state
 * file.  It hands each socket over here; from then on this thread moves the
 * bytes: client -> every live replica's leg, the primary's output -> the
 * client once (skipping what the client already had, by stream offset),
 * every replica's output -> SHA-256 (and --log-output's file), a backup's
 * output not yet sent to the client kept for a takeover, and, with an input
 * directory, every client's bytes to DIR/conn-N for replicas that join later.
 *
 * Every function may be called from any thread; a mutex serializes them
 * with the plane's thread.  This is not part of the preload library. */
#ifndef LLFT_DATAPLANE_H
#define LLFT_DATAPLANE_H

#include <stddef.h>
#include <stdint.h>

typedef struct llft_dp llft_dp_t;

typedef struct {
    uint64_t connections;   /* client connections handed over */
    uint64_t bytes_in;      /* bytes read from clients */
    uint64_t bytes_out;     /* bytes written (or queued) to clients */
    uint64_t open_clients;  /* client sockets not closed yet */
    uint64_t held;          /* connections not done at every replica yet: what the plane keeps */
} llft_dp_stats_t;

/* input_dir: where every connection's input is kept (NULL: not kept, and no
 * replica can join later).  queue_limit: input bytes queued for one replica
 * beyond which clients are not read (resumed below half).  NULL on error. */
llft_dp_t *llft_dp_new(const char *input_dir, uint64_t queue_limit);
int llft_dp_start(llft_dp_t *dp);
/* Stops the thread and closes every socket and file; the summaries stay. */
void llft_dp_stop(llft_dp_t *dp);
void llft_dp_free(llft_dp_t *dp);

/* A replica (its pid and a pidfd, which the plane keeps).  log_dir: where
 * --log-output writes conn-N files (NULL: not logged).  When connections
 * exist already (a replacement joining), each gets a leg that is fed the
 * logged input first.  Returns the replica's slot, or -1. */
int llft_dp_add_replica(llft_dp_t *dp, int pid, int pidfd, const char *log_dir);
/* The replica failed: no more input for it; its output is still read. */
void llft_dp_remove_replica(llft_dp_t *dp, int slot);
/* slot's output goes to the clients from now on: what it sent beyond what
 * the clients have had goes out at once, and connections it has closed are
 * closed.  Also sets the first primary. */
void llft_dp_set_primary(llft_dp_t *dp, int slot);

/* Cloning a replica (a checkpoint of a backup restored beside it,
 * llft/checkpoint/): llft_dp_clone_replica, with src's process frozen,
 * reads what src's program has sent so far, holds src's input from then
 * on (queued, not written: what src has not read is then exactly what is
 * in its sockets) and makes a new slot whose legs continue src's: the
 * same output offsets, digests and unsent bytes, the input src has queued.
 * Per connection of src it says (into out, at most max) the connection,
 * the inode of the plane's end of src's leg and its state: WAITING (src's
 * relay has yet to hand it over; the clone's relay will), LIVE (src's
 * program has the other end: the clone gets a socket of its own with
 * llft_dp_clone_attach), ENDED (src's program closed it).  Returns how
 * many, with *slot the clone's; -1 with errno EBUSY (src still replays
 * logged input: later), ENOSPC (more than max) or ENOMEM (*slot is then
 * the clone's if one was made: remove it and release src). */
enum { LLFT_DP_LEG_WAITING = 0, LLFT_DP_LEG_LIVE = 1, LLFT_DP_LEG_ENDED = 2 };
typedef struct {
    uint64_t conn_id;
    uint64_t ino;
    int state;
} llft_dp_leg_info_t;
int llft_dp_clone_replica(llft_dp_t *dp, int src, const char *log_dir, llft_dp_leg_info_t *out, int max,
                          int *slot);
/* The clone's socket for a LIVE connection: prefix (what src had not read
 * of it, n bytes) goes first, then the input src has queued since. */
int llft_dp_clone_attach(llft_dp_t *dp, int slot, uint64_t conn_id, int fd, const char *prefix, size_t n);
/* slot's process, once it runs (a clone's is known after its restore). */
void llft_dp_set_pid(llft_dp_t *dp, int slot, int pid, int pidfd);
/* src takes its input again, what was queued meanwhile first. */
void llft_dp_release(llft_dp_t *dp, int src);

/* A stored checkpoint (llft/checkpoint/stored.py): a clone whose restore
 * waits, kept without holding the clients back.  llft_dp_park stops
 * slot's input (what it has queued is dropped: the input log has it),
 * notes per leg how much of the client's input its socket was given, and
 * gives it no legs for new connections; *after is the last connection id
 * then.  Needs an input directory.  llft_dp_wake makes it a joiner: each
 * parked leg is fed the logged input from where it stopped, each
 * connection opened since (done ones brought back) gets a leg fed its
 * whole log, and --log-output writes under log_dir.  0, or -1 (errno). */
int llft_dp_park(llft_dp_t *dp, int slot, uint64_t *after);
/* (llft_dp_clone_replica of a parked slot makes a parked copy of it: a
 * stored checkpoint is restored through a copy, and stays as it is.) */
int llft_dp_wake(llft_dp_t *dp, int slot, const char *log_dir);
/* The connections done and freed whose id is at most id are needed by no
 * replica that may join later (the stored checkpoint is after them): their
 * input logs are deleted and the plane forgets them.  Returns how many. */
long llft_dp_forget_through(llft_dp_t *dp, uint64_t id);

/* A client connection (conn_id: the gateway's number, increasing); the plane
 * owns client_fd from now on.  Every live replica gets a leg, which queues
 * input until llft_dp_attach.  0, or -1 (errno). */
int llft_dp_open_conn(llft_dp_t *dp, uint64_t conn_id, int client_fd);
/* slot's connection to the program for conn_id, its header written; the
 * plane owns fd.  fd < 0: it could not be made (the input is dropped). */
int llft_dp_attach(llft_dp_t *dp, int slot, uint64_t conn_id, int fd);

/* "conn_id bytes closed sha256hex\n" per connection of slot that was
 * attached and is not done yet, then "closed count bytes xorhex\n" for
 * the connections done and freed (when any), into out (at most cap
 * bytes).  Returns the length needed: call again with more room if it is
 * larger than cap. */
long llft_dp_summary(llft_dp_t *dp, int slot, char *out, long cap);
/* 1 while every live replica has fewer than max_waiting connections not
 * yet attached (its relay hands them over in order, as its program
 * accepts them); 0 when one lags that far: new clients then wait in the
 * gateway's listen backlog, and the plane holds a bounded amount per
 * connection the slowest replica is behind. */
int llft_dp_accepting(llft_dp_t *dp, uint64_t max_waiting);
/* slot's attached connections whose output has not ended yet. */
int llft_dp_open_legs(llft_dp_t *dp, int slot);
/* Closes every client connection once what it was sent has gone out. */
void llft_dp_close_clients(llft_dp_t *dp);
void llft_dp_stats(llft_dp_t *dp, llft_dp_stats_t *out);

#endif
