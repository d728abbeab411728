#define _GNU_SOURCE
/* racy_counter: two threads add to one counter ROUNDS times each, each
 * under its own mutex: the critical sections do not exclude each other,
 * so updates are lost, and how many depends on how the threads
 * interleave.  Every call llft records matches at every replica, yet the
 * count printed at the end differs: a data race outside the locks.
 * usage: racy_counter [ROUNDS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t mu[2] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static volatile long counter;
static long rounds = 100000;

static void *add(void *arg)
{
    pthread_mutex_t *m = arg;
    for (long i = 0; i < rounds; i++) {
        pthread_mutex_lock(m);
        long v = counter;
        if (i % 8 == 0) /* a window in which the other thread's updates are lost, more or fewer by timing */
            nanosleep(&(struct timespec){0, 1000}, NULL);
        counter = v + 1;
        pthread_mutex_unlock(m);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atol(argv[1]);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, add, &mu[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("%ld of %ld\n", counter, 2 * rounds);
    return 0;
}
