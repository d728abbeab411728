/* The line protocol of the example servers, and their shared state.
 *
 *   any text      -> "<count> <text>"   (count: lines served so far by the whole server)
 *   DIGEST        -> "DIGEST <hex>"     (digest of every line served, in service order)
 *   TIME          -> "TIME <sec>.<usec>"
 *   SHUTDOWN      -> "BYE", then the server exits with status 0
 *
 * The state is global and guarded by a mutex, so the order in which
 * connections are served shows in every reply: replicas agree only if they
 * serve in the primary's order. */
#ifndef LINEPROTO_H
#define LINEPROTO_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t state_digest = 1469598103934665603ull;
static uint64_t state_count;

/* Handles one line (without its newline); writes the reply, newline
 * included, to out; returns its length, or -1 for SHUTDOWN. */
static inline int handle_line(const char *line, size_t len, char *out, size_t cap)
{
    if (len == 8 && memcmp(line, "SHUTDOWN", 8) == 0)
        return -1; /* the caller sends BYE and exits */
    if (len == 6 && memcmp(line, "DIGEST", 6) == 0) {
        pthread_mutex_lock(&state_mu);
        uint64_t d = state_digest;
        pthread_mutex_unlock(&state_mu);
        return snprintf(out, cap, "DIGEST %016llx\n", (unsigned long long)d);
    }
    if (len == 4 && memcmp(line, "TIME", 4) == 0) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        return snprintf(out, cap, "TIME %ld.%06ld\n", (long)tv.tv_sec, (long)tv.tv_usec);
    }
    pthread_mutex_lock(&state_mu);
    for (size_t i = 0; i < len; i++) {
        state_digest ^= (uint8_t)line[i];
        state_digest *= 1099511628211ull;
    }
    uint64_t n = ++state_count;
    pthread_mutex_unlock(&state_mu);
    return snprintf(out, cap, "%llu %.*s\n", (unsigned long long)n, (int)(len > cap - 32 ? cap - 32 : len), line);
}

/* A connection's input buffer: complete lines are taken from the front. */
struct linebuf {
    char data[8192];
    size_t len;
};

/* Serves every complete line in b; replies go to the out buffer.  Returns
 * -1 after SHUTDOWN, else 0; *outlen gets the reply bytes. */
static inline int serve_lines(struct linebuf *b, char *out, size_t cap, size_t *outlen)
{
    size_t start = 0;
    *outlen = 0;
    for (size_t i = 0; i < b->len; i++) {
        if (b->data[i] != '\n')
            continue;
        size_t n = i - start;
        if (n && b->data[start + n - 1] == '\r')
            n--;
        int r = handle_line(b->data + start, n, out + *outlen, cap - *outlen);
        if (r < 0) {
            memcpy(out + *outlen, "BYE\n", 4);
            *outlen += 4;
            return -1;
        }
        *outlen += (size_t)r;
        start = i + 1;
        if (cap - *outlen < 512)
            break;
    }
    memmove(b->data, b->data + start, b->len - start);
    b->len -= start;
    if (b->len == sizeof b->data) /* a line longer than the buffer: drop it */
        b->len = 0;
    return 0;
}

/* Serves one blocking connection until the client closes it (or sends
 * SHUTDOWN: then the process exits), then closes it. */
static inline void serve_connection(int fd)
{
    struct linebuf b = {.len = 0};
    char out[16384];
    for (;;) {
        ssize_t n = read(fd, b.data + b.len, sizeof b.data - b.len);
        if (n <= 0)
            break;
        b.len += (size_t)n;
        size_t outlen;
        int rc = serve_lines(&b, out, sizeof out, &outlen);
        if (outlen && write(fd, out, outlen) != (ssize_t)outlen)
            break;
        if (rc < 0)
            exit(0);
    }
    close(fd);
}

static void *serve_connection_thread(void *arg)
{
    serve_connection((int)(intptr_t)arg);
    return NULL;
}

/* Accepts on lfd forever, serving each connection on a thread of its own. */
static inline void serve_with_threads(int lfd)
{
    for (;;) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int fd = accept(lfd, (struct sockaddr *)&peer, &len);
        if (fd < 0)
            continue;
        pthread_t th;
        pthread_create(&th, NULL, serve_connection_thread, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}

static inline int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        perror("bind/listen");
        exit(1);
    }
    return fd;
}

#endif
