/* msg_client: load for msg_server.  Prints one JSON line.
 *   msg_client latency PORT SIZE COUNT [samples]   round trips one at a time: p50, p99 in microseconds;
 *       with "samples" also every round trip, in order, as [start, latency] (start in microseconds
 *       after start_s, the wall-clock second the first one began)
 *   msg_client throughput PORT SIZE CLIENTS SECONDS   closed-loop clients: requests per second
 *   msg_client fanout PORT,PORT,... SIZE CLIENTS SECONDS
 *       each client sends every request to every port and waits for every
 *       reply: what a replication layer that cost nothing would still make
 *       the machine do (each replica executes each request), so its rate
 *       bounds any semi-active replication of that many replicas here
 * PORT may be ADDR:PORT (an IPv4 address; default 127.0.0.1).
 * Times with the raw clock_gettime system call. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double wall_s(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct in_addr server_addr;

/* PORT or ADDR:PORT: sets server_addr, returns the port. */
static int target(const char *arg)
{
    const char *colon = strrchr(arg, ':');
    server_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (colon == NULL)
        return atoi(arg);
    char host[64];
    snprintf(host, sizeof host, "%.*s", (int)(colon - arg), arg);
    if (inet_pton(AF_INET, host, &server_addr) != 1) {
        fprintf(stderr, "msg_client: bad address %s\n", host);
        exit(2);
    }
    return atoi(colon + 1);
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr = server_addr;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        exit(1);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_request(int fd, char *buf, size_t size)
{
    uint32_t len = htonl((uint32_t)size);
    memcpy(buf, &len, 4);
    return write(fd, buf, size + 4) == (ssize_t)(size + 4) ? 0 : -1;
}

static int read_reply(int fd, char *buf, size_t size)
{
    size_t got = 0;
    while (got < size + 4) {
        ssize_t r = read(fd, buf + got, size + 4 - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int round_trip(int fd, char *buf, size_t size)
{
    return send_request(fd, buf, size) == 0 ? read_reply(fd, buf, size) : -1;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAX_PORTS 8

struct worker {
    int ports[MAX_PORTS], nports;
    size_t size;
    double until;
    long done;
};

/* One request to every port, then every reply. */
static int fan_out(const int *fds, int n, char *buf, size_t size)
{
    for (int i = 0; i < n; i++)
        if (send_request(fds[i], buf, size) != 0)
            return -1;
    for (int i = 0; i < n; i++)
        if (read_reply(fds[i], buf, size) != 0)
            return -1;
    return 0;
}

static void *load(void *arg)
{
    struct worker *w = arg;
    int fds[MAX_PORTS];
    for (int i = 0; i < w->nports; i++)
        fds[i] = dial(w->ports[i]);
    char *buf = calloc(1, w->size + 4);
    while (now_us() < w->until && fan_out(fds, w->nports, buf, w->size) == 0)
        w->done++;
    for (int i = 0; i < w->nports; i++)
        close(fds[i]);
    free(buf);
    return NULL;
}

/* PORT[,PORT...]: fills ports, returns how many. */
static int targets(char *arg, int *ports)
{
    int n = 0;
    for (char *save, *tok = strtok_r(arg, ",", &save); tok != NULL && n < MAX_PORTS;
         tok = strtok_r(NULL, ",", &save))
        ports[n++] = target(tok);
    return n;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "latency") == 0) {
        int port = target(argv[2]);
        size_t size = (size_t)atol(argv[3]);
        int count = atoi(argv[4]);
        int fd = dial(port);
        char *buf = calloc(1, size + 4);
        double *lat = calloc((size_t)count, sizeof *lat), *at = calloc((size_t)count, sizeof *at);
        double first = 0, first_wall = 0;
        for (int i = 0; i < count + 20; i++) { /* 20 warm-up round trips */
            if (i == 20) {
                first_wall = wall_s();
                first = now_us();
            }
            double t0 = now_us();
            if (round_trip(fd, buf, size) != 0)
                return 1;
            if (i >= 20) {
                lat[i - 20] = now_us() - t0;
                at[i - 20] = t0 - first;
            }
        }
        printf("{\"size\": %zu, \"count\": %d", size, count);
        if (argc >= 6 && strcmp(argv[5], "samples") == 0) {
            printf(", \"start_s\": %.6f, \"samples\": [", first_wall);
            for (int i = 0; i < count; i++)
                printf("%s[%.1f, %.1f]", i ? ", " : "", at[i], lat[i]);
            printf("]");
        }
        qsort(lat, (size_t)count, sizeof *lat, cmp);
        printf(", \"p50_us\": %.1f, \"p99_us\": %.1f}\n", lat[count / 2], lat[count * 99 / 100]);
        return 0;
    }
    if (argc >= 6 && (strcmp(argv[1], "throughput") == 0 || strcmp(argv[1], "fanout") == 0)) {
        int clients = atoi(argv[4]);
        struct worker w[64];
        pthread_t th[64];
        double start = now_us(), secs = atof(argv[5]);
        struct worker each = {.size = (size_t)atol(argv[3]), .until = start + secs * 1e6, .nports = 1};
        if (strcmp(argv[1], "fanout") == 0)
            each.nports = targets(argv[2], each.ports);
        else
            each.ports[0] = target(argv[2]);
        for (int i = 0; i < clients && i < 64; i++) {
            w[i] = each;
            pthread_create(&th[i], NULL, load, &w[i]);
        }
        long total = 0;
        for (int i = 0; i < clients && i < 64; i++) {
            pthread_join(th[i], NULL);
            total += w[i].done;
        }
        printf("{\"clients\": %d, \"size\": %s, \"requests\": %ld, \"rps\": %.1f}\n", clients, argv[3], total,
               (double)total / ((now_us() - start) / 1e6));
        return 0;
    }
    fprintf(stderr, "usage: msg_client latency PORT SIZE COUNT [samples] | throughput PORT SIZE CLIENTS SECONDS"
                    " | fanout PORT,PORT,... SIZE CLIENTS SECONDS\n");
    return 2;
}
