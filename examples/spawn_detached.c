/* spawn_detached: a server that starts a detached helper for each line a
 * client sends, as servers start background jobs: it forks; the child
 * starts a session of its own, forks the helper (which sleeps HELPER_MS
 * and exits) and exits 3 at once; the server reaps that child and replies
 * "<n> <line> helper started, its parent exited <status>".  The reply
 * waits for nothing but the child's exit.  One connection at a time.
 * usage: spawn_detached PORT [HELPER_MS] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lineproto.h"

static int start_helper(int helper_ms)
{
    pid_t middle = fork();
    if (middle < 0)
        return -1;
    if (middle == 0) {
        setsid();
        if (fork() == 0) {
            usleep((useconds_t)helper_ms * 1000);
            _exit(0);
        }
        _exit(3);
    }
    int status;
    if (waitpid(middle, &status, 0) != middle)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    int helper_ms = argc > 2 ? atoi(argv[2]) : 30000;
    unsigned long n = 0;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        FILE *in = fdopen(fd, "r");
        char line[256];
        while (in && fgets(line, sizeof line, in)) {
            line[strcspn(line, "\n")] = 0;
            char out[320];
            int len = snprintf(out, sizeof out, "%lu %s helper started, its parent exited %d\n", ++n, line,
                               start_helper(helper_ms));
            if (write(fd, out, (size_t)len) != len)
                break;
        }
        if (in)
            fclose(in);
        else
            close(fd);
    }
}
