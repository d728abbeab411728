/* echo_server: blocking I/O, one thread per connection (see lineproto.h).
 * usage: echo_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct linebuf b = {.len = 0};
    char out[16384];
    for (;;) {
        ssize_t n = read(fd, b.data + b.len, sizeof b.data - b.len);
        if (n <= 0)
            break;
        b.len += (size_t)n;
        size_t outlen;
        int rc = serve_lines(&b, out, sizeof out, &outlen);
        if (outlen && write(fd, out, outlen) != (ssize_t)outlen)
            break;
        if (rc < 0)
            exit(0);
    }
    close(fd);
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
