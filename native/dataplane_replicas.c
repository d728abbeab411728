/* The data plane's replicas (see dataplane.h): one joining (its legs,
 * with the input log of the connections it never saw), one parked as a
 * stored checkpoint and woken, one leaving, and one taking over as the
 * primary.  Called by the controller, under dp->mu taken here; the
 * plane's thread does the rest (dataplane.c). */
#include "dataplane_state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A leg for a replica joining while connections exist: their logged input
 * first, then what their clients send from now on. */
static int catch_up_leg(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = dp_leg_new();
    if (l == NULL || dp_conn_add_leg(c, slot, l) < 0) {
        free(l);
        return -1;
    }
    if (c->in_bytes) {
        l->replay_fd = dp_open_conn_file(dp->input_dir, c->id, O_RDONLY);
        if (l->replay_fd < 0) {
            l->in_done = true;   /* its history is gone: it will diverge, and be told so */
            return 0;
        }
        l->replay_left = c->in_bytes;
    }
    l->eof_wanted = c->in_ended;
    return 0;
}

/* A parked leg wakes: what the client sent since it was parked comes from
 * the input log, then what it sends from now on. */
static void wake_leg(llft_dp_t *dp, struct conn *c, int slot)
{
    struct leg *l = c->legs[slot];
    l->parked = false;
    if (!l->in_done && c->in_bytes > l->parked_at) {
        l->replay_fd = dp_open_conn_file(dp->input_dir, c->id, O_RDONLY);
        if (l->replay_fd < 0) {
            dp_leg_input_failed(dp, c, slot);   /* its log is gone: it will diverge, and be told so */
            return;
        }
        l->replay_off = l->parked_at;
        l->replay_left = c->in_bytes - l->parked_at;
    }
    dp_leg_events(dp, c, slot);
}

/* Legs for a joining replica: on each connection not done yet, and on
 * each one done, brought back with its input log and a leg for it alone.
 * A parked replica (after: the last connection id when it was parked)
 * wakes its own legs and gets new ones for the connections after it. */
static int catch_up(llft_dp_t *dp, int slot, uint64_t after)
{
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        struct leg *l = dp_leg_get(c, slot);
        if (l != NULL && l->parked)
            wake_leg(dp, c, slot);
        else if (l == NULL && c->id > after && catch_up_leg(dp, c, slot) < 0)
            return -1;
    }
    for (size_t k = 0; k < dp->ngone; k++) {
        if (dp->gone[k].id <= after || dp_conn_get(dp, dp->gone[k].id) != NULL)
            continue;   /* the parked one had it; or brought back for an earlier joiner and given a leg above */
        struct conn *c = calloc(1, sizeof *c);
        if (c == NULL)
            return -1;
        c->id = dp->gone[k].id;
        c->cfd = c->in_fd = -1;
        c->in_bytes = dp->gone[k].in_bytes;
        c->in_ended = c->closing = c->replayed = true;
        c->sent = UINT64_MAX;   /* its client had it all */
        if (catch_up_leg(dp, c, slot) < 0 || llft_idmap_put(&dp->conns, c->id, c) < 0) {
            free(c->legs ? c->legs[slot] : NULL);
            free(c->legs);
            free(c);
            return -1;
        }
    }
    return 0;
}

/* A new slot, live, with nothing yet; -1 (ENOMEM). */
int dp_new_replica(llft_dp_t *dp, int pid, int pidfd, const char *log_dir)
{
    struct replica *reps = realloc(dp->reps, (size_t)(dp->nreps + 1) * sizeof *reps);
    if (reps == NULL)
        return -1;
    dp->reps = reps;
    struct replica *r = &reps[dp->nreps];
    memset(r, 0, sizeof *r);
    r->pid = pid;
    r->pidfd = pidfd;
    r->live = true;
    r->log_dir = log_dir ? strdup(log_dir) : NULL;
    return dp->nreps++;
}

int llft_dp_add_replica(llft_dp_t *dp, int pid, int pidfd, const char *log_dir)
{
    pthread_mutex_lock(&dp->mu);
    int slot = dp_new_replica(dp, pid, pidfd, log_dir);
    if (slot >= 0 && dp->input_dir != NULL && catch_up(dp, slot, 0) < 0) {
        errno = ENOMEM;
        slot = -1;   /* the replica stays without those connections; the caller fails it */
    }
    pthread_mutex_unlock(&dp->mu);
    return slot;
}

