/* The data plane's byte queues, the sends that queue what a socket does
 * not take at once, and the connections' input files (kept for replicas
 * that join later).  Called by the plane's thread under dp->mu. */
#include "dataplane_state.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

void dp_bytes_drop(struct bytes *b, size_t n)
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

/* Sends what fd takes at once (only if now: nothing is queued ahead) and
 * queues the rest in q.  Returns the bytes queued, or -1: fd failed or
 * memory ran out. */
ssize_t dp_send_or_queue(int fd, struct bytes *q, const char *data, size_t n, bool now)
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

void dp_set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int dp_write_file(int fd, const char *p, size_t n)
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
