/* The shape of memcached's shutdown: the main thread loops, reading the
 * clock, until a flag it reads without a lock is set; a worker sets it,
 * then waits on a condition that is never signalled.  The main thread
 * exits with status 3.
 *
 * Usage: stop_flag
 * STOP_FLAG_LATE_REPLICA=K makes replica K (from $LLFT_REPLICA) set the
 * flag 200 ms late, so that its main thread reads the clock more often
 * than the primary's did: a thread going past the primary's end of stream
 * while every other one is blocked where the primary's was. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

static void *worker(void *arg)
{
    int late = *(int *)arg;
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
    if (late)
        usleep(200 * 1000);
    stop = 1;
    pthread_mutex_lock(&lock);
    for (;;)
        pthread_cond_wait(&never, &lock);
    return NULL;
}

int main(void)
{
    const char *lr = getenv("STOP_FLAG_LATE_REPLICA"), *me = getenv("LLFT_REPLICA");
    int late = lr && me && atoi(lr) == atoi(me);
    pthread_t th;
    if (pthread_create(&th, NULL, worker, &late) != 0)
        return 1;
    while (!stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        usleep(1000);
    }
    return 3;
}
