/* The wait family.  Under --fork replicate the processes a replica forks
 * are replicated too (fork_stream.c): what a wait returned at the primary
 * (which child, its status, its resource usage) is recorded, and a backup
 * returns it, having reaped its own child that stands for that one (the
 * pid map), which ends once it has replayed its own stream to the end.
 * Otherwise the children run unrecorded and the waits are the program's
 * own.  Either way a daemon's held child is let go first (it would never
 * end: daemon_fork.c), and each wait is a switch point under --serialize,
 * as pthread_join is. */
#include "shim.h"

#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>

DEFINE_REAL(wait4)
DEFINE_REAL(waitid)

enum { W_WAIT4 = 1, W_WAITID = 2 };

struct wait_call {
    int kind;
    pid_t pid;                /* W_WAIT4 */
    int *status;
    struct rusage *usage;
    idtype_t idtype;          /* W_WAITID */
    id_t id;
    siginfo_t *info;
    int options;
};

/* What a wait fills besides its status word, recorded whole. */
union wait_data {
    struct rusage usage;
    siginfo_t info;
};

static uint64_t data_len(const struct wait_call *w)
{
    if (w->kind == W_WAIT4)
        return w->usage ? sizeof(struct rusage) : 0;
    return sizeof(siginfo_t); /* si_pid: which child a backup reaps */
}

/* Whether the wait took the child away (not a stopped or continued one,
 * nor one waitid only looked at). */
static int reaped(const struct wait_call *w, long r, int status, const union wait_data *d)
{
    if (w->kind == W_WAIT4)
        return r > 0 && (WIFEXITED(status) || WIFSIGNALED(status));
    return r == 0 && !(w->options & WNOWAIT) && d->info.si_pid > 0 &&
           (d->info.si_code == CLD_EXITED || d->info.si_code == CLD_KILLED || d->info.si_code == CLD_DUMPED);
}

/* The real call, pids as the program holds them on both sides. */
static long real_wait(const struct wait_call *w, int *status, union wait_data *d)
{
    long r;
    *status = 0;
    memset(d, 0, sizeof *d);
    if (w->kind == W_WAIT4) {
        r = REAL(wait4)(w->pid > 0 ? llft_pid_local(w->pid) : w->pid, status, w->options,
                        w->usage ? &d->usage : NULL);
        if (r > 0) {
            pid_t program = llft_pid_program((pid_t)r);
            if (reaped(w, r, *status, d))
                llft_pid_forget(program);
            r = program;
        }
    } else {
        id_t id = w->idtype == P_PID ? (id_t)llft_pid_local((pid_t)w->id) : w->id;
        r = REAL(waitid)(w->idtype, id, &d->info, w->options);
        if (r == 0 && d->info.si_pid > 0) {
            pid_t program = llft_pid_program(d->info.si_pid);
            if (reaped(w, r, 0, d))
                llft_pid_forget(program);
            d->info.si_pid = program;
        }
    }
    return r;
}

/* Backup: its own child that stands for the primary's (program), reaped
 * once it has ended. */
static void reap_own(pid_t program)
{
    pid_t local = llft_pid_local(program);
    if (local == program)
        return; /* not one this process forked as a backup */
    llft_pid_forget(program);
    while (REAL(wait4)(local, NULL, __WALL, NULL) < 0 && errno == EINTR)
        ;
}

static void give_back(const struct wait_call *w, int status, const union wait_data *d)
{
    if (w->status)
        *w->status = status;
    if (w->kind == W_WAIT4 && w->usage)
        *w->usage = d->usage;
    if (w->kind == W_WAITID && w->info)
        *w->info = d->info;
}

static long wait_call(const struct wait_call *w)
{
    if (llft_fork_held)
        llft_daemon_fork_settle(0);
    struct llft_thread *t;
    int role = llft_mode(&t);
    union wait_data d;
    int status;
    if (role == LLFT_ROLE_OFF || llft_ctl->fork_mode != LLFT_FORKS_REPLICATED) {
        long r = real_wait(w, &status, &d);
        give_back(w, status, &d);
        return r;
    }
    uint64_t len = data_len(w);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_WAIT, &e)) {
            if (e.aux != (uint32_t)w->kind)
                llft_diverge(t, LLFT_OP_WAIT, &e, LLFT_EXIT_DIVERGED, "a different kind of wait than the primary's");
            memset(&d, 0, sizeof d);
            llft_replay_data(t, &d, len);
            status = (int)e.obj;
            pid_t child = w->kind == W_WAIT4 ? (pid_t)e.ret : d.info.si_pid;
            if (reaped(w, e.ret, status, &d))
                reap_own(child);
            give_back(w, status, &d);
            errno = e.err;
            return e.ret;
        }
        role = LLFT_ROLE_PRIMARY; /* taken over */
    }
    long r = real_wait(w, &status, &d);
    int err = r < 0 ? errno : 0;
    llft_record_data_aux(t, LLFT_OP_WAIT, (uint64_t)(uint32_t)status, 0, r, err, &d, len, (uint32_t)w->kind);
    give_back(w, status, &d);
    errno = err;
    return r;
}

#define WAIT_WRAPPER(ret, name, params, ...)                                      \
    EXPORT ret name params                                                        \
    {                                                                             \
        struct wait_call w = {__VA_ARGS__};                                       \
        LLFT_SWITCH_POINT(ret, (ret)wait_call(&w));                               \
    }

WAIT_WRAPPER(pid_t, wait, (int *status), .kind = W_WAIT4, .pid = -1, .status = status)
WAIT_WRAPPER(pid_t, waitpid, (pid_t pid, int *status, int options), .kind = W_WAIT4, .pid = pid,
             .status = status, .options = options)
WAIT_WRAPPER(pid_t, wait3, (int *status, int options, struct rusage *usage), .kind = W_WAIT4, .pid = -1,
             .status = status, .usage = usage, .options = options)
WAIT_WRAPPER(pid_t, wait4, (pid_t pid, int *status, int options, struct rusage *usage), .kind = W_WAIT4,
             .pid = pid, .status = status, .usage = usage, .options = options)
WAIT_WRAPPER(int, waitid, (idtype_t type, id_t id, siginfo_t *info, int options), .kind = W_WAITID,
             .idtype = type, .id = id, .info = info, .options = options)
