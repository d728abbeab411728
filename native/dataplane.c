/* The controller's native data plane: see dataplane.h.  One thread, one
 * epoll set, level-triggered; the sockets are non-blocking.  A client's
 * bytes are written straight from the read buffer to every leg whose queue
 * is empty, so the common case copies nothing.  This file: the thread, the
 * connections done, and the API; dataplane_client.c and dataplane_legs.c
 * each side of a connection, dataplane_bytes.c their queues and files. */
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

#define MAX_EVENTS 256

void dp_epoll_set(llft_dp_t *dp, int fd, bool *registered, uint32_t *events, uint32_t want, uint64_t tag)
{
    if (*registered && want == *events)
        return;
    struct epoll_event ev = {.events = want, .data.u64 = tag};
    epoll_ctl(dp->ep, *registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
    *registered = true;
    *events = want;
}

struct conn *dp_conn_get(llft_dp_t *dp, uint64_t id) { return llft_idmap_get(&dp->conns, id); }

struct leg *dp_leg_get(struct conn *c, int slot) { return slot >= 0 && slot < c->nlegs ? c->legs[slot] : NULL; }

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
        dp_leg_free(dp, l);
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
            dp_client_writable(dp, c);
        if (c->cfd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
            dp_client_readable(dp, c, events);
        return;
    }
    struct leg *l = dp_leg_get(c, slot);
    if (l == NULL || l->fd < 0)
        return;   /* closed earlier in this batch */
    if ((events & (EPOLLOUT | EPOLLERR)) && !l->in_done)
        dp_leg_writable(dp, c, slot);
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
                dp_hex_digest(l->sha, l->hex);
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
    dp_set_nonblocking(client_fd);
    if (conn_id > dp->last_id)
        dp->last_id = conn_id;
    dp->st.connections++;
    dp->st.open_clients++;
    dp_client_events(dp, c);
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
            dp_hex_digest(tmp, hex);
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
