/* determinizer_bench: per-call cost of the calls llft records, run plain,
 * as an llft primary (recording) or as an llft backup (replaying).
 *
 * It times itself with the clock_gettime *system call*, which llft does not
 * interpose: the libc clock_gettime is what is being measured, and at a
 * backup it returns the primary's readings.
 *
 * Prints one JSON line per measurement: the median over REPS repetitions of
 * nanoseconds per operation, and a final line with the total elapsed time.
 * usage: determinizer_bench [ops-per-rep] [reps] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long ops = 100000;
static int reps = 5;

static uint64_t raw_ns(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *name, int threads, double *samples)
{
    qsort(samples, (size_t)reps, sizeof *samples, cmp);
    printf("{\"bench\": \"%s\", \"threads\": %d, \"ops\": %ld, \"reps\": %d, \"ns_per_op\": %.2f, "
           "\"min\": %.2f, \"max\": %.2f}\n",
           name, threads, ops, reps, samples[reps / 2], samples[0], samples[reps - 1]);
    fflush(stdout);
}

static volatile uint64_t sink;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t shared;

static void *hammer(void *arg)
{
    long n = (long)(intptr_t)arg;
    for (long i = 0; i < n; i++) {
        pthread_mutex_lock(&mu);
        shared++;
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static double contended(int threads)
{
    pthread_t th[8];
    long per = ops / threads;
    uint64_t t0 = raw_ns();
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)per);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    return (double)(raw_ns() - t0) / (double)(per * threads);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        ops = atol(argv[1]);
    if (argc > 2)
        reps = atoi(argv[2]);
    if (ops < 1000 || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: determinizer_bench [ops-per-rep >= 1000] [reps 1-99]\n");
        return 2;
    }
    double s[99];
    uint64_t start = raw_ns();

    for (int r = 0; r < reps; r++) {
        struct timespec ts;
        uint64_t t0 = raw_ns();
        for (long i = 0; i < ops; i++) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            sink += (uint64_t)ts.tv_nsec;
        }
        s[r] = (double)(raw_ns() - t0) / (double)ops;
    }
    report("clock_gettime", 1, s);

    for (int r = 0; r < reps; r++) {
        struct timeval tv;
        uint64_t t0 = raw_ns();
        for (long i = 0; i < ops; i++) {
            gettimeofday(&tv, NULL);
            sink += (uint64_t)tv.tv_usec;
        }
        s[r] = (double)(raw_ns() - t0) / (double)ops;
    }
    report("gettimeofday", 1, s);

    for (int r = 0; r < reps; r++) {
        uint64_t t0 = raw_ns();
        for (long i = 0; i < ops; i++) {
            pthread_mutex_lock(&mu);
            shared++;
            pthread_mutex_unlock(&mu);
        }
        s[r] = (double)(raw_ns() - t0) / (double)ops;
    }
    report("mutex_uncontended", 1, s);

    for (int threads = 2; threads <= 4; threads += 2) {
        for (int r = 0; r < reps; r++)
            s[r] = contended(threads);
        report("mutex_contended", threads, s);
    }
    printf("{\"bench\": \"total\", \"elapsed_ms\": %.1f, \"shared\": %lu}\n",
           (double)(raw_ns() - start) / 1e6, (unsigned long)shared);
    return 0;
}
