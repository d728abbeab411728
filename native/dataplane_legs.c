/* A replica's side of a connection in the data plane (a leg): the
 * client's input written to its program (after a joiner's logged input),
 * the program's output read, digested and logged, sent to the client at
 * the primary and kept past what the client has had at a backup.  Called
 * by the plane's thread under dp->mu. */
#include "dataplane_state.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define PF_EXITING 0x4

static uint64_t leg_tag(const struct conn *c, int slot) { return ((uint64_t)(slot + 1) << TAG_SLOT_SHIFT) | c->id; }

void dp_leg_events(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    if (l->fd < 0)
        return;
    uint32_t want = l->rd_paused ? 0 : EPOLLIN;
    if (!l->in_done && !l->parked && !dp->reps[slot].held &&
        (l->replay_left || dp_bytes_size(&l->pending) || l->eof_wanted))
        want |= EPOLLOUT;
    dp_epoll_set(dp, l->fd, &l->registered, &l->events, want, leg_tag(c, slot));
}

/* -- the replica side --------------------------------------------------- */

void dp_leg_input_failed(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    l->in_done = true;
    if (l->replay_fd >= 0) {
        close(l->replay_fd);
        l->replay_fd = -1;
    }
    l->replay_left = 0;
    size_t n = dp_bytes_size(&l->pending);
    dp_bytes_free(&l->pending);
    if (n)
        dp_queued_less(dp, slot, n);
    dp_leg_events(dp, c, slot);
    dp_client_release(dp, c);
}

/* data for slot's program: written now if nothing is ahead of it. */
void dp_leg_send(llft_dp_t *dp, struct conn *c, int slot, const char *data, size_t n)
{
    struct leg *l = c->legs[slot];
    if (l->in_done || l->parked)
        return;   /* (a parked leg takes it from the input log when it wakes) */
    ssize_t queued = dp_send_or_queue(l->fd, &l->pending, data, n, l->fd >= 0 && !dp->reps[slot].held &&
                                   !l->replay_left && !dp_bytes_size(&l->pending));
    if (queued < 0) {
        dp_leg_input_failed(dp, c, slot);
        return;
    }
    if (queued == 0)
        return;
    struct replica *r = &dp->reps[slot];
    r->queued += (uint64_t)queued;
    if (r->queued > dp->queue_limit)
        dp->paused = true;
    dp_leg_events(dp, c, slot);
}

/* 1: all sent, 0: the socket is full, -1: failed. */
static int send_some(int fd, const char *p, size_t n, size_t *sent)
{
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0)
        return (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    *sent = (size_t)w;
    return (size_t)w == n;
}

void dp_leg_writable(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    size_t w = 0;
    if (dp->reps[slot].held || l->parked)
        return;   /* (an EPOLLERR: the write that fails comes once it is let go) */
    while (l->replay_left) {
        size_t want = l->replay_left < READ_CHUNK ? (size_t)l->replay_left : READ_CHUNK;
        ssize_t r = pread(l->replay_fd, dp->buf, want, (off_t)l->replay_off);
        if (r <= 0) {
            dp_leg_input_failed(dp, c, slot);   /* the input log is shorter than it counted */
            return;
        }
        w = 0;
        int done = send_some(l->fd, dp->buf, (size_t)r, &w);
        if (done < 0) {
            dp_leg_input_failed(dp, c, slot);
            return;
        }
        l->replay_off += w;
        l->replay_left -= w;
        if (!done)
            return;
    }
    if (l->replay_fd >= 0) {
        close(l->replay_fd);
        l->replay_fd = -1;
    }
    while (dp_bytes_size(&l->pending)) {
        w = 0;
        int done = send_some(l->fd, l->pending.p + l->pending.off, dp_bytes_size(&l->pending), &w);
        if (done < 0) {
            dp_leg_input_failed(dp, c, slot);
            return;
        }
        dp_bytes_drop(&l->pending, w);
        dp_queued_less(dp, slot, w);
        if (!done)
            break;
    }
    if (!dp_bytes_size(&l->pending) && l->eof_wanted && !l->in_done) {
        shutdown(l->fd, SHUT_WR);
        l->in_done = true;
    }
    dp_leg_events(dp, c, slot);
    dp_client_release(dp, c);
}

