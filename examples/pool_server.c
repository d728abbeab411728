#define _GNU_SOURCE
/* pool_server: an epoll front thread and a pool of worker threads, a common
 * server shape (see lineproto.h for the protocol).
 *
 * The main thread runs epoll_wait on a non-blocking listener and on
 * connections accepted with accept4(SOCK_NONBLOCK); it cuts request lines
 * and pushes them onto a queue guarded by a mutex and a condition variable,
 * and closes a connection at EOF (EPOLL_CTL_DEL + close).  Worker threads
 * pop jobs, read the clock, update a table under a second mutex, and write
 * the reply under a per-fd mutex with a write() loop that retries on EAGAIN.
 *
 * With "unlocked" the main thread signals after releasing the queue's
 * mutex (a common saving: the woken worker does not wait for it), else
 * while holding it.  With "pipe" there is no queue: the main thread writes
 * each job's address to a pipe the workers read (older memcached's
 * notify pipes).
 *
 * usage: pool_server PORT [WORKERS [unlocked|pipe]] */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

#define MAX_FD 1024
#define MAX_WORKERS 64

struct job {
    struct job *next;
    int fd;
    size_t len;
    char line[];
};

static pthread_mutex_t queue_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cv = PTHREAD_COND_INITIALIZER;
static struct job *queue_head, *queue_tail;
static int signal_unlocked;
static int job_pipe[2] = {-1, -1}; /* "pipe": jobs go through it */

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t table[256]; /* requests per first byte, stamped with the clock */

static pthread_mutex_t fdm[MAX_FD];

static void push_job(int fd, const char *line, size_t len)
{
    struct job *j = malloc(sizeof *j + len);
    j->next = NULL;
    j->fd = fd;
    j->len = len;
    memcpy(j->line, line, len);
    if (job_pipe[1] >= 0) {
        if (write(job_pipe[1], &j, sizeof j) != sizeof j)
            abort();
        return;
    }
    pthread_mutex_lock(&queue_mu);
    if (queue_tail)
        queue_tail->next = j;
    else
        queue_head = j;
    queue_tail = j;
    if (signal_unlocked) {
        pthread_mutex_unlock(&queue_mu);
        pthread_cond_signal(&queue_cv);
    } else {
        pthread_cond_signal(&queue_cv);
        pthread_mutex_unlock(&queue_mu);
    }
}

static struct job *pop_job(void)
{
    if (job_pipe[0] >= 0) {
        struct job *j;
        pthread_mutex_lock(&queue_mu); /* one reader at a time: a job's address is read whole */
        ssize_t n = read(job_pipe[0], &j, sizeof j);
        pthread_mutex_unlock(&queue_mu);
        if (n != sizeof j)
            abort();
        return j;
    }
    pthread_mutex_lock(&queue_mu);
    while (!queue_head)
        pthread_cond_wait(&queue_cv, &queue_mu);
    struct job *j = queue_head;
    queue_head = j->next;
    if (!queue_head)
        queue_tail = NULL;
    pthread_mutex_unlock(&queue_mu);
    return j;
}

static void write_all(int fd, const char *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w > 0)
            off += (size_t)w;
        else if (w < 0 && errno != EAGAIN && errno != EINTR)
            return; /* the client went away */
    }
}

static void *worker(void *arg)
{
    (void)arg;
    char out[512];
    for (;;) {
        struct job *j = pop_job();
        struct timeval tv;
        gettimeofday(&tv, NULL);
        pthread_mutex_lock(&table_mu);
        table[j->len ? (uint8_t)j->line[0] : 0] += (uint64_t)tv.tv_usec | 1;
        pthread_mutex_unlock(&table_mu);
        int n = handle_line(j->line, j->len, out, sizeof out);
        if (n < 0) {
            pthread_mutex_lock(&fdm[j->fd % MAX_FD]);
            write_all(j->fd, "BYE\n", 4);
            exit(0);
        }
        pthread_mutex_lock(&fdm[j->fd % MAX_FD]);
        write_all(j->fd, out, (size_t)n);
        pthread_mutex_unlock(&fdm[j->fd % MAX_FD]);
        free(j);
    }
    return NULL;
}

/* Reads what fd has, queues each complete line; returns 0 at EOF or error. */
static int read_requests(int fd, struct linebuf *b)
{
    for (;;) {
        ssize_t r = read(fd, b->data + b->len, sizeof b->data - b->len);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return 0;
        if (r < 0)
            return 1;
        b->len += (size_t)r;
        size_t start = 0;
        for (size_t i = 0; i < b->len; i++) {
            if (b->data[i] != '\n')
                continue;
            size_t n = i - start;
            if (n && b->data[start + n - 1] == '\r')
                n--;
            push_job(fd, b->data + start, n);
            start = i + 1;
        }
        memmove(b->data, b->data + start, b->len - start);
        b->len -= start;
        if (b->len == sizeof b->data)
            b->len = 0; /* a line longer than the buffer: dropped */
    }
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7000;
    int workers = argc > 2 ? atoi(argv[2]) : 3;
    if (workers < 1 || workers > MAX_WORKERS)
        workers = 3;
    signal_unlocked = argc > 3 && strcmp(argv[3], "unlocked") == 0;
    if (argc > 3 && strcmp(argv[3], "pipe") == 0 && pipe(job_pipe) != 0)
        return 1;
    for (int i = 0; i < MAX_FD; i++)
        pthread_mutex_init(&fdm[i], NULL);
    pthread_t tids[MAX_WORKERS];
    for (int i = 0; i < workers; i++)
        pthread_create(&tids[i], NULL, worker, NULL);

    int lfd = listen_on(port);
    fcntl(lfd, F_SETFL, O_NONBLOCK);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    static struct linebuf bufs[MAX_FD];
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                int c;
                while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (c >= MAX_FD) {
                        close(c);
                        continue;
                    }
                    bufs[c].len = 0;
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
                }
                continue;
            }
            if (!read_requests(fd, &bufs[fd])) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
            }
        }
    }
}
