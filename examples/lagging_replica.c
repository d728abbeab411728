/* lagging_replica: a waiter thread sleeps on a condition while the main
 * thread takes a mutex ROUNDS times, then wakes it and exits 0; a third
 * thread reads a pipe nobody writes, and is still reading at the exit.  The
 * replica named by $LAG_REPLICA (llft's $LLFT_REPLICA) spins about a
 * millisecond after each round, without a call llft sees, so that as a
 * backup it is still replaying long after its primary exited: its waiter
 * has waited the whole time for a turn many rounds ahead, and the replica
 * is behind but never stuck.
 * usage: lagging_replica ROUNDS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int done;
static unsigned long counter;

static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!done)
        pthread_cond_wait(&done_cond, &lock);
    counter *= 3;
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *reader(void *arg)
{
    char c;
    return read(*(int *)arg, &c, 1) == 1 ? NULL : arg;
}

static void spin_a_millisecond(void)
{
    for (volatile unsigned long spins = 0; spins < 5000000ul; spins++)   /* every clock read is a call llft sees */
        ;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    const char *lag = getenv("LAG_REPLICA"), *me = getenv("LLFT_REPLICA");
    int lagging = lag && me && atoi(lag) == atoi(me);
    pthread_t t, r;
    int never_written[2];
    if (pipe(never_written) != 0)
        return 1;
    pthread_create(&r, NULL, reader, &never_written[0]);
    pthread_create(&t, NULL, waiter, NULL);
    for (long i = 0; i < rounds; i++) {
        pthread_mutex_lock(&lock);
        counter += (unsigned long)i;
        pthread_mutex_unlock(&lock);
        if (lagging)
            spin_a_millisecond();
    }
    pthread_mutex_lock(&lock);
    done = 1;
    pthread_cond_signal(&done_cond);
    pthread_mutex_unlock(&lock);
    pthread_join(t, NULL);
    printf("counter=%lu\n", counter);
    return 0;
}
