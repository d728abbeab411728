/* daemon_server: the echo server (one thread per connection, see
 * lineproto.h) that puts itself in the background first, as redis's
 * `daemonize yes`, memcached -d and nginx's `daemon on` do: fork, the
 * parent exits, the child starts a session of its own, moves to /, and
 * points its standard streams at /dev/null.  With "twice" it forks a
 * second time after setsid, as the classic double fork does; with
 * "nosid" too it forks twice and never calls setsid (the daemon stays in
 * its first process's session and process group); with "daemon" it
 * calls daemon(3) instead; with "wait" the parent waits for its child,
 * which forks the daemon and exits at once (a start-stop wrapper's shape).
 * usage: daemon_server PORT [exit|_exit|daemon|wait] [twice [nosid]] */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lineproto.h"

static void parent_leaves(int quick)
{
    pid_t p = fork();
    if (p < 0) {
        perror("fork");
        exit(1);
    }
    if (p > 0) {
        if (quick)
            _exit(0);
        exit(0);
    }
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7000;
    int quick = argc > 2 && strcmp(argv[2], "_exit") == 0;
    int twice = argc > 3 && strcmp(argv[3], "twice") == 0;
    int nosid = argc > 4 && strcmp(argv[4], "nosid") == 0;
    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        pid_t p = fork();
        if (p < 0)
            return 1;
        if (p > 0) {
            int status;
            waitpid(p, &status, 0);
            exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
        }
        if (!nosid && setsid() < 0)
            return 1;
        parent_leaves(1);
    } else if (argc > 2 && strcmp(argv[2], "daemon") == 0) {
        if (daemon(0, 0) != 0) {
            perror("daemon");
            return 1;
        }
    } else {
        parent_leaves(quick);
        if (!nosid && setsid() < 0) {
            perror("setsid");
            return 1;
        }
        if (twice)
            parent_leaves(1);
        if (chdir("/") != 0)
            return 1;
        int null = open("/dev/null", O_RDWR);
        if (null < 0)
            return 1;
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        if (null > 2)
            close(null);
    }
    serve_with_threads(listen_on(port));
}
