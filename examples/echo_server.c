/* echo_server: blocking I/O, one thread per connection (see lineproto.h).
 * usage: echo_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

static void *serve(void *arg)
{
    serve_connection((int)(intptr_t)arg);
    return NULL;
}

int main(int argc, char **argv)
{
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    for (;;) {
        struct sockaddr_in peer;
        socklen_t len = sizeof peer;
        int fd = accept(lfd, (struct sockaddr *)&peer, &len);
        if (fd < 0)
            continue;
        pthread_t th;
        pthread_create(&th, NULL, serve, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}
