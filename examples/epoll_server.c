#define _GNU_SOURCE
/* epoll_server: one thread, non-blocking sockets, epoll (see lineproto.h).
 * usage: epoll_server PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

struct conn {
    int fd;
    struct linebuf in;
};

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    fcntl(lfd, F_SETFL, O_NONBLOCK);
    int ep = epoll_create1(0);
    struct conn listener = {.fd = lfd};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    char out[16384];
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, 1000);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr; /* a pointer: differs between replicas */
            if (c == &listener) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    struct conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            for (;;) {
                ssize_t r = read(c->fd, c->in.data + c->in.len, sizeof c->in.data - c->in.len);
                if (r > 0) {
                    c->in.len += (size_t)r;
                    size_t outlen;
                    int rc = serve_lines(&c->in, out, sizeof out, &outlen);
                    size_t off = 0;
                    while (off < outlen) { /* replies are short: wait for room if needed */
                        ssize_t w = write(c->fd, out + off, outlen - off);
                        if (w > 0)
                            off += (size_t)w;
                        else if (errno != EAGAIN)
                            break;
                    }
                    if (rc < 0)
                        exit(0);
                    continue;
                }
                if (r < 0 && errno == EAGAIN)
                    break;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                free(c);
                break;
            }
        }
    }
}
