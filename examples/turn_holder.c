/* Threads that go a long while without a call that, under llft-run
 * --serialize, gives up the replica's turn:
 *
 *   futex    a worker waits for a gate with syscall(SYS_futex,
 *            FUTEX_WAIT_PRIVATE), as the JVM parks its threads at a
 *            safepoint, and the main thread opens the gate ROUNDS times;
 *   compute  a worker computes for tens of milliseconds between calls, as
 *            a JVM thread loading classes does, while the main thread
 *            wakes from short naps and wants the turn.
 *
 * Both threads add to one counter outside any lock, with a window in which
 * the other's additions are lost: the count printed at the end agrees at
 * every replica only if the two never run side by side.
 *
 * usage: turn_holder futex|compute [ROUNDS] */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long rounds = 20;
static volatile long counter;
static uint32_t gate;

static void racy_add(long n)
{
    long v = counter;
    for (volatile int i = 0; i < 20000; i++)
        ;
    counter = v + n;
}

static void nap_us(long us)
{
    nanosleep(&(struct timespec){0, us * 1000}, NULL);
}

static void *futex_worker(void *arg)
{
    (void)arg;
    for (uint32_t r = 1; r <= rounds; r++) {
        uint32_t g;
        while ((g = __atomic_load_n(&gate, __ATOMIC_ACQUIRE)) < r)
            syscall(SYS_futex, &gate, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
        racy_add(r);
    }
    return NULL;
}

static void futex_main(void)
{
    for (uint32_t r = 1; r <= rounds; r++) {
        nap_us(2000);
        racy_add(r);
        __atomic_store_n(&gate, r, __ATOMIC_RELEASE);
        syscall(SYS_futex, &gate, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    }
}

/* About 40 ms of arithmetic on this machine, no call in it. */
static uint64_t compute(uint64_t x)
{
    for (long i = 0; i < 40000000; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x;
}

static void *compute_worker(void *arg)
{
    (void)arg;
    uint64_t x = 1;
    for (long r = 1; r <= rounds; r++) {
        x = compute(x);
        racy_add((long)(x & 0xff));
        nap_us(500);
    }
    return NULL;
}

static void compute_main(void)
{
    for (long r = 1; r <= rounds * 4; r++) {
        nap_us(5000);
        racy_add(1);
    }
}

int main(int argc, char **argv)
{
    int futex = argc > 1 && strcmp(argv[1], "futex") == 0;
    if (argc < 2 || (!futex && strcmp(argv[1], "compute") != 0)) {
        fprintf(stderr, "usage: turn_holder futex|compute [ROUNDS]\n");
        return 2;
    }
    if (argc > 2)
        rounds = atol(argv[2]);
    pthread_t worker;
    pthread_create(&worker, NULL, futex ? futex_worker : compute_worker, NULL);
    if (futex)
        futex_main();
    else
        compute_main();
    pthread_join(worker, NULL);
    printf("%s: %ld\n", argv[1], counter);
    return 0;
}
