/* A replica of the data plane cloned from another: the clone of a backup
 * that a checkpoint restores beside it (llft/checkpoint/).  See
 * dataplane.h, llft_dp_clone_replica. */
#include "dataplane_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What src's program has sent on l, read now: src is frozen, so this is
 * everything up to the checkpoint. */
static void read_all_output(llft_dp_t *dp, struct conn *c, int src)
{
    struct leg *l = c->legs[src];
    while (l->fd >= 0) {
        uint64_t before = l->out_bytes;
        dp_leg_readable(dp, c, src);
        if (l->fd >= 0 && l->out_bytes == before)
            break;
    }
}

/* --log-output: the clone's log of a connection starts as src's. */
static int copy_log(const llft_dp_t *dp, int src, int slot, uint64_t id)
{
    const char *from = dp->reps[src].log_dir, *to = dp->reps[slot].log_dir;
    if (from == NULL || to == NULL)
        return -1;
    int out = dp_open_conn_file(to, id, O_WRONLY | O_CREAT | O_TRUNC);
    int in = dp_open_conn_file(from, id, O_RDONLY);
    if (out >= 0 && in >= 0)
        while (copy_file_range(in, NULL, out, NULL, 1 << 20, 0) > 0)
            ;
    if (in >= 0)
        close(in);
    return out;
}

static struct leg *clone_leg(llft_dp_t *dp, struct conn *c, int src, int slot, int *state)
{
    struct leg *l = c->legs[src], *n = dp_leg_new();
    if (n == NULL)
        return NULL;
    if (dp_bytes_size(&l->pending) && dp_bytes_put(&n->pending, l->pending.p + l->pending.off,
                                                   dp_bytes_size(&l->pending)) < 0)
        goto fail;
    if (dp_bytes_size(&l->unsent) && dp_bytes_put(&n->unsent, l->unsent.p + l->unsent.off,
                                                  dp_bytes_size(&l->unsent)) < 0)
        goto fail;
    n->unsent_from = l->unsent_from;
    n->out_bytes = l->out_bytes;
    n->eof_wanted = l->eof_wanted;
    n->parked = l->parked;   /* (a copy of a stored checkpoint's slot: parked as it is) */
    n->parked_at = l->parked_at;
    if (!l->attached) {
        *state = LLFT_DP_LEG_WAITING;
        n->waiting = true;
        dp->reps[slot].waiting++;
        dp->reps[slot].queued += dp_bytes_size(&n->pending);   /* (queued_less takes it off as it goes out) */
        return n;
    }
    if (l->out_ended) {
        *state = LLFT_DP_LEG_ENDED;
        n->attached = n->out_ended = n->in_done = true;
        memcpy(n->hex, l->hex, sizeof n->hex);
        dp_bytes_free(&n->pending);
        int log = copy_log(dp, src, slot, c->id);   /* complete: the program closed it */
        if (log >= 0)
            close(log);
        return n;
    }
    *state = LLFT_DP_LEG_LIVE;
    n->sha = EVP_MD_CTX_new();
    if (n->sha == NULL || EVP_MD_CTX_copy_ex(n->sha, l->sha) != 1)
        goto fail;
    n->log_fd = copy_log(dp, src, slot, c->id);
    dp->reps[slot].queued += dp_bytes_size(&n->pending);
    return n;
fail:
    EVP_MD_CTX_free(n->sha);
    dp_bytes_free(&n->pending);
    dp_bytes_free(&n->unsent);
    free(n);
    return NULL;
}

