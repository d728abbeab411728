/* fork_wait [N [MS]]: forks N children that run at once, each reading the clock
 * and the random device, starting a thread that shares a lock with it,
 * and (the first) forking a grandchild of its own, (the last) exec'ing a
 * shell that forks a command; the parent lets them print their lines one
 * by one, waits for each, and prints how each ended.  MS: each child
 * also sleeps that long on its way (a failover then finds them running:
 * tests/test_forked_processes.py).  Under llft-run
 * --fork replicate every replica's stdout is the primary's: the children
 * are replicas too, each on a record stream of its own
 * (tests/test_forked_processes.py). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t shared;
static int pause_ms;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t random64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v)
        exit(90);
    return v;
}

static void *helper(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&lock);
        shared = shared * 31 + (random64() & 0xff);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void read_byte(int fd)
{
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR)
        ;
}

/* Child i: its work, then its line on stdout when the parent says go. */
static void child(int i, int n, int go, int done)
{
    pthread_t th;
    pthread_create(&th, NULL, helper, NULL);
    for (int k = 0; k < 100; k++) {
        pthread_mutex_lock(&lock);
        shared = shared * 17 + (now_ns() & 0xff);
        pthread_mutex_unlock(&lock);
        if (k % 25 == 0)
            usleep((unsigned)(random64() % 2000) + (unsigned)pause_ms * 250);
    }
    pthread_join(th, NULL);
    char extra[96] = "";
    if (i == 0) {
        pid_t g = fork();
        if (g == 0)
            _exit((int)(random64() % 50) + 1);
        int st;
        pid_t w = waitpid(g, &st, 0);
        snprintf(extra, sizeof extra, " grandchild %s exit %d", w == g ? "reaped" : "lost", WEXITSTATUS(st));
    }
    read_byte(go);
    if (i == n - 1) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "echo \"child %d exec'd a shell, pid $$ of %d, clock $(date +%%N)\"; exit 5",
                 i, (int)getppid());
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(91);
    }
    printf("child %d pid %d ppid %d clock %llu random %llu mixed %llu%s\n", i, (int)getpid(), (int)getppid(),
           (unsigned long long)now_ns(), (unsigned long long)random64(), (unsigned long long)shared, extra);
    fflush(stdout);
    if (write(done, "k", 1) != 1)
        _exit(92);
    if (i == 1)
        raise(SIGTERM);
    _exit(10 + i);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4;
    pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    if (n < 2 || n > 64)
        return 2;
    pid_t pids[64];
    int go[64], done[64];
    printf("parent pid %d forks %d children\n", (int)getpid(), n);
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        int g[2], d[2];
        if (pipe(g) || pipe(d))
            return 3;
        pid_t p = fork();
        if (p < 0)
            return 4;
        if (p == 0) {
            close(g[1]);
            close(d[0]);
            child(i, n, g[0], d[1]);
        }
        close(g[0]);
        close(d[1]);
        pids[i] = p;
        go[i] = g[1];
        done[i] = d[0];
    }
    for (int i = 0; i < n; i++) {
        printf("parent: child %d is pid %d\n", i, (int)pids[i]);
        fflush(stdout);
        if (write(go[i], "g", 1) != 1)
            return 5;
        if (i == n - 1) {
            int st;
            waitpid(pids[i], &st, 0); /* the shell's line is out once it has ended */
            printf("parent: child %d exited %d\n", i, WEXITSTATUS(st));
        } else {
            read_byte(done[i]);
        }
    }
    for (int i = n - 2; i >= 0; i--) {
        int st;
        pid_t w = i % 2 ? waitpid(pids[i], &st, 0) : wait(&st);
        if (WIFSIGNALED(st))
            printf("parent: reaped %d, killed by signal %d\n", (int)w, WTERMSIG(st));
        else
            printf("parent: reaped %d, exit %d\n", (int)w, WEXITSTATUS(st));
        fflush(stdout);
    }
    usleep((unsigned)pause_ms * 1000); /* idle, every child gone */
    errno = 0;
    pid_t none = wait(NULL);
    printf("parent: then wait() = %d (%s)\n", (int)none, strerror(errno));
    return 0;
}
