/* msg_server: length-prefixed echo, one thread per connection: each request
 * is a 4-byte big-endian length and that many bytes; the reply is the same.
 * With NONDET, each request first makes that many gettimeofday calls, the
 * non-deterministic operations of LLFT Fig. 15 (each one an OrderInfo entry
 * under llft).  Used by bench/serving.py.  usage: msg_server PORT [NONDET] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "lineproto.h"

static int read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = write(fd, (const char *)buf + put, n - put);
        if (r <= 0)
            return -1;
        put += (size_t)r;
    }
    return 0;
}

static long nondet;

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    size_t cap = 1 << 16;
    char *buf = malloc(cap + 4);
    for (;;) {
        uint32_t len;
        if (read_full(fd, &len, 4) != 0)
            break;
        size_t n = ntohl(len);
        if (n > cap)
            break;
        if (read_full(fd, buf + 4, n) != 0)
            break;
        for (long i = 0; i < nondet; i++) {
            struct timeval tv;
            gettimeofday(&tv, NULL);
        }
        memcpy(buf, &len, 4);
        if (write_full(fd, buf, n + 4) != 0)
            break;
    }
    free(buf);
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    nondet = argc > 2 ? atol(argv[2]) : 0;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_t th;
        pthread_create(&th, NULL, serve, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}
