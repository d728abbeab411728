/* prefork_server: the process model of nginx's master and workers and of
 * apache's prefork: the parent binds and listens, then forks WORKERS
 * children that each accept connections on the inherited listener and
 * serve them (see lineproto.h); the parent waits for its children.
 * usage: prefork_server PORT WORKERS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lineproto.h"

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    int workers = argc > 2 ? atoi(argv[2]) : 2;
    for (int i = 0; i < workers; i++) {
        if (fork() == 0) {
            for (;;) {
                int fd = accept(lfd, NULL, NULL);
                if (fd >= 0)
                    serve_connection(fd);
            }
        }
    }
    int status;
    while (wait(&status) > 0)
        ;
    return 0;
}
