#define _GNU_SOURCE
/* racy_counter: data races outside any lock.
 *
 * Two threads add to one counter, ROUNDS and ROUNDS/2 times, each under its
 * own mutex: the critical sections do not exclude each other, so updates are
 * lost, and how many depends on how the threads interleave.  Then the
 * second thread spin-waits on an atomic flag that the main thread raises
 * once the first has ended and a nap has passed, yielding every 1024 spins,
 * and counts its spins.  Every call llft records matches at every replica, yet the count
 * and the spins printed at the end differ: unless the threads take turns
 * (llft-run --serialize).
 *
 * With "pure-spin" the spin makes no call at all, nor counts: under
 * --serialize the spinning thread never gives up its turn, and the main
 * thread must be let run beside it to raise the flag.
 *
 * usage: racy_counter [ROUNDS [pure-spin]] */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu[2] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static volatile long counter;
static long rounds = 100000;
static atomic_int released;
static long spins;
static int pure_spin;

static void *add(void *arg)
{
    pthread_mutex_t *m = arg;
    long mine = m == &mu[0] ? rounds : rounds / 2; /* the second ends first, and spins */
    for (long i = 0; i < mine; i++) {
        pthread_mutex_lock(m);
        long v = counter;
        if (i % 8 == 0) /* a window in which the other thread's updates are lost, more or fewer by timing */
            nanosleep(&(struct timespec){0, 1000}, NULL);
        counter = v + 1;
        pthread_mutex_unlock(m);
    }
    if (m == &mu[1])
        while (!atomic_load_explicit(&released, memory_order_acquire))
            if (!pure_spin && ++spins % 1024 == 0)
                sched_yield();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atol(argv[1]);
    pure_spin = argc > 2 && strcmp(argv[2], "pure-spin") == 0;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, add, &mu[i]);
    pthread_join(t[0], NULL);
    usleep(5000);
    atomic_store_explicit(&released, 1, memory_order_release);
    pthread_join(t[1], NULL);
    printf("%ld of %ld, %ld spins\n", counter, rounds + rounds / 2, spins);
    return 0;
}
