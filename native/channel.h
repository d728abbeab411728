/* The replica's private channel to its controller (channel.c). */
#ifndef LLFT_CHANNEL_H
#define LLFT_CHANNEL_H

#include "shim.h"

/* The channel's fd, or -1 when this process has none. */
extern int llft_channel;
/* The fd of the replica's stream file (LLFT_SHM=fd:N), kept open for the
 * next program image an exec starts; -1 when attached by path. */
extern int llft_stream_fd;

/* At start-up (and after an exec): find the channel, move it out of the
 * program's way, note where in ctl. */
void llft_channel_attach(llft_ctl_t *ctl);

/* The stream file's fd (attach): moved out of the program's way, and
 * LLFT_SHM in the environment rewritten to say where, in place. */
void llft_stream_keep(int fd);

/* The fd of the preload library itself (LD_PRELOAD=/proc/self/fd/N), kept
 * so that an exec, after a privilege drop too, loads the shim; -1 when
 * preloaded by path. */
extern int llft_library_fd;

/* At start-up: the library's fd, if LD_PRELOAD names one, moved out of the
 * program's way and LD_PRELOAD rewritten in place to say where. */
void llft_library_keep(void);
/* The library's own path, read through that fd ("" when preloaded by
 * path): what a backtrace names, since /proc/self/fd/N means nothing
 * outside this process. */
extern char llft_library_path[256];

/* Under --fork replicate, a backup process's inbox (fork_stream.c): its
 * end of a pair on which the controller hands it the connections its
 * primary counterpart accepted; -1 otherwise. */
extern int llft_inbox;

/* The replica lease's page (replica_lease.c), kept open across exec;
 * -1 until this process has made or mapped one. */
extern int llft_lease_fd;

/* Whether fd is one the shim keeps (the channel, the stream file, the
 * library, the inbox, the lease): the program's close of it is not
 * carried out. */
static inline int llft_is_kept(int fd)
{
    return fd >= 0 && (fd == __atomic_load_n(&llft_channel, __ATOMIC_ACQUIRE) ||
                       fd == __atomic_load_n(&llft_stream_fd, __ATOMIC_ACQUIRE) ||
                       fd == __atomic_load_n(&llft_library_fd, __ATOMIC_ACQUIRE) ||
                       fd == __atomic_load_n(&llft_inbox, __ATOMIC_ACQUIRE) ||
                       fd == __atomic_load_n(&llft_lease_fd, __ATOMIC_ACQUIRE));
}

/* fd moved up out of the numbers the program's fds take (or left where it
 * is, if it cannot move); returns where it is. */
int llft_above_the_floor(int fd);

/* Under --fork replicate, at a backup: this process's inbox, made and
 * handed to the controller (at attach, and as a forked process goes on). */
void llft_inbox_open(llft_ctl_t *ctl);

/* The program wants a kept fd's number (dup2 over it): that fd moves to
 * another.  0, or -1. */
int llft_kept_move(int fd);

/* Sends m with fd (the controller's end of a program socket); 0 or an errno. */
int llft_channel_send(const llft_channel_msg_t *m, int fd);

#endif
