/* errno_after_call: reports errno as each blocking call left it after it
 * succeeded.  A program may read errno after a call that succeeded
 * (CPython's poll loop retries when errno says EINTR, whatever poll
 * returned); a successful call leaves errno as the program had it, so each
 * report here says 0, whatever held the replica meanwhile.
 *
 * One connection at a time.  Per round the server blocks in a call of each
 * kind in turn, each waiting for one byte from the client, and announces
 * each wait with "WAIT <call>" before making it; the client may hold the
 * primary meanwhile and then send the byte.  A wait that a signal ends
 * (EINTR) is made again, as servers do.  The round's reply:
 *   "ERRNO accept=E poll=E ppoll=E select=E epoll=E read=E recv=E"
 * A round whose byte is 'q' ends the connection; 'x' ends the server.
 *
 * usage: errno_after_call PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>

#include "lineproto.h"

static int announce(int fd, const char *call)
{
    char line[64];
    int n = snprintf(line, sizeof line, "WAIT %s\n", call);
    return write(fd, line, (size_t)n) == n ? 0 : -1;
}

/* Waits in the call named for the next byte, and takes it (the waits leave
 * it unread).  Returns the byte, or -1 when the connection is gone. */
static int wait_byte(int fd, int ep, const char *call, int *err)
{
    char c;
    if (announce(fd, call) < 0)
        return -1;
    long r;
    do { /* a census's signal ends a poll, a select or an epoll_wait with EINTR, as any signal does */
        errno = 0;
        if (strcmp(call, "poll") == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            r = poll(&p, 1, -1);
        } else if (strcmp(call, "ppoll") == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            r = ppoll(&p, 1, NULL, NULL);
        } else if (strcmp(call, "select") == 0) {
            fd_set rd;
            FD_ZERO(&rd);
            FD_SET(fd, &rd);
            r = select(fd + 1, &rd, NULL, NULL, NULL);
        } else if (strcmp(call, "epoll") == 0) {
            struct epoll_event ev;
            r = epoll_wait(ep, &ev, 1, -1);
        } else if (strcmp(call, "read") == 0) {
            r = read(fd, &c, 1);
        } else {
            r = recv(fd, &c, 1, 0);
        }
    } while (r < 0 && errno == EINTR);
    if (strcmp(call, "read") == 0 || strcmp(call, "recv") == 0) {
        *err = errno;
        return r == 1 ? (unsigned char)c : -1;
    }
    *err = errno;
    if (r <= 0 || read(fd, &c, 1) != 1)
        return -1;
    return (unsigned char)c;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    static const char *calls[] = {"poll", "ppoll", "select", "epoll", "read", "recv"};
    enum { NCALLS = sizeof calls / sizeof calls[0] };
    for (;;) {
        errno = 0;
        int fd = accept(lfd, NULL, NULL);
        int accept_err = errno;
        if (fd < 0)
            continue;
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        int c = 0;
        for (;;) {
            int err[NCALLS];
            for (int i = 0; i < NCALLS; i++)
                if ((c = wait_byte(fd, ep, calls[i], &err[i])) < 0 || c == 'q' || c == 'x')
                    break;
            if (c < 0 || c == 'q' || c == 'x')
                break;
            char out[256];
            int n = snprintf(out, sizeof out, "ERRNO accept=%d poll=%d ppoll=%d select=%d epoll=%d read=%d recv=%d\n",
                             accept_err, err[0], err[1], err[2], err[3], err[4], err[5]);
            if (write(fd, out, (size_t)n) != n)
                break;
            accept_err = 0;
        }
        close(ep);
        close(fd);
        if (c == 'x')
            return 0;
    }
}
