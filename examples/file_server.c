/* file_server: serves a file with sendfile(2), one thread per connection,
 * on non-blocking sockets with a small send buffer, so that sendfile sends
 * part of what it is asked and the thread polls for room to send more.
 *   FILE          -> "SIZE <n>\n" then the whole file, from a descriptor
 *                    opened for the request (sendfile at its file position)
 *   RANGE <o> <n> -> "RANGE <o> <n>\n" then n bytes from offset o of a
 *                    descriptor shared by all connections (sendfile at an
 *                    explicit offset)
 *   PARTIAL       -> "PARTIAL <n>\n": sendfile calls so far that sent less
 *                    than asked (or nothing: EAGAIN)
 *   anything else -> the line protocol of lineproto.h
 * usage: file_server PORT FILE */
#include <arpa/inet.h>
#include <fcntl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lineproto.h"

static const char *path;
static int shared_fd;
static unsigned long partial; /* guarded by state_mu */

static int wait_for(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    return poll(&p, 1, -1) == 1 ? 0 : -1;
}

/* Sends n bytes of in (at *off, or its position) however sendfile splits them. */
static int send_all(int out, int in, off_t *off, size_t n)
{
    while (n) {
        ssize_t r = sendfile(out, in, off, n);
        if (r < 0 && errno != EAGAIN)
            return -1;
        if (r == 0)
            return -1;
        if (r < 0 || (size_t)r < n) {
            pthread_mutex_lock(&state_mu);
            partial++;
            pthread_mutex_unlock(&state_mu);
            if (wait_for(out, POLLOUT) != 0)
                return -1;
        }
        if (r > 0)
            n -= (size_t)r;
    }
    return 0;
}

/* A short reply line, whole, on the non-blocking socket. */
static int put(int fd, const char *buf, size_t n)
{
    while (n) {
        ssize_t r = write(fd, buf, n);
        if (r < 0 && errno == EAGAIN) {
            if (wait_for(fd, POLLOUT) != 0)
                return -1;
            continue;
        }
        if (r <= 0)
            return -1;
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A file opened in a connection's thread gets a number of its own, far from
 * the connections': llft does not record open(), so at a backup the lowest
 * free number could be one the primary's next accept() took, and the
 * accept would wait for this thread to close it (see docs/serving.md). */
static int open_high(const char *p)
{
    int low = open(p, O_RDONLY | O_CLOEXEC);
    if (low < 0)
        return -1;
    int fd = fcntl(low, F_DUPFD_CLOEXEC, 1000);
    close(low);
    return fd;
}

static int serve_file(int fd)
{
    int in = open_high(path);
    struct stat st;
    if (in < 0 || fstat(in, &st) != 0)
        return -1;
    char head[64];
    int h = snprintf(head, sizeof head, "SIZE %lld\n", (long long)st.st_size);
    int r = put(fd, head, (size_t)h) == 0 ? send_all(fd, in, NULL, (size_t)st.st_size) : -1;
    close(in);
    return r;
}

static int serve_range(int fd, long long o, long long n)
{
    char head[64];
    int h = snprintf(head, sizeof head, "RANGE %lld %lld\n", o, n);
    off_t off = (off_t)o;
    return put(fd, head, (size_t)h) == 0 ? send_all(fd, shared_fd, &off, (size_t)n) : -1;
}

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char line[512];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, line + len, 1); /* a byte at a time: the file bytes follow the reply line */
        if (n < 0 && errno == EAGAIN && wait_for(fd, POLLIN) == 0)
            continue;
        if (n <= 0)
            break;
        if (line[len] != '\n') {
            len = len + 1 < sizeof line ? len + 1 : 0;
            continue;
        }
        line[len] = 0;
        long long o, c;
        int rc = 0;
        if (strcmp(line, "FILE") == 0) {
            rc = serve_file(fd);
        } else if (sscanf(line, "RANGE %lld %lld", &o, &c) == 2) {
            rc = serve_range(fd, o, c);
        } else if (strcmp(line, "PARTIAL") == 0) {
            char out[64];
            pthread_mutex_lock(&state_mu);
            int m = snprintf(out, sizeof out, "PARTIAL %lu\n", partial);
            pthread_mutex_unlock(&state_mu);
            rc = put(fd, out, (size_t)m);
        } else {
            char out[700];
            int m = handle_line(line, len, out, sizeof out);
            if (m < 0) {
                put(fd, "BYE\n", 4);
                exit(0);
            }
            rc = put(fd, out, (size_t)m);
        }
        len = 0;
        if (rc != 0)
            break;
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: file_server PORT FILE\n");
        return 2;
    }
    path = argv[2];
    shared_fd = open(path, O_RDONLY);
    if (shared_fd < 0) {
        perror(path);
        return 1;
    }
    int lfd = listen_on(atoi(argv[1]));
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int small = 32768;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        pthread_t th;
        pthread_create(&th, NULL, serve, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}
