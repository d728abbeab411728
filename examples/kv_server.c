/* kv_server: a multi-threaded key-value server.  One thread per
 * connection; the table is split into stripes, each under its own mutex;
 * keys may expire, and a background thread sweeps expired keys every 10 ms
 * (a condition variable with a timed wait).  Line protocol:
 *   SET key value [ttl_ms]   -> OK
 *   GET key                  -> VALUE value | NONE
 *   DEL key                  -> DELETED | NONE
 *   INCR key                 -> VALUE n   (the key's integer value plus one; 1 for a new key)
 *   TIME                     -> TIME sec.usec   (gettimeofday: the group clock under llft)
 *   DIGEST                   -> DIGEST <hex> <keys>   (state digest, stripe by stripe)
 *   SHUTDOWN                 -> BYE, and exit 0
 * usage: kv_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lineproto.h"

#define STRIPES 8
#define BUCKETS 256

struct entry {
    struct entry *next;
    char *key, *value;
    int64_t expires_ms; /* 0: never */
};

static struct stripe {
    pthread_mutex_t mu;
    struct entry *bucket[BUCKETS];
} table[STRIPES];

static pthread_mutex_t sweep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sweep_cv = PTHREAD_COND_INITIALIZER;
static uint64_t expired_total;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) {
        h ^= (uint8_t)*s++;
        h *= 1099511628211ull;
    }
    return h;
}

static struct entry **find(struct stripe *st, const char *key, uint64_t h)
{
    struct entry **p = &st->bucket[(h / STRIPES) % BUCKETS];
    while (*p && strcmp((*p)->key, key) != 0)
        p = &(*p)->next;
    return p;
}

static void drop(struct entry **p)
{
    struct entry *e = *p;
    *p = e->next;
    free(e->key);
    free(e->value);
    free(e);
}

static int command(char *line, char *out, size_t cap)
{
    char *save, *cmd = strtok_r(line, " ", &save), *key = strtok_r(NULL, " ", &save);
    char *value = strtok_r(NULL, " ", &save), *ttl = strtok_r(NULL, " ", &save);
    if (!cmd)
        return snprintf(out, cap, "ERROR empty\n");
    if (strcmp(cmd, "SHUTDOWN") == 0)
        return -1;
    if (strcmp(cmd, "DIGEST") == 0) {
        uint64_t d = 1469598103934665603ull, n = 0;
        for (int s = 0; s < STRIPES; s++) {
            pthread_mutex_lock(&table[s].mu);
            for (int b = 0; b < BUCKETS; b++)
                for (struct entry *e = table[s].bucket[b]; e; e = e->next, n++)
                    d = (d ^ hash(e->key) ^ (hash(e->value) << 1)) * 1099511628211ull;
            pthread_mutex_unlock(&table[s].mu);
        }
        return snprintf(out, cap, "DIGEST %016llx %llu expired %llu\n", (unsigned long long)d,
                        (unsigned long long)n, (unsigned long long)expired_total);
    }
    if (strcmp(cmd, "TIME") == 0) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        return snprintf(out, cap, "TIME %ld.%06ld\n", (long)tv.tv_sec, (long)tv.tv_usec);
    }
    if (!key)
        return snprintf(out, cap, "ERROR no key\n");
    uint64_t h = hash(key);
    struct stripe *st = &table[h % STRIPES];
    pthread_mutex_lock(&st->mu);
    struct entry **p = find(st, key, h);
    int n;
    if (strcmp(cmd, "SET") == 0 && value) {
        if (*p)
            drop(p);
        struct entry *e = calloc(1, sizeof *e);
        e->key = strdup(key);
        e->value = strdup(value);
        e->expires_ms = ttl ? now_ms() + atoll(ttl) : 0;
        e->next = NULL;
        *p = e;
        n = snprintf(out, cap, "OK\n");
    } else if (strcmp(cmd, "GET") == 0) {
        n = *p ? snprintf(out, cap, "VALUE %s\n", (*p)->value) : snprintf(out, cap, "NONE\n");
    } else if (strcmp(cmd, "INCR") == 0) {
        char num[24];
        snprintf(num, sizeof num, "%lld", (*p ? atoll((*p)->value) : 0) + 1);
        if (*p) {
            free((*p)->value);
            (*p)->value = strdup(num);
        } else {
            struct entry *e = calloc(1, sizeof *e);
            e->key = strdup(key);
            e->value = strdup(num);
            *p = e;
        }
        n = snprintf(out, cap, "VALUE %s\n", num);
    } else if (strcmp(cmd, "DEL") == 0) {
        n = *p ? (drop(p), snprintf(out, cap, "DELETED\n")) : snprintf(out, cap, "NONE\n");
    } else {
        n = snprintf(out, cap, "ERROR unknown command\n");
    }
    pthread_mutex_unlock(&st->mu);
    return n;
}

static void *sweeper(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&sweep_mu);
    for (;;) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 10 * 1000000;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&sweep_cv, &sweep_mu, &dl);
        int64_t now = now_ms();
        for (int s = 0; s < STRIPES; s++) {
            pthread_mutex_lock(&table[s].mu);
            for (int b = 0; b < BUCKETS; b++)
                for (struct entry **p = &table[s].bucket[b]; *p;)
                    if ((*p)->expires_ms && (*p)->expires_ms <= now) {
                        drop(p);
                        expired_total++;
                    } else {
                        p = &(*p)->next;
                    }
            pthread_mutex_unlock(&table[s].mu);
        }
    }
    return NULL;
}

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct linebuf b = {.len = 0};
    char out[16384];
    for (;;) {
        ssize_t r = read(fd, b.data + b.len, sizeof b.data - b.len);
        if (r <= 0)
            break;
        b.len += (size_t)r;
        size_t start = 0, outlen = 0;
        for (size_t i = 0; i < b.len; i++) {
            if (b.data[i] != '\n')
                continue;
            b.data[i] = 0;
            if (i > start && b.data[i - 1] == '\r')
                b.data[i - 1] = 0;
            int n = command(b.data + start, out + outlen, sizeof out - outlen);
            if (n < 0) {
                (void)!write(fd, out, outlen);
                (void)!write(fd, "BYE\n", 4);
                exit(0);
            }
            outlen += (size_t)n;
            start = i + 1;
            if (sizeof out - outlen < 600)
                break;
        }
        memmove(b.data, b.data + start, b.len - start);
        b.len -= start;
        if (outlen && write(fd, out, outlen) != (ssize_t)outlen)
            break;
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    for (int s = 0; s < STRIPES; s++)
        pthread_mutex_init(&table[s].mu, NULL);
    pthread_t th;
    pthread_create(&th, NULL, sweeper, NULL);
    int lfd = listen_on(argc > 1 ? atoi(argv[1]) : 7000);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_create(&th, NULL, serve, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}
