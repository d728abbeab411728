#define _GNU_SOURCE
/* late_divergence: a multi-threaded line server (see lineproto.h) in
 * which the replica named by $DIVERGE_REPLICA (llft's $LLFT_REPLICA) reads
 * the clock once more than the others when it serves line number
 * $DIVERGE_AT: a backup made to diverge in the middle of a run.  With
 * --close-stderr it first points its stderr at /dev/null, as daemons do.
 * usage: late_divergence PORT [--close-stderr] */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

static long diverge_at = -1;
static long served;

static void *serve(void *arg)
{
    int fd = (int)(long)arg;
    struct linebuf in = {0};
    char out[16384];
    for (;;) {
        ssize_t r = read(fd, in.data + in.len, sizeof in.data - in.len);
        if (r <= 0)
            break;
        in.len += (size_t)r;
        pthread_mutex_lock(&state_mu);
        if (++served == diverge_at) {
            struct timeval tv;
            gettimeofday(&tv, NULL); /* the divergence under test */
        }
        pthread_mutex_unlock(&state_mu);
        size_t n;
        int rc = serve_lines(&in, out, sizeof out, &n);
        if (n && write(fd, out, n) < 0)
            break;
        if (rc < 0)
            exit(0);
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *who = getenv("DIVERGE_REPLICA"), *me = getenv("LLFT_REPLICA"), *at = getenv("DIVERGE_AT");
    if (who && me && at && atoi(who) == atoi(me))
        diverge_at = atol(at);
    if (argc > 2 && strcmp(argv[2], "--close-stderr") == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        close(null);
    }
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_t t;
        pthread_create(&t, NULL, serve, (void *)(long)fd);
        pthread_detach(t);
    }
}
