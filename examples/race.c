/* race: a deliberately non-deterministic multi-threaded program.
 *
 * Worker threads race on a mutex (lock and trylock), a condition variable
 * with short timed waits, a rwlock and a semaphore, and read the clocks and
 * getrandom.  At the end it prints digests of
 *   order  - the sequence in which threads got the shared lock,
 *   values - every clock reading and random byte seen,
 *   counts - how many trylocks failed and timed waits timed out,
 * and one combined digest.  Run twice without llft and the digests differ;
 * under llft every replica prints the primary's.
 *
 * usage: race [threads] [iterations]
 * RACE_DIVERGE_REPLICA=K makes replica K (from $LLFT_REPLICA) read the clock
 * once more than the others: a test of divergence detection. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <time.h>

#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static inline uint64_t fnv(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= FNV_PRIME;
    }
    return h;
}

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t try_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
static sem_t tokens;

static uint64_t order_digest = FNV_OFFSET; /* under order_mu */
static uint64_t shared_value;              /* under rw */
static uint64_t cv_generation;             /* under cv_mu */
static uint64_t try_won, try_busy, cv_timeouts; /* under order_mu */

static int iterations = 2000;
static int diverge_at = -1; /* iteration at which this replica diverges, or -1 */

struct worker {
    int id;
    uint64_t values;
    pthread_t th;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    w->values = FNV_OFFSET;
    for (int i = 0; i < iterations; i++) {
        struct timespec ts;
        struct timeval tv;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        w->values = fnv(w->values, (uint64_t)ts.tv_nsec);
        if (i == diverge_at && w->id == 0)
            clock_gettime(CLOCK_REALTIME, &ts); /* the divergence under test */
        if (i % 16 == 0) {
            gettimeofday(&tv, NULL);
            w->values = fnv(w->values, (uint64_t)tv.tv_usec);
            w->values = fnv(w->values, (uint64_t)time(NULL));
            uint64_t r;
            if (getrandom(&r, sizeof r, 0) == sizeof r)
                w->values = fnv(w->values, r);
        }

        int got = pthread_mutex_trylock(&try_mu) == 0;
        if (got) {
            for (volatile int k = 0; k < 50; k++)
                ;
            pthread_mutex_unlock(&try_mu);
        }

        pthread_mutex_lock(&order_mu);
        order_digest = fnv(order_digest, ((uint64_t)w->id << 32) | (uint64_t)i);
        if (got)
            try_won++;
        else
            try_busy++;
        pthread_mutex_unlock(&order_mu);

        if (i % 8 == 0) {
            pthread_rwlock_wrlock(&rw);
            shared_value = shared_value * 31 + (uint64_t)w->id;
            pthread_rwlock_unlock(&rw);
        } else {
            pthread_rwlock_rdlock(&rw);
            w->values = fnv(w->values, shared_value);
            pthread_rwlock_unlock(&rw);
        }

        if (i % 64 == 0) {
            sem_wait(&tokens);
            sem_post(&tokens);
            /* Ping-pong on a condition variable with a 200 us deadline:
             * whether it times out depends on the scheduler. */
            pthread_mutex_lock(&cv_mu);
            if (w->id % 2 == 0) {
                cv_generation++;
                pthread_cond_broadcast(&cv);
            } else {
                uint64_t gen = cv_generation;
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_nsec += 200000;
                if (dl.tv_nsec >= 1000000000L) {
                    dl.tv_sec++;
                    dl.tv_nsec -= 1000000000L;
                }
                int rc = 0;
                while (gen == cv_generation && rc == 0)
                    rc = pthread_cond_timedwait(&cv, &cv_mu, &dl);
                if (rc == ETIMEDOUT) {
                    pthread_mutex_lock(&order_mu);
                    cv_timeouts++;
                    pthread_mutex_unlock(&order_mu);
                }
            }
            pthread_mutex_unlock(&cv_mu);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int nthreads = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        iterations = atoi(argv[2]);
    if (nthreads < 1 || nthreads > 64 || iterations < 1) {
        fprintf(stderr, "usage: race [threads 1-64] [iterations >= 1]\n");
        return 2;
    }
    const char *dr = getenv("RACE_DIVERGE_REPLICA"), *me = getenv("LLFT_REPLICA");
    if (dr && me && atoi(dr) == atoi(me))
        diverge_at = iterations / 2;
    sem_init(&tokens, 0, 2);

    struct worker w[64];
    for (int i = 0; i < nthreads; i++) {
        w[i].id = i;
        if (pthread_create(&w[i].th, NULL, work, &w[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    uint64_t values = FNV_OFFSET;
    for (int i = 0; i < nthreads; i++) {
        pthread_join(w[i].th, NULL);
        values = fnv(values, w[i].values);
    }
    uint64_t counts = fnv(fnv(fnv(FNV_OFFSET, try_won), try_busy), cv_timeouts);
    uint64_t all = fnv(fnv(fnv(FNV_OFFSET, order_digest), values), counts);
    printf("order=%016" PRIx64 "\n", order_digest);
    printf("values=%016" PRIx64 "\n", values);
    printf("counts=%016" PRIx64 " trylock_won=%" PRIu64 " trylock_busy=%" PRIu64 " timedwait_timeouts=%" PRIu64 "\n",
           counts, try_won, try_busy, cv_timeouts);
    printf("digest=%016" PRIx64 "\n", all);
    return 0;
}
