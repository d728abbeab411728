/* The controller's native data plane: see dataplane.h.  One thread, one
 * epoll set, level-triggered; the sockets are non-blocking.  A client's
 * bytes are written straight from the read buffer to every leg whose queue
 * is empty, so the common case copies nothing. */
#include "dataplane_state.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLIENT_OUT_LIMIT (4u << 20)   /* queued for one client beyond this: its primary's leg is not read */
#define CONN_BACKLOG (1u << 20)       /* a client with this much queued (to it, or to one of its legs) is not read */
#define MAX_EVENTS 256
#define TAG_SLOT_SHIFT 48             /* epoll tag: (leg slot + 1) << 48 | connection id; 0 << 48: the client */
#define TAG_ID_MASK ((1ull << TAG_SLOT_SHIFT) - 1)
#define TAG_WAKE UINT64_MAX
#define PF_EXITING 0x4

/* -- byte queues -------------------------------------------------------- */

size_t dp_bytes_size(const struct bytes *b) { return b->len - b->off; }

int dp_bytes_put(struct bytes *b, const void *data, size_t n)
{
    if (b->len + n > b->cap && b->off) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;   /* most requests are small: a 4 KiB start cost 4 KiB a leg */
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static void bytes_drop(struct bytes *b, size_t n)
{
    b->off += n;
    if (b->off == b->len)
        b->off = b->len = 0;
}

void dp_bytes_free(struct bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

struct conn *dp_conn_get(llft_dp_t *dp, uint64_t id) { return llft_idmap_get(&dp->conns, id); }

struct leg *dp_leg_get(struct conn *c, int slot) { return slot >= 0 && slot < c->nlegs ? c->legs[slot] : NULL; }

static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static int write_file(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void conn_file_path(char path[PATH_MAX], const char *dir, uint64_t id)
{
    snprintf(path, PATH_MAX, "%s/conn-%llu", dir, (unsigned long long)id);
}

int dp_open_conn_file(const char *dir, uint64_t id, int flags)
{
    char path[PATH_MAX];
    conn_file_path(path, dir, id);
    return open(path, flags | O_CLOEXEC, 0644);
}

void dp_unlink_conn_file(const char *dir, uint64_t id)
{
    char path[PATH_MAX];
    conn_file_path(path, dir, id);
    unlink(path);
}

static void epoll_set(llft_dp_t *dp, int fd, bool *registered, uint32_t *events, uint32_t want, uint64_t tag)
{
    if (*registered && want == *events)
        return;
    struct epoll_event ev = {.events = want, .data.u64 = tag};
    epoll_ctl(dp->ep, *registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
    *registered = true;
    *events = want;
}

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
    epoll_set(dp, l->fd, &l->registered, &l->events, want, leg_tag(c, slot));
}

static void client_events(llft_dp_t *dp, struct conn *c)
{
    if (c->cfd < 0)
        return;
    uint32_t want = (c->in_ended || c->rd_paused) ? 0 : EPOLLIN;
    if (dp_bytes_size(&c->out))
        want |= EPOLLOUT;
    epoll_set(dp, c->cfd, &c->registered, &c->events, want, c->id);
}

/* -- back-pressure ------------------------------------------------------ */

/* A client whose replies go unread, or whose program does not read what
 * it sent, is held on its own: the others go on being served. */
static bool conn_backlogged(const struct conn *c, unsigned divisor)
{
    if (dp_bytes_size(&c->out) > CONN_BACKLOG / divisor)
        return true;
    for (int s = 0; s < c->nlegs; s++)
        if (c->legs[s] != NULL && dp_bytes_size(&c->legs[s]->pending) > CONN_BACKLOG / divisor)
            return true;
    return false;
}

/* Stops reading c; while the replicas are behind (dp->paused) it is listed
 * to be read again once they catch up. */
static void client_hold(llft_dp_t *dp, struct conn *c)
{
    if (dp->paused && !c->listed) {
        if (dp->npaused == dp->cappaused) {
            size_t cap = dp->cappaused ? dp->cappaused * 2 : 64;
            uint64_t *p = realloc(dp->paused_ids, cap * sizeof *p);
            if (p == NULL)
                return;   /* stays readable: memory over back-pressure */
            dp->paused_ids = p;
            dp->cappaused = cap;
        }
        dp->paused_ids[dp->npaused++] = c->id;
        c->listed = true;
    }
    if (!c->rd_paused) {
        c->rd_paused = true;
        client_events(dp, c);
    }
}

/* Reads c again if nothing holds it any more (with hysteresis). */
static void client_release(llft_dp_t *dp, struct conn *c)
{
    if (!c->rd_paused || conn_backlogged(c, 2))
        return;
    if (dp->paused) {
        client_hold(dp, c);   /* the replicas' backlog still holds it: be listed */
        return;
    }
    c->rd_paused = false;
    client_events(dp, c);
}

void dp_queued_less(llft_dp_t *dp, int slot, uint64_t n)
{
    dp->reps[slot].queued -= n;
    if (!dp->paused)
        return;
    for (int k = 0; k < dp->nreps; k++)
        if (dp->reps[k].live && dp->reps[k].queued > dp->queue_limit / 2)
            return;
    dp->paused = false;
    for (size_t i = 0; i < dp->npaused; i++) {
        struct conn *c = dp_conn_get(dp, dp->paused_ids[i]);
        if (c != NULL) {
            c->listed = false;
            client_release(dp, c);
        }
    }
    dp->npaused = 0;
}

void dp_resume_legs(llft_dp_t *dp, struct conn *c)
{
    for (int s = 0; s < c->nlegs; s++)
        if (c->legs[s] != NULL && c->legs[s]->rd_paused) {
            c->legs[s]->rd_paused = false;
            dp_leg_events(dp, c, s);
        }
}

/* -- the client side ---------------------------------------------------- */

static void client_input_ended(llft_dp_t *dp, struct conn *c);

/* Closes the client's socket now; its input has ended then too. */
static void client_close(llft_dp_t *dp, struct conn *c)
{
    if (c->cfd < 0)
        return;
    if (c->registered)
        epoll_ctl(dp->ep, EPOLL_CTL_DEL, c->cfd, NULL);
    close(c->cfd);
    c->cfd = -1;
    c->registered = false;
    dp->st.open_clients--;
    dp_bytes_free(&c->out);
    if (!c->in_ended)
        client_input_ended(dp, c);
    dp_resume_legs(dp, c);
}

void dp_client_close_when_sent(llft_dp_t *dp, struct conn *c)
{
    c->closing = true;
    if (!dp_bytes_size(&c->out))
        client_close(dp, c);
}

/* Sends what fd takes at once (only if now: nothing is queued ahead) and
 * queues the rest in q.  Returns the bytes queued, or -1: fd failed or
 * memory ran out. */
static ssize_t send_or_queue(int fd, struct bytes *q, const char *data, size_t n, bool now)
{
    if (now) {
        ssize_t w = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        if (w > 0) {
            data += w;
            n -= (size_t)w;
        }
    }
    if (n && dp_bytes_put(q, data, n) < 0)
        return -1;
    return (ssize_t)n;
}

/* What of data (at offset in the connection's output) the client has not
 * had goes to it: after a takeover the new primary repeats, byte for byte,
 * what the old one had sent. */
void dp_reply(llft_dp_t *dp, struct conn *c, int slot, const char *data, size_t n, uint64_t offset)
{
    if (c->sent >= offset + n)
        return;
    size_t skip = c->sent > offset ? (size_t)(c->sent - offset) : 0;
    c->sent = offset + n;
    data += skip;
    n -= skip;
    if (c->cfd < 0 || c->closing)
        return;
    dp->st.bytes_out += n;
    ssize_t queued = send_or_queue(c->cfd, &c->out, data, n, !dp_bytes_size(&c->out));
    if (queued < 0) {
        client_close(dp, c);   /* or out of memory: this client loses its connection, not the group */
        return;
    }
    if (queued == 0)
        return;
    client_events(dp, c);
    struct leg *l = dp_leg_get(c, slot);
    if (l != NULL && dp_bytes_size(&c->out) > CLIENT_OUT_LIMIT && !l->rd_paused) {
        l->rd_paused = true;
        dp_leg_events(dp, c, slot);
    }
}

static void client_writable(llft_dp_t *dp, struct conn *c)
{
    while (dp_bytes_size(&c->out)) {
        ssize_t w = send(c->cfd, c->out.p + c->out.off, dp_bytes_size(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            client_close(dp, c);
            return;
        }
        bytes_drop(&c->out, (size_t)w);
    }
    if (dp_bytes_size(&c->out) <= CLIENT_OUT_LIMIT / 2)
        dp_resume_legs(dp, c);
    client_release(dp, c);
    if (!dp_bytes_size(&c->out) && c->closing) {
        client_close(dp, c);
        return;
    }
    client_events(dp, c);
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
    client_release(dp, c);
}

/* data for slot's program: written now if nothing is ahead of it. */
static void leg_send(llft_dp_t *dp, struct conn *c, int slot, const char *data, size_t n)
{
    struct leg *l = c->legs[slot];
    if (l->in_done || l->parked)
        return;   /* (a parked leg takes it from the input log when it wakes) */
    ssize_t queued = send_or_queue(l->fd, &l->pending, data, n, l->fd >= 0 && !dp->reps[slot].held &&
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

static void leg_writable(llft_dp_t *dp, struct conn *c, int slot)
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
        bytes_drop(&l->pending, w);
        dp_queued_less(dp, slot, w);
        if (!done)
            break;
    }
    if (!dp_bytes_size(&l->pending) && l->eof_wanted && !l->in_done) {
        shutdown(l->fd, SHUT_WR);
        l->in_done = true;
    }
    dp_leg_events(dp, c, slot);
    client_release(dp, c);
}

static void hex_digest(EVP_MD_CTX *ctx, char hex[65])
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
    hex_digest(l->sha, l->hex);
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
        bytes_drop(&l->unsent, (size_t)(keep_from - l->unsent_from));
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
    if (l->log_fd >= 0 && write_file(l->log_fd, dp->buf, (size_t)n) < 0) {
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
    set_nonblocking(fd);
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

/* -- the client's input ------------------------------------------------- */

static void client_input_ended(llft_dp_t *dp, struct conn *c)
{
    c->in_ended = true;
    if (c->in_fd >= 0) {
        close(c->in_fd);
        c->in_fd = -1;
    }
    for (int s = 0; s < c->nlegs; s++)
        if (c->legs[s] != NULL) {
            c->legs[s]->eof_wanted = true;
            dp_leg_events(dp, c, s);
        }
    client_events(dp, c);
}

static void client_readable(llft_dp_t *dp, struct conn *c, uint32_t events)
{
    bool hangup = events & (EPOLLHUP | EPOLLERR);
    if (!hangup && (dp->paused || conn_backlogged(c, 1))) {
        client_hold(dp, c);
        return;
    }
    if (c->in_ended) {
        if (hangup)
            client_close(dp, c);
        return;
    }
    ssize_t n = read(c->cfd, dp->buf, READ_CHUNK);
    if (n > 0) {
        c->in_bytes += (uint64_t)n;
        dp->st.bytes_in += (uint64_t)n;
        if (c->in_fd >= 0 && write_file(c->in_fd, dp->buf, (size_t)n) < 0) {
            close(c->in_fd);   /* a replica joining later could not be given this input */
            c->in_fd = -1;
        }
        for (int s = 0; s < c->nlegs; s++)
            if (c->legs[s] != NULL)
                leg_send(dp, c, s, dp->buf, (size_t)n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    client_input_ended(dp, c);
    if (n < 0 || hangup)
        client_close(dp, c);
}

/* -- connections done ----------------------------------------------------- */

/* Done on every side: the client is closed and every live replica's
 * program has closed its side (a leg that could not be made counts as
 * closed).  A failed replica's legs hold nothing back. */
static bool conn_done(const llft_dp_t *dp, const struct conn *c)
{
    if (c->cfd >= 0)
        return false;
    for (int s = 0; s < c->nlegs; s++) {
        const struct leg *l = c->legs[s];
        if (l != NULL && dp->reps[s].live && !l->out_ended)
            return false;
    }
    return true;
}

static void fold_closed(struct replica *r, uint64_t id, const struct leg *l)
{
    char line[128];
    unsigned char md[32];
    unsigned int n = 0;
    int len = snprintf(line, sizeof line, "%llu %llu %s", (unsigned long long)id, (unsigned long long)l->out_bytes,
                       l->hex);
    EVP_Digest(line, (size_t)len, md, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        r->closed_xor[i] ^= md[i];
    r->closed_conns++;
    r->closed_bytes += l->out_bytes;
}

static void leg_free(llft_dp_t *dp, struct leg *l)
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

/* A connection done on every side is folded into each replica's closed
 * summary and freed: what the plane holds follows the connections open,
 * not every connection the group has served.  With an input directory
 * its id and input length stay, for a replica that joins later. */
void dp_conn_settle(llft_dp_t *dp, struct conn *c)
{
    if (!conn_done(dp, c))
        return;
    for (int s = 0; s < c->nlegs; s++) {
        struct leg *l = c->legs[s];
        if (l == NULL)
            continue;
        if (l->attached && l->out_ended && dp->reps[s].live)
            fold_closed(&dp->reps[s], c->id, l);
        if (l->fd >= 0)
            dp->reps[s].open_legs--;
        if (l->waiting)
            dp->reps[s].waiting--;
        if (dp_bytes_size(&l->pending))
            dp_queued_less(dp, s, dp_bytes_size(&l->pending));
        leg_free(dp, l);
    }
    if (dp->input_dir != NULL && !c->replayed) {
        if (dp->ngone == dp->capgone) {
            size_t cap = dp->capgone ? dp->capgone * 2 : 256;
            struct gone *g = realloc(dp->gone, cap * sizeof *g);
            if (g != NULL) {
                dp->gone = g;
                dp->capgone = cap;
            }
        }
        if (dp->ngone < dp->capgone)   /* (out of memory: a replica joining later would lack it) */
            dp->gone[dp->ngone++] = (struct gone){c->id, c->in_bytes};
    }
    if (c->in_fd >= 0)
        close(c->in_fd);
    llft_idmap_del(&dp->conns, c->id);
    free(c->legs);
    free(c);
}

/* -- the thread --------------------------------------------------------- */

static void dispatch_conn(llft_dp_t *dp, struct conn *c, int slot, uint32_t events)
{
    if (slot < 0) {
        if (c->cfd >= 0 && (events & EPOLLOUT))
            client_writable(dp, c);
        if (c->cfd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
            client_readable(dp, c, events);
        return;
    }
    struct leg *l = dp_leg_get(c, slot);
    if (l == NULL || l->fd < 0)
        return;   /* closed earlier in this batch */
    if ((events & (EPOLLOUT | EPOLLERR)) && !l->in_done)
        leg_writable(dp, c, slot);
    if (l->fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        dp_leg_readable(dp, c, slot);
}

static void dispatch(llft_dp_t *dp, uint64_t tag, uint32_t events)
{
    struct conn *c = dp_conn_get(dp, tag & TAG_ID_MASK);
    if (c == NULL)
        return;   /* settled earlier in this batch */
    dispatch_conn(dp, c, (int)(tag >> TAG_SLOT_SHIFT) - 1, events);
    dp_conn_settle(dp, c);
}

static void *dp_main(void *arg)
{
    llft_dp_t *dp = arg;
    struct epoll_event ev[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(dp->ep, ev, MAX_EVENTS, -1);
        if (n < 0 && errno != EINTR)
            break;
        pthread_mutex_lock(&dp->mu);
        if (dp->stopped) {
            pthread_mutex_unlock(&dp->mu);
            break;
        }
        /* Clients and the primary's legs first: what a client waits for
         * goes before the backups' digests (SHA-256 costs about 1 us/KiB). */
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < n; i++) {
                uint64_t tag = ev[i].data.u64;
                int slot = (int)(tag >> TAG_SLOT_SHIFT) - 1;
                if (tag != TAG_WAKE && (slot < 0 || slot == dp->primary) == (pass == 0))
                    dispatch(dp, tag, ev[i].events);
            }
        pthread_mutex_unlock(&dp->mu);
    }
    return NULL;
}

/* -- the API ------------------------------------------------------------ */

llft_dp_t *llft_dp_new(const char *input_dir, uint64_t queue_limit)
{
    llft_dp_t *dp = calloc(1, sizeof *dp);
    if (dp == NULL)
        return NULL;
    pthread_mutex_init(&dp->mu, NULL);
    dp->primary = -1;
    dp->queue_limit = queue_limit;
    dp->ep = epoll_create1(EPOLL_CLOEXEC);
    dp->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dp->input_dir = input_dir ? strdup(input_dir) : NULL;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_WAKE};
    if (dp->ep < 0 || dp->wake < 0 || (input_dir && !dp->input_dir) ||
        epoll_ctl(dp->ep, EPOLL_CTL_ADD, dp->wake, &ev) < 0) {
        llft_dp_free(dp);
        return NULL;
    }
    return dp;
}

int llft_dp_start(llft_dp_t *dp)
{
    if (dp->started)
        return 0;
    int err = pthread_create(&dp->thread, NULL, dp_main, dp);
    if (err) {
        errno = err;
        return -1;
    }
    dp->started = true;
    return 0;
}

void llft_dp_stop(llft_dp_t *dp)
{
    pthread_mutex_lock(&dp->mu);
    bool was = dp->stopped;
    dp->stopped = true;
    uint64_t one = 1;
    if (write(dp->wake, &one, sizeof one) < 0) {
        /* the counter is full: the thread is awake already */
    }
    pthread_mutex_unlock(&dp->mu);
    if (was)
        return;
    if (dp->started)
        pthread_join(dp->thread, NULL);
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        if (c->cfd >= 0) {
            close(c->cfd);
            c->cfd = -1;
            dp->st.open_clients--;
        }
        if (c->in_fd >= 0)
            close(c->in_fd);
        c->in_fd = -1;
        for (int s = 0; s < c->nlegs; s++) {
            struct leg *l = c->legs[s];
            if (l == NULL)
                continue;
            if (l->fd >= 0) {
                hex_digest(l->sha, l->hex);
                EVP_MD_CTX_free(l->sha);
                l->sha = NULL;
                close(l->fd);
                l->fd = -1;
                l->out_ended = true;
                dp->reps[s].open_legs--;
            }
            if (l->replay_fd >= 0)
                close(l->replay_fd);
            if (l->log_fd >= 0)
                close(l->log_fd);
            l->replay_fd = l->log_fd = -1;
            dp_bytes_free(&l->pending);
            dp_bytes_free(&l->unsent);
        }
        dp_bytes_free(&c->out);
    }
}

void llft_dp_free(llft_dp_t *dp)
{
    if (dp == NULL)
        return;
    llft_dp_stop(dp);
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        for (int s = 0; s < c->nlegs; s++)
            free(c->legs[s]);
        free(c->legs);
        free(c);
    }
    for (int k = 0; k < dp->nreps; k++) {
        if (dp->reps[k].pidfd >= 0)
            close(dp->reps[k].pidfd);
        free(dp->reps[k].log_dir);
    }
    if (dp->ep >= 0)
        close(dp->ep);
    if (dp->wake >= 0)
        close(dp->wake);
    llft_idmap_free(&dp->conns);
    free(dp->gone);
    free(dp->reps);
    free(dp->paused_ids);
    free(dp->input_dir);
    pthread_mutex_destroy(&dp->mu);
    free(dp);
}

int llft_dp_open_conn(llft_dp_t *dp, uint64_t conn_id, int client_fd)
{
    if (conn_id == 0 || conn_id > TAG_ID_MASK) {
        errno = EINVAL;
        return -1;
    }
    pthread_mutex_lock(&dp->mu);
    int rc = -1;
    struct conn *c = NULL;
    if (dp_conn_get(dp, conn_id) != NULL || dp->stopped) {
        errno = EEXIST;
        goto out;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL)
        goto out;
    c->id = conn_id;
    c->cfd = client_fd;
    c->in_fd = -1;
    for (int s = 0; s < dp->nreps; s++) {
        if (!dp->reps[s].live || dp->reps[s].parked)
            continue;   /* (a parked replica gets its legs when it wakes) */
        struct leg *l = dp_leg_new();
        if (l == NULL || dp_conn_add_leg(c, s, l) < 0) {
            free(l);
            goto fail;
        }
    }
    for (int s = 0; s < c->nlegs; s++)
        if (c->legs[s] != NULL) {
            c->legs[s]->waiting = true;
            dp->reps[s].waiting++;
        }
    if (dp->input_dir != NULL && (c->in_fd = dp_open_conn_file(dp->input_dir, conn_id, O_WRONLY | O_CREAT | O_TRUNC)) < 0)
        goto fail;
    if (llft_idmap_put(&dp->conns, conn_id, c) < 0)
        goto fail;
    set_nonblocking(client_fd);
    if (conn_id > dp->last_id)
        dp->last_id = conn_id;
    dp->st.connections++;
    dp->st.open_clients++;
    client_events(dp, c);
    rc = 0;
    goto out;
fail:
    for (int s = 0; s < c->nlegs; s++)
        free(c->legs[s]);
    free(c->legs);
    free(c);
out:
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

int llft_dp_attach(llft_dp_t *dp, int slot, uint64_t conn_id, int fd)
{
    pthread_mutex_lock(&dp->mu);
    struct conn *c = dp_conn_get(dp, conn_id);
    struct leg *l = c ? dp_leg_get(c, slot) : NULL;
    int rc = -1;
    if (l == NULL || l->attached || dp->stopped) {
        if (fd >= 0)
            close(fd);
        errno = ENOENT;
        goto out;
    }
    rc = 0;
    if (l->waiting) {
        l->waiting = false;
        dp->reps[slot].waiting--;
    }
    if (fd < 0) {
        if (!l->in_done)
            dp_leg_input_failed(dp, c, slot);
        l->out_ended = true;   /* nothing will come: as closed */
        dp_conn_settle(dp, c);
        goto out;
    }
    l->sha = EVP_MD_CTX_new();
    if (l->sha == NULL || EVP_DigestInit_ex(l->sha, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(l->sha);
        l->sha = NULL;
        close(fd);
        if (!l->in_done)
            dp_leg_input_failed(dp, c, slot);
        l->out_ended = true;
        dp_conn_settle(dp, c);
        errno = ENOMEM;
        rc = -1;
        goto out;
    }
    const char *log_dir = dp->reps[slot].log_dir;
    if (log_dir != NULL)
        l->log_fd = dp_open_conn_file(log_dir, conn_id, O_WRONLY | O_CREAT | O_TRUNC);
    dp_leg_connect(dp, c, slot, fd);
out:
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

long llft_dp_summary(llft_dp_t *dp, int slot, char *out, long cap)
{
    pthread_mutex_lock(&dp->mu);
    long len = 0;
    EVP_MD_CTX *tmp = EVP_MD_CTX_new();
    for (uint64_t i = 0; i < dp->conns.cap && tmp != NULL; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        uint64_t id = c->id;
        struct leg *l = dp_leg_get(c, slot);
        if (l == NULL || !l->attached)
            continue;
        char hex[65];
        if (l->sha != NULL) {
            EVP_MD_CTX_copy_ex(tmp, l->sha);
            hex_digest(tmp, hex);
        } else {
            memcpy(hex, l->hex, sizeof hex);
        }
        char line[128];
        int n = snprintf(line, sizeof line, "%llu %llu %d %s\n", (unsigned long long)id,
                         (unsigned long long)l->out_bytes, l->out_ended, hex);
        if (len + n <= cap)
            memcpy(out + len, line, (size_t)n);
        len += n;
    }
    if (slot >= 0 && slot < dp->nreps && dp->reps[slot].closed_conns) {
        const struct replica *r = &dp->reps[slot];
        char line[160];
        int n = snprintf(line, sizeof line, "closed %llu %llu ", (unsigned long long)r->closed_conns,
                         (unsigned long long)r->closed_bytes);
        for (int k = 0; k < 32; k++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%02x", r->closed_xor[k]);
        line[n++] = '\n';
        if (len + n <= cap)
            memcpy(out + len, line, (size_t)n);
        len += n;
    }
    EVP_MD_CTX_free(tmp);
    pthread_mutex_unlock(&dp->mu);
    return len;
}

int llft_dp_accepting(llft_dp_t *dp, uint64_t max_waiting)
{
    pthread_mutex_lock(&dp->mu);
    int ok = 1;
    for (int k = 0; k < dp->nreps; k++)
        if (dp->reps[k].live && !dp->reps[k].parked && dp->reps[k].waiting >= max_waiting)
            ok = 0;
    pthread_mutex_unlock(&dp->mu);
    return ok;
}

int llft_dp_open_legs(llft_dp_t *dp, int slot)
{
    pthread_mutex_lock(&dp->mu);
    int n = slot >= 0 && slot < dp->nreps ? dp->reps[slot].open_legs : 0;
    pthread_mutex_unlock(&dp->mu);
    return n;
}

void llft_dp_close_clients(llft_dp_t *dp)
{
    pthread_mutex_lock(&dp->mu);
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        if (c->cfd >= 0)
            dp_client_close_when_sent(dp, c);
        dp_conn_settle(dp, c);
    }
    pthread_mutex_unlock(&dp->mu);
}

void llft_dp_stats(llft_dp_t *dp, llft_dp_stats_t *out)
{
    pthread_mutex_lock(&dp->mu);
    *out = dp->st;
    out->held = dp->conns.live;
    pthread_mutex_unlock(&dp->mu);
}
