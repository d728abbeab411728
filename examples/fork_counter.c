/* fork_counter PORT: a counting server that forks a child per client
 * connection (dnsmasq's and inetd's model), the count kept by the parent:
 * for each line a client sends, its child asks the parent over a pipe for
 * the next count and replies "<count> <line>".  The parent polls its
 * listener, every child's pipe and a pipe its SIGCHLD handler writes to
 * (the self-pipe trick), and reaps its children when that one is
 * readable; "SHUTDOWN" ends the server once every child has.  Under
 * llft every count is given once, across failovers
 * (tests/test_forked_processes.py). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lineproto.h"

#define MAX_CHILDREN 64

static int reap_pipe[2];

static void on_child(int sig)
{
    (void)sig;
    int saved = errno;
    if (write(reap_pipe[1], "r", 1) < 0) { /* full: a reap is due already */ }
    errno = saved;
}

/* A child: serves one client, each line counted by the parent. */
static void serve(int fd, int to_parent, int from_parent)
{
    struct linebuf b = {.len = 0};
    char out[16384];
    for (;;) {
        ssize_t n = read(fd, b.data + b.len, sizeof b.data - b.len);
        if (n <= 0)
            break;
        b.len += (size_t)n;
        size_t start = 0, outlen = 0;
        for (size_t i = 0; i < b.len; i++) {
            if (b.data[i] != '\n')
                continue;
            size_t len = i - start;
            if (len == 8 && memcmp(b.data + start, "SHUTDOWN", 8) == 0) {
                if (write(to_parent, "S", 1) != 1 || write(fd, "BYE\n", 4) != 4)
                    _exit(3);
                _exit(0);
            }
            unsigned long long count;
            if (write(to_parent, "C", 1) != 1 || read(from_parent, &count, sizeof count) != sizeof count)
                _exit(2);
            outlen += (size_t)snprintf(out + outlen, sizeof out - outlen, "%llu %.*s\n", count, (int)len,
                                       b.data + start);
            start = i + 1;
            if (sizeof out - outlen < 512)
                break;
        }
        memmove(b.data, b.data + start, b.len - start);
        b.len -= start;
        if (outlen && write(fd, out, outlen) != (ssize_t)outlen)
            break;
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    if (pipe(reap_pipe) != 0)
        return 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sigaction(SIGCHLD, &sa, NULL);
    struct { pid_t pid; int from, to; } kids[MAX_CHILDREN];
    int nkids = 0, stopping = 0;
    unsigned long long count = 0;
    while (!stopping || nkids > 0) {
        struct pollfd p[MAX_CHILDREN + 2];
        p[0] = (struct pollfd){.fd = stopping ? -1 : lfd, .events = POLLIN};
        for (int i = 0; i < nkids; i++)
            p[i + 1] = (struct pollfd){.fd = kids[i].from, .events = POLLIN};
        p[nkids + 1] = (struct pollfd){.fd = reap_pipe[0], .events = POLLIN};
        int nkids_polled = nkids;
        int r = poll(p, (nfds_t)nkids + 2, 1000);
        if (r < 0 && errno != EINTR)
            return 1;
        for (int i = nkids - 1; r > 0 && i >= 0; i--) {
            if (!(p[i + 1].revents & (POLLIN | POLLHUP)))
                continue;
            char what = 0;
            if (read(kids[i].from, &what, 1) == 1 && what == 'C') {
                count++;
                if (write(kids[i].to, &count, sizeof count) != sizeof count)
                    return 4;
                continue;
            }
            if (what == 'S')
                stopping = 1;
            close(kids[i].from); /* the child is done */
            close(kids[i].to);
            kids[i] = kids[--nkids];
        }
        if (r > 0 && (p[0].revents & POLLIN) && nkids < MAX_CHILDREN) {
            int fd = accept(lfd, NULL, NULL);
            int up[2], down[2];
            if (fd >= 0 && pipe(up) == 0 && pipe(down) == 0) {
                pid_t pid = fork();
                if (pid == 0) {
                    close(lfd);
                    close(up[0]);
                    close(down[1]);
                    serve(fd, up[1], down[0]);
                }
                close(fd);
                close(up[1]);
                close(down[0]);
                kids[nkids++] = (typeof(kids[0])){pid, up[0], down[1]};
            }
        }
        if (r > 0 && (p[nkids_polled + 1].revents & POLLIN)) {
            char drain[64];
            if (read(reap_pipe[0], drain, sizeof drain) < 0)
                return 5;
            while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        }
    }
    while (wait(NULL) > 0)
        ;
    printf("counted %llu\n", count);
    return 0;
}