int llft_dp_clone_replica(llft_dp_t *dp, int src, const char *log_dir, llft_dp_leg_info_t *out, int max, int *slot)
{
    pthread_mutex_lock(&dp->mu);
    int count = 0, rc = -1;
    if (src < 0 || src >= dp->nreps || !dp->reps[src].live || dp->stopped) {
        errno = EINVAL;
        goto out;
    }
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct leg *l = dp_leg_get(dp->conns.vals[i], src);
        if (l == NULL)
            continue;
        if (l->replay_left || l->replay_fd >= 0) {
            errno = EBUSY;
            goto out;
        }
        count++;
    }
    if (count > max) {
        errno = ENOSPC;
        goto out;
    }
    int k = dp_new_replica(dp, 0, -1, log_dir);
    if (k < 0) {
        errno = ENOMEM;
        goto out;
    }
    *slot = k;
    struct replica *from = &dp->reps[src], *to = &dp->reps[k];
    to->parked = from->parked;
    to->parked_after = from->parked_after;
    to->closed_conns = from->closed_conns;
    to->closed_bytes = from->closed_bytes;
    memcpy(to->closed_xor, from->closed_xor, sizeof to->closed_xor);
    from->held = true;
    int n = 0;
    for (uint64_t i = 0; i < dp->conns.cap; i++) {
        if (!llft_idmap_at(&dp->conns, i))
            continue;
        struct conn *c = dp->conns.vals[i];
        if (dp_leg_get(c, src) == NULL)
            continue;
        read_all_output(dp, c, src);
        int state = 0;
        struct leg *l = c->legs[src], *nl = clone_leg(dp, c, src, k, &state);
        if (nl == NULL || dp_conn_add_leg(c, k, nl) < 0) {
            free(nl);
            errno = ENOMEM;   /* the caller gives the clone up: llft_dp_remove_replica, llft_dp_release */
            goto out;
        }
        struct stat st;
        out[n].conn_id = c->id;
        out[n].ino = l->fd >= 0 && fstat(l->fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
        out[n].state = state;
        n++;
    }
    rc = n;
out:
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

int llft_dp_clone_attach(llft_dp_t *dp, int slot, uint64_t conn_id, int fd, const char *prefix, size_t n)
{
    pthread_mutex_lock(&dp->mu);
    int rc = -1;
    struct conn *c = dp_conn_get(dp, conn_id);
    struct leg *l = c ? dp_leg_get(c, slot) : NULL;
    if (l == NULL || l->attached || l->sha == NULL || fd < 0) {
        errno = ENOENT;
        goto out;
    }
    if (n) {
        struct bytes q = {0};
        if (dp_bytes_put(&q, prefix, n) < 0 ||
            (dp_bytes_size(&l->pending) && dp_bytes_put(&q, l->pending.p + l->pending.off,
                                                        dp_bytes_size(&l->pending)) < 0)) {
            dp_bytes_free(&q);
            errno = ENOMEM;
            goto out;
        }
        dp_bytes_free(&l->pending);
        l->pending = q;
        dp->reps[slot].queued += n;
    }
    dp_leg_connect(dp, c, slot, fd);
    fd = -1;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&dp->mu);
    return rc;
}

void llft_dp_set_pid(llft_dp_t *dp, int slot, int pid, int pidfd)
{
    pthread_mutex_lock(&dp->mu);
    if (slot >= 0 && slot < dp->nreps) {
        struct replica *r = &dp->reps[slot];
        if (r->pidfd >= 0)
            close(r->pidfd);
        r->pid = pid;
        r->pidfd = pidfd;
    } else if (pidfd >= 0) {
        close(pidfd);
    }
    pthread_mutex_unlock(&dp->mu);
}

void llft_dp_release(llft_dp_t *dp, int src)
{
    pthread_mutex_lock(&dp->mu);
    if (src >= 0 && src < dp->nreps && dp->reps[src].held) {
        dp->reps[src].held = false;
        for (uint64_t i = 0; i < dp->conns.cap; i++)
            if (llft_idmap_at(&dp->conns, i) && dp_leg_get(dp->conns.vals[i], src) != NULL)
                dp_leg_events(dp, dp->conns.vals[i], src);
    }
    pthread_mutex_unlock(&dp->mu);
}