void dp_hex_digest(EVP_MD_CTX *ctx, char hex[65])
{
    unsigned char md[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, md, &n);
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Begun to exit (PF_EXITING), exited, or gone: its sockets close then, and
 * that is no program's close. */
static bool replica_dying(const struct replica *r)
{
    struct pollfd exited = {.fd = r->pidfd, .events = POLLIN};
    if (r->pidfd >= 0 && poll(&exited, 1, 0) > 0)
        return true;
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", r->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0)
        return true;
    stat[n] = 0;
    char *p = strrchr(stat, ')');
    if (p == NULL || p[1] == 0)
        return true;
    char state = p[2];
    unsigned long flags = 0;
    /* fields after ")": state ppid pgrp session tty_nr tpgid flags */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
        return true;
    return state == 'Z' || state == 'X' || (flags & PF_EXITING);
}

static void leg_output_ended(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    dp_hex_digest(l->sha, l->hex);
    EVP_MD_CTX_free(l->sha);
    l->sha = NULL;
    if (l->log_fd >= 0)
        close(l->log_fd);
    l->log_fd = -1;
    if (l->registered)
        epoll_ctl(dp->ep, EPOLL_CTL_DEL, l->fd, NULL);
    close(l->fd);
    l->fd = -1;
    l->registered = false;
    l->out_ended = true;
    if (!l->in_done)
        dp_leg_input_failed(dp, c, slot);
    dp->reps[slot].open_legs--;
    if (slot == dp->primary && !replica_dying(&dp->reps[slot]))
        dp_client_close_when_sent(dp, c);
}

/* A backup keeps what it sent beyond what the client has had. */
static void keep_unsent(struct conn *c, struct leg *l, const char *data, size_t n, uint64_t offset)
{
    uint64_t end = offset + n;
    if (!dp_bytes_size(&l->unsent))
        l->unsent_from = offset;
    uint64_t keep_from = c->sent > l->unsent_from ? c->sent : l->unsent_from;
    if (keep_from > end)
        keep_from = end;
    if (keep_from >= offset) {
        l->unsent.off = l->unsent.len = 0;
        if (keep_from < end && dp_bytes_put(&l->unsent, data + (keep_from - offset), end - keep_from) < 0)
            keep_from = end;   /* out of memory: a takeover would miss these bytes */
    } else {
        dp_bytes_drop(&l->unsent, (size_t)(keep_from - l->unsent_from));
        if (dp_bytes_put(&l->unsent, data, n) < 0) {
            l->unsent.off = l->unsent.len = 0;
            keep_from = end;
        }
    }
    l->unsent_from = keep_from;
}

void dp_leg_readable(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    ssize_t n = read(l->fd, dp->buf, READ_CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        leg_output_ended(dp, c, slot);
        return;
    }
    uint64_t offset = l->out_bytes;
    l->out_bytes += (uint64_t)n;
    EVP_DigestUpdate(l->sha, dp->buf, (size_t)n);
    if (l->log_fd >= 0 && dp_write_file(l->log_fd, dp->buf, (size_t)n) < 0) {
        close(l->log_fd);   /* disk full: the log stops, the service does not */
        l->log_fd = -1;
    }
    if (slot == dp->primary)
        dp_reply(dp, c, slot, dp->buf, (size_t)n, offset);
    else
        keep_unsent(c, l, dp->buf, (size_t)n, offset);
}

struct leg *dp_leg_new(void)
{
    struct leg *l = calloc(1, sizeof *l);
    if (l != NULL)
        l->fd = l->replay_fd = l->log_fd = -1;
    return l;
}

/* slot's leg of c takes fd, its program's end, and goes to work. */
void dp_leg_connect(llft_dp_t *dp, struct conn *c, int slot, int fd)
{
    struct leg *l = c->legs[slot];
    dp_set_nonblocking(fd);
    l->fd = fd;
    l->attached = true;
    dp->reps[slot].open_legs++;
    dp_leg_events(dp, c, slot);
}

int dp_conn_add_leg(struct conn *c, int slot, struct leg *l)
{
    if (slot >= c->nlegs) {
        struct leg **legs = realloc(c->legs, (size_t)(slot + 1) * sizeof *legs);
        if (legs == NULL)
            return -1;
        for (int s = c->nlegs; s <= slot; s++)
            legs[s] = NULL;
        c->legs = legs;
        c->nlegs = slot + 1;
    }
    c->legs[slot] = l;
    return 0;
}

void dp_leg_free(llft_dp_t *dp, struct leg *l)
{
    if (l->registered)
        epoll_ctl(dp->ep, EPOLL_CTL_DEL, l->fd, NULL);
    if (l->fd >= 0)
        close(l->fd);
    if (l->replay_fd >= 0)
        close(l->replay_fd);
    if (l->log_fd >= 0)
        close(l->log_fd);
    EVP_MD_CTX_free(l->sha);
    dp_bytes_free(&l->pending);
    dp_bytes_free(&l->unsent);
    free(l);
}

