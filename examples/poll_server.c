/* poll_server: one thread, blocking reads guarded by poll (see lineproto.h).
 * usage: poll_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

#define MAXC 256

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    struct pollfd p[MAXC + 1];
    static struct linebuf bufs[MAXC + 1];
    int n = 1;
    p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
    char out[16384];
    for (;;) {
        if (poll(p, (nfds_t)n, 1000) <= 0)
            continue;
        for (int i = n - 1; i >= 1; i--) {
            if (!p[i].revents)
                continue;
            ssize_t r = read(p[i].fd, bufs[i].data + bufs[i].len, sizeof bufs[i].data - bufs[i].len);
            if (r <= 0) {
                close(p[i].fd);
                p[i] = p[n - 1];
                bufs[i] = bufs[n - 1];
                n--;
                continue;
            }
            bufs[i].len += (size_t)r;
            size_t outlen;
            int rc = serve_lines(&bufs[i], out, sizeof out, &outlen);
            if (outlen && write(p[i].fd, out, outlen) < 0)
                continue;
            if (rc < 0)
                exit(0);
        }
        if ((p[0].revents & POLLIN) && n <= MAXC) {
            int fd = accept(lfd, NULL, NULL);
            if (fd >= 0) {
                p[n] = (struct pollfd){.fd = fd, .events = POLLIN};
                bufs[n].len = 0;
                n++;
            }
        }
    }
}
