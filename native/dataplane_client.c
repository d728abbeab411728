/* The client's side of a connection in the data plane: its reads (each
 * written to every replica's leg), the replies it is sent, and the
 * back-pressure that stops reading a client whose replies, or whose
 * replicas, are behind.  Called by the plane's thread under dp->mu. */
#include "dataplane_state.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLIENT_OUT_LIMIT (4u << 20)   /* queued for one client beyond this: its primary's leg is not read */
#define CONN_BACKLOG (1u << 20)       /* a client with this much queued (to it, or to one of its legs) is not read */

void dp_client_events(llft_dp_t *dp, struct conn *c)
{
    if (c->cfd < 0)
        return;
    uint32_t want = (c->in_ended || c->rd_paused) ? 0 : EPOLLIN;
    if (dp_bytes_size(&c->out))
        want |= EPOLLOUT;
    dp_epoll_set(dp, c->cfd, &c->registered, &c->events, want, c->id);
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
        dp_client_events(dp, c);
    }
}

/* Reads c again if nothing holds it any more (with hysteresis). */
void dp_client_release(llft_dp_t *dp, struct conn *c)
{
    if (!c->rd_paused || conn_backlogged(c, 2))
        return;
    if (dp->paused) {
        client_hold(dp, c);   /* the replicas' backlog still holds it: be listed */
        return;
    }
    c->rd_paused = false;
    dp_client_events(dp, c);
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
            dp_client_release(dp, c);
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
    ssize_t queued = dp_send_or_queue(c->cfd, &c->out, data, n, !dp_bytes_size(&c->out));
    if (queued < 0) {
        client_close(dp, c);   /* or out of memory: this client loses its connection, not the group */
        return;
    }
    if (queued == 0)
        return;
    dp_client_events(dp, c);
    struct leg *l = dp_leg_get(c, slot);
    if (l != NULL && dp_bytes_size(&c->out) > CLIENT_OUT_LIMIT && !l->rd_paused) {
        l->rd_paused = true;
        dp_leg_events(dp, c, slot);
    }
}

void dp_client_writable(llft_dp_t *dp, struct conn *c)
{
    while (dp_bytes_size(&c->out)) {
        ssize_t w = send(c->cfd, c->out.p + c->out.off, dp_bytes_size(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            client_close(dp, c);
            return;
        }
        dp_bytes_drop(&c->out, (size_t)w);
    }
    if (dp_bytes_size(&c->out) <= CLIENT_OUT_LIMIT / 2)
        dp_resume_legs(dp, c);
    dp_client_release(dp, c);
    if (!dp_bytes_size(&c->out) && c->closing) {
        client_close(dp, c);
        return;
    }
    dp_client_events(dp, c);
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
    dp_client_events(dp, c);
}

void dp_client_readable(llft_dp_t *dp, struct conn *c, uint32_t events)
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
        if (c->in_fd >= 0 && dp_write_file(c->in_fd, dp->buf, (size_t)n) < 0) {
            close(c->in_fd);   /* a replica joining later could not be given this input */
            c->in_fd = -1;
        }
        for (int s = 0; s < c->nlegs; s++)
            if (c->legs[s] != NULL)
                dp_leg_send(dp, c, s, dp->buf, (size_t)n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    client_input_ended(dp, c);
    if (n < 0 || hangup)
        client_close(dp, c);
}
