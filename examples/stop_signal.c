/* The shape of memcached's shutdown by its "shutdown" command: the main
 * thread waits in poll() with a short timeout, in a loop that ends when a
 * flag it reads without a lock is set; a worker raises SIGUSR1, whose
 * handler sets the flag and reads the clock; then the main thread closes
 * the pipe it waited on (a recorded call: the primary's main thread has a
 * record after its loop) and the program exits with status 3.
 *
 * Usage: stop_signal [quiet]
 * With "quiet" the handler only sets the flag, as memcached's does (it
 * prints), and the worker records nothing after the raise: no call but
 * the raise marks the flag as set.
 * STOP_FLAG_LATE_REPLICA=K makes replica K (from $LLFT_REPLICA) raise the
 * signal 200 ms late: its main thread's waits return, replayed, while the
 * worker has not got that far, unless each wait waits for the calls the
 * primary's other threads made before it returned. */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static int quiet;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;

static void on_usr1(int sig)
{
    (void)sig;
    stop = 1;
    if (quiet)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
}

static void *worker(void *arg)
{
    int late = *(int *)arg;
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
    if (quiet) { /* nothing recorded after the raise: it waits for good */
        usleep(20 * 1000);
        pthread_mutex_lock(&lock);
        usleep(late ? 200 * 1000 : 0);
    } else {
        usleep(late ? 200 * 1000 : 20 * 1000);
    }
    raise(SIGUSR1);
    if (!quiet)
        pthread_mutex_lock(&lock);
    for (;;)
        pthread_cond_wait(&never, &lock);
    return NULL;
}

int main(int argc, char **argv)
{
    quiet = argc > 1 && argv[1][0] == 'q';
    const char *lr = getenv("STOP_FLAG_LATE_REPLICA"), *me = getenv("LLFT_REPLICA");
    int late = lr && me && atoi(lr) == atoi(me);
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return 1;
    int p[2];
    if (pipe(p) != 0)
        return 1;
    pthread_t th;
    if (pthread_create(&th, NULL, worker, &late) != 0)
        return 1;
    while (!stop) {
        struct pollfd pfd = {.fd = p[0], .events = POLLIN};
        poll(&pfd, 1, 1);
    }
    close(p[0]);
    return 3;
}
