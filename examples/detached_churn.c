#define _GNU_SOURCE
/* detached_churn: creates THREADS detached threads one after another, as
 * a server that starts a thread per connection does; each takes one
 * shared mutex once.  The main thread waits on a condition variable until
 * every one has, then prints the count.  A backup replays the threads'
 * acquisitions in the primary's order while thousands of them are alive
 * at once, all waiting on the one mutex.
 * usage: detached_churn [THREADS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static long done;

static void *run(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    done++;
    pthread_cond_signal(&all_done);
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(int argc, char **argv)
{
    long threads = argc > 1 ? atol(argv[1]) : 3000;
    for (long i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, run, NULL) != 0)
            return 1;
        pthread_detach(t);
    }
    pthread_mutex_lock(&mu);
    while (done < threads)
        pthread_cond_wait(&all_done, &mu);
    printf("%ld threads\n", done);
    pthread_mutex_unlock(&mu);
    return 0;
}
