/* child_feed PORT [exec]: a server fed by a child it forks.  The child
 * writes a counter into a pipe every millisecond, SIGPIPE ignored: it
 * ticks by polling a second pipe, from its parent, which the parent holds
 * open and never writes, and exits the moment that poll says the parent's
 * end has closed (the parent is gone), or a write fails.  The parent polls
 * its listener, its clients and the pipe, and answers each line with the
 * last value read ("FEED <n>"), or "FEED GONE" once the child's pipe is
 * at EOF.  "SHUTDOWN" ends both.  With "exec" the child execs this
 * program again to feed (child_feed --feed TO FROM), as a server's
 * helper started by fork and exec does.
 *
 * When the primary's parent dies, its child's poll returns at once, in
 * the kernel's own exit of the parent; were that recorded, each backup's
 * child would exit too, and the server that takes over would answer
 * "FEED GONE" (the replica lease, native/replica_lease.c;
 * tests/test_forked_processes.py). */
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
#include <time.h>
#include <unistd.h>

#include "lineproto.h"

#define MAX_CLIENTS 32

static void feed(int to_parent, int from_parent)
{
    signal(SIGPIPE, SIG_IGN);
    for (unsigned long long v = 1;; v++) {
        struct pollfd p = {.fd = from_parent, .events = POLLIN};
        if (poll(&p, 1, 1) != 0) /* a tick, or the parent's end closed */
            _exit(3);
        if (write(to_parent, &v, sizeof v) != sizeof v)
            _exit(3);
    }
}

int main(int argc, char **argv)
{
    if (argc > 3 && strcmp(argv[1], "--feed") == 0)
        feed(atoi(argv[2]), atoi(argv[3]));
    int by_exec = argc > 2 && strcmp(argv[2], "exec") == 0;
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    int p[2], held[2];
    if (pipe(p) != 0 || pipe(held) != 0)
        return 1;
    pid_t child = fork();
    if (child == 0) {
        close(p[0]);
        close(held[1]);
        close(lfd);
        if (by_exec) {
            char to[16], from[16];
            snprintf(to, sizeof to, "%d", p[1]);
            snprintf(from, sizeof from, "%d", held[0]);
            execl("/proc/self/exe", argv[0], "--feed", to, from, (char *)NULL);
            _exit(4);
        }
        feed(p[1], held[0]);
    }
    close(p[1]);
    close(held[0]);
    int feed_fd = p[0], clients[MAX_CLIENTS], nclients = 0;
    unsigned long long last = 0;
    for (;;) {
        struct pollfd fds[MAX_CLIENTS + 2] = {{.fd = lfd, .events = POLLIN}, {.fd = feed_fd, .events = POLLIN}};
        for (int i = 0; i < nclients; i++)
            fds[i + 2] = (struct pollfd){.fd = clients[i], .events = POLLIN};
        if (poll(fds, (nfds_t)nclients + 2, -1) < 0 && errno != EINTR)
            return 1;
        if (fds[1].revents & (POLLIN | POLLHUP)) {
            unsigned long long v;
            ssize_t n = read(feed_fd, &v, sizeof v);
            if (n == sizeof v) {
                last = v;
            } else if (n == 0) {
                close(feed_fd);
                feed_fd = -1; /* gone: answered so from here on */
            }
        }
        for (int i = nclients - 1; i >= 0; i--) {
            if (!(fds[i + 2].revents & (POLLIN | POLLHUP)))
                continue;
            char line[256];
            ssize_t n = read(clients[i], line, sizeof line);
            if (n <= 0) {
                close(clients[i]);
                clients[i] = clients[--nclients];
                continue;
            }
            if (n >= 8 && memcmp(line, "SHUTDOWN", 8) == 0) {
                if (write(clients[i], "BYE\n", 4) != 4)
                    return 1;
                kill(child, SIGTERM);
                waitpid(child, NULL, 0);
                return 0;
            }
            char out[64];
            int len = feed_fd < 0 ? snprintf(out, sizeof out, "FEED GONE\n")
                                  : snprintf(out, sizeof out, "FEED %llu\n", last);
            if (write(clients[i], out, (size_t)len) != len)
                return 1;
        }
        if ((fds[0].revents & POLLIN) && nclients < MAX_CLIENTS) {
            int c = accept(lfd, NULL, NULL);
            if (c >= 0)
                clients[nclients++] = c;
        }
    }
}
