/* fd_race: threads racing for file descriptor numbers.
 *
 * Each worker thread, round after round, makes a pipe, an eventfd, a
 * socketpair, a TCP socket and copies of them (dup, F_DUPFD_CLOEXEC), notes
 * every number the kernel gave it, and closes them again.  The kernel gives
 * the lowest free number, so which thread gets which number depends on how
 * the threads interleave.  At the end it prints one digest of the numbers
 * per thread and a combined one.  Under llft every replica must print the
 * primary's: a server's epoll sets, fd-indexed tables and logs hold these
 * numbers.
 *
 * Given a port and a count, a further thread accepts that many connections
 * on the port, answering each "ok" and closing it, while the workers go on
 * (at least rounds rounds each, until the last connection): the accepted
 * connections take the numbers the workers just closed.  Each accept and
 * each worker round passes one mutex, so a replica that placed an accepted
 * connection on a number before the worker that had it first would wait
 * for that worker while it waits for the number.
 *
 * usage: fd_race [threads] [rounds] [port connections] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull
#define MAX_THREADS 16
#define PER_ROUND 8

static int rounds = 200;
static uint64_t digests[MAX_THREADS];
static pthread_mutex_t served_lock = PTHREAD_MUTEX_INITIALIZER;
static int to_serve, served, listener = -1;
static uint64_t acceptor_digest = 1469598103934665603ull;

static uint64_t fnv(uint64_t h, int v)
{
    for (int i = 0; i < 4; i++) {
        h ^= ((unsigned)v >> (8 * i)) & 0xff;
        h *= FNV_PRIME;
    }
    return h;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t h = FNV_OFFSET;
    for (int r = 0;; r++) {
        pthread_mutex_lock(&served_lock);
        int more = r < rounds || served < to_serve;
        pthread_mutex_unlock(&served_lock);
        if (!more)
            break;
        int fds[PER_ROUND] = {-1, -1, -1, -1, -1, -1, -1, -1}, n = 0;
        if (pipe2(fds + n, O_CLOEXEC) == 0)
            n += 2;
        fds[n++] = eventfd(0, EFD_NONBLOCK);
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds + n) == 0)
            n += 2;
        fds[n++] = socket(AF_INET, SOCK_STREAM, 0);
        fds[n++] = dup(fds[0]);
        fds[n++] = fcntl(fds[2], F_DUPFD_CLOEXEC, 0);
        for (int i = 0; i < n; i++)
            h = fnv(h, fds[i]);
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0)
                close(fds[i]);
    }
    digests[id] = h;
    return NULL;
}

static void *acceptor(void *arg)
{
    (void)arg;
    for (int i = 0; i < to_serve; i++) {
        int c = accept(listener, NULL, NULL);
        if (c < 0) {
            perror("accept");
            exit(1);
        }
        acceptor_digest = fnv(acceptor_digest, c);
        pthread_mutex_lock(&served_lock);
        served++;
        pthread_mutex_unlock(&served_lock);
        if (write(c, "ok\n", 3) != 3)
            perror("write");
        close(c);
    }
    return NULL;
}

static int listen_on(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 64) != 0) {
        perror("listen");
        exit(1);
    }
    return s;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    rounds = argc > 2 ? atoi(argv[2]) : rounds;
    if (threads < 1 || threads > MAX_THREADS || rounds < 1 || argc == 4) {
        fprintf(stderr, "usage: %s [threads 1-%d] [rounds] [port connections]\n", argv[0], MAX_THREADS);
        return 2;
    }
    pthread_t th[MAX_THREADS], acc;
    if (argc > 4) {
        listener = listen_on(atoi(argv[3]));
        to_serve = atoi(argv[4]);
        pthread_create(&acc, NULL, acceptor, NULL);
    }
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    uint64_t all = FNV_OFFSET;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        printf("thread %d fds %016" PRIx64 "\n", i, digests[i]);
        all = all * FNV_PRIME ^ digests[i];
    }
    if (listener >= 0) {
        pthread_join(acc, NULL);
        printf("acceptor fds %016" PRIx64 "\n", acceptor_digest);
        all = all * FNV_PRIME ^ acceptor_digest;
    }
    printf("all %016" PRIx64 "\n", all);
    return 0;
}
