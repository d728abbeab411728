/* The replica's private channel to its controller (channel.c). */
#ifndef LLFT_CHANNEL_H
#define LLFT_CHANNEL_H

#include "shim.h"

/* The channel's fd, or -1 when this process has none. */
extern int llft_channel;

/* At start-up (and after an exec): find the channel, move it out of the
 * program's way, note where in ctl. */
void llft_channel_attach(llft_ctl_t *ctl);

/* Whether fd is the channel: the program's close of it is not carried out. */
static inline int llft_is_channel(int fd)
{
    return fd >= 0 && fd == __atomic_load_n(&llft_channel, __ATOMIC_ACQUIRE);
}

/* The program wants the channel's number (dup2 over it): the channel moves
 * to another.  0, or -1. */
int llft_channel_move(void);

/* Sends m with fd (the controller's end of a program socket); 0 or an errno. */
int llft_channel_send(const llft_channel_msg_t *m, int fd);

#endif