int llft_dp_park(llft_dp_t *dp, int slot, uint64_t *after)
{
    pthread_mutex_lock(&dp->mu);
    int rc = -1;
    if (slot < 0 || slot >= dp->nreps || !dp->reps[slot].live || dp->reps[slot].parked || dp->input_dir == NULL) {
        errno = EINVAL;
        goto out;
    }
    struct replica *r = &dp->reps[slot];
    r->parked = true;
    r->parked_after = *after = dp->last_id;
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        struct leg *l = dp_leg_get(c, slot);
        if (l == NULL || l->in_done)
            continue;
        size_t queued = dp_bytes_size(&l->pending);
        l->parked_at = c->in_bytes - queued - l->replay_left;
        l->parked = true;
        dp_bytes_free(&l->pending);
        if (queued)
            dp_queued_less(dp, slot, queued);
        if (l->replay_fd >= 0)
            close(l->replay_fd);
        l->replay_fd = -1;
        l->replay_left = 0;
        dp_leg_events(dp, c, slot);
    }
    rc = 0;
out:
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

int llft_dp_wake(llft_dp_t *dp, int slot, const char *log_dir)
{
    pthread_mutex_lock(&dp->mu);
    int rc = -1;
    if (slot < 0 || slot >= dp->nreps || !dp->reps[slot].parked) {
        errno = EINVAL;
        goto out;
    }
    struct replica *r = &dp->reps[slot];
    char *dir = log_dir ? strdup(log_dir) : NULL;
    if (log_dir && dir == NULL) {
        errno = ENOMEM;
        goto out;
    }
    free(r->log_dir);
    r->log_dir = dir;
    r->parked = false;
    if (catch_up(dp, slot, r->parked_after) < 0) {
        errno = ENOMEM;
        goto out;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

long llft_dp_forget_through(llft_dp_t *dp, uint64_t id)
{
    pthread_mutex_lock(&dp->mu);
    size_t kept = 0;
    long forgotten = 0;
    for (size_t k = 0; k < dp->ngone; k++) {
        if (dp->gone[k].id > id) {
            dp->gone[kept++] = dp->gone[k];
            continue;
        }
        if (dp->input_dir != NULL)
            dp_unlink_conn_file(dp->input_dir, dp->gone[k].id);
        forgotten++;
    }
    dp->ngone = kept;
    pthread_mutex_unlock(&dp->mu);
    return forgotten;
}

void llft_dp_remove_replica(llft_dp_t *dp, int slot)
{
    pthread_mutex_lock(&dp->mu);
    if (slot >= 0 && slot < dp->nreps && dp->reps[slot].live) {
        dp->reps[slot].live = false;
        for (uint64_t i = 0; i < dp->conns.cap; i++) {
            if (!llft_idmap_at(&dp->conns, i))
                continue;
            struct conn *c = dp->conns.vals[i];
            if (dp_leg_get(c, slot) != NULL && !c->legs[slot]->in_done)
                dp_leg_input_failed(dp, c, slot);
            dp_conn_settle(dp, c);   /* it may have waited for this replica alone */
        }
        dp->reps[slot].queued = 0;
        dp_queued_less(dp, slot, 0);   /* it no longer holds the clients back */
    }
    pthread_mutex_unlock(&dp->mu);
}

void llft_dp_set_primary(llft_dp_t *dp, int slot)
{
    pthread_mutex_lock(&dp->mu);
    dp->primary = slot;
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        dp_resume_legs(dp, c);   /* an old primary's paused leg is only digested now */
        struct leg *l = dp_leg_get(c, slot);
        if (l == NULL || !l->attached)
            continue;
        if (dp_bytes_size(&l->unsent)) {
            struct bytes kept = l->unsent;
            memset(&l->unsent, 0, sizeof l->unsent);
            dp_reply(dp, c, slot, kept.p + kept.off, dp_bytes_size(&kept), l->unsent_from);
            dp_bytes_free(&kept);
        }
        if (l->out_ended)
            dp_client_close_when_sent(dp, c);
        dp_conn_settle(dp, c);
    }
    pthread_mutex_unlock(&dp->mu);
}
