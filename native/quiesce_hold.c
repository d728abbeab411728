/* The controller's side of a quiesce (the shim's is quiesce.c): holds a
 * primary so that no thread is inside the real blocking call of a
 * primary branch, for as long as a checkpoint of it takes. */
#include "llft_abi.h"
#include "ring.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define KICK_EVERY_US 500

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A thread's id here and as it sees it: a replica restored from a
 * checkpoint runs in a PID namespace of its own (the last field of NSpid
 * in its status). */
struct thread_ids {
    int tid, own;
};

static int own_tid(int pid, int tid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", pid, tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return tid;
    int own = tid;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "NSpid:", 6) == 0) {
            char *last = strrchr(line, '\t');
            if (last)
                own = atoi(last + 1);
            break;
        }
    fclose(f);
    return own;
}

/* Sends the census signal to every thread of pid (their ids into ids, at
 * most max); how many got it. */
static int census(int pid, struct thread_ids *ids, int max, int *nids)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    int sent = 0;
    *nids = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int tid = atoi(e->d_name);
        if (tid <= 0)
            continue;
        if (*nids < max) {
            ids[*nids] = (struct thread_ids){tid, own_tid(pid, tid)};
            (*nids)++;
        }
        if (syscall(SYS_tgkill, pid, tid, LLFT_CENSUS_SIGNAL) == 0)
            sent++;
    }
    closedir(d);
    return sent;
}

/* Interrupts each thread listed (by its own id) as blocked. */
static void kick_listed(llft_ctl_t *c, int pid, const struct thread_ids *ids, int nids)
{
    for (int i = 0; i < LLFT_QUIESCE_KICKS; i++) {
        int32_t own = __atomic_load_n(&c->q_blocked[i], __ATOMIC_ACQUIRE);
        if (own <= 0)
            continue;
        for (int k = 0; k < nids; k++)
            if (ids[k].own == own) {
                syscall(SYS_tgkill, pid, ids[k].tid, LLFT_KICK_SIGNAL);
                break;
            }
    }
}

void llft_quiesce_release(llft_ctl_t *c)
{
    __atomic_store_n(&c->quiesce, 0, __ATOMIC_SEQ_CST);
    llft_futex_wake(&c->quiesce);
}

/* 0 once every thread of pid has answered (the primary is held until
 * llft_quiesce_release); -ETIMEDOUT after timeout_ms (released again), or
 * another -errno.  *threads: how many threads answered. */
int llft_quiesce_hold(llft_ctl_t *c, int pid, int timeout_ms, int *threads)
{
    uint64_t gen = (__atomic_load_n(&c->q_census, __ATOMIC_ACQUIRE) >> 32) + 1;
    __atomic_store_n(&c->q_census, gen << 32, __ATOMIC_SEQ_CST);   /* a new census, nobody counted */
    for (int i = 0; i < LLFT_QUIESCE_KICKS; i++)
        __atomic_store_n(&c->q_blocked[i], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->quiesce, 1, __ATOMIC_SEQ_CST);
    struct thread_ids *ids = malloc(sizeof *ids * LLFT_QUIESCE_KICKS);
    int nids = 0;
    int sent = ids ? census(pid, ids, LLFT_QUIESCE_KICKS, &nids) : -ENOMEM;
    *threads = sent;
    if (sent <= 0) {
        free(ids);
        llft_quiesce_release(c);
        return sent < 0 ? sent : -ESRCH;
    }
    uint64_t until = now_us() + (uint64_t)timeout_ms * 1000u;
    for (;;) {
        if ((int)(uint32_t)__atomic_load_n(&c->q_census, __ATOMIC_ACQUIRE) >= sent) {
            free(ids);
            return 0;
        }
        if (now_us() >= until) {
            free(ids);
            llft_quiesce_release(c);
            return -ETIMEDOUT;
        }
        kick_listed(c, pid, ids, nids);
        struct timespec nap = {0, KICK_EVERY_US * 1000L};
        nanosleep(&nap, NULL);
    }
}
