/* Process identity.  Programs seed random generators with getpid() (redis
 * mixes it into its seeds), so every replica sees the primary's pid, and
 * goes on seeing it once it has taken over (redis compares getpid() with
 * the pid it kept to tell itself from a forked child).  A replica that
 * signals "itself" by that pid must reach itself, not the old primary:
 * kill() translates it back.  The signals a process sends itself are
 * ordered with its other calls (signal_self). */
#include "shim.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/times.h>
#include <time.h>
#include <unistd.h>

DEFINE_REAL(getpid)
DEFINE_REAL(kill)
DEFINE_REAL(getrusage)
DEFINE_REAL(times)
DEFINE_REAL(clock)

/* The pid the primary's getpid() returned, at a backup (0: none yet),
 * kept in the control block so that an image the replica execs goes on
 * with it; and a process forked under --fork replicate keeps there its
 * parent's pid as the program sees it, and as this process's kernel does
 * (fork_stream.c). */
static inline pid_t primary_pid(void)
{
    return llft_ctl ? __atomic_load_n(&llft_ctl->program_pid, __ATOMIC_RELAXED) : 0;
}

void llft_process_forked(llft_ctl_t *c, pid_t program_pid, pid_t parent_program_pid)
{
    c->program_pid = program_pid;
    c->parent_program = parent_program_pid;
    c->parent_local = (pid_t)syscall(SYS_getppid);
}

pid_t llft_program_pid(void)
{
    pid_t p = primary_pid();
    return p ? p : (pid_t)syscall(SYS_getpid);
}

EXPORT pid_t getpid(void)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_GETPID, &e)) {
            __atomic_store_n(&llft_ctl->program_pid, (pid_t)e.ret, __ATOMIC_RELAXED);
            return (pid_t)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        pid_t p = primary_pid();
        if (!p)
            p = REAL(getpid)();
        llft_record(t, LLFT_OP_GETPID, 0, 0, p, 0, p);
        return p;
    }
    return REAL(getpid)();
}

/* A signal a thread sends its own process (raise, kill of its own pid):
 * its handler runs in the call, and often sets a flag another thread
 * reads without a lock (memcached's shutdown command raises SIGINT, whose
 * handler sets the flag its main loop reads after each wait).  The primary
 * records the call once it has returned; a backup makes it for real
 * first, then takes the record, so that another thread that waits until
 * this one has taken the records the primary made before (replay.c:
 * waits follow the primary's order) finds the flag as the primary's did. */
static int signal_self(int (*send)(pid_t pid, int sig), pid_t pid, int sig)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    int r = send(pid, sig);
    int err = errno;
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_SIGNAL_SELF, &e)) {
            llft_replay_signal_sent(); /* the records after it may go to their threads */
            errno = err;
            return r;
        }
        role = LLFT_ROLE_PRIMARY; /* taken over */
    }
    if (role == LLFT_ROLE_PRIMARY)
        llft_record(t, LLFT_OP_SIGNAL_SELF, 0, 0, r, r < 0 ? err : 0, sig);
    errno = err;
    return r;
}

static int send_kill(pid_t pid, int sig) { return REAL(kill)(pid, sig); }

/* Under --fork replicate, a signal to another process is the primary's
 * to send: a backup returns what its kill returned and sends nothing,
 * since each of its processes replays its own fate (its handlers run from
 * the primary's records, and its stream ends where the primary's process
 * ended).  A pid the program holds for a process it forked is the
 * primary's child's: a replica that took over signals its own. */
static int kill_other(pid_t pid, int sig)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_KILL, &e)) {
            errno = e.err;
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    pid_t parent_program = llft_ctl->parent_program, parent_local = llft_ctl->parent_local;
    pid_t to = pid > 0 ? llft_pid_local(pid) : pid;
    if (parent_program && (to == parent_program || to == -parent_program))
        to = to > 0 ? parent_local : -parent_local;
    int r = REAL(kill)(to, sig), err = errno;
    if (role == LLFT_ROLE_PRIMARY)
        llft_record(t, LLFT_OP_KILL, 0, 0, r, r < 0 ? err : 0, sig);
    errno = err;
    return r;
}

EXPORT int kill(pid_t pid, int sig)
{
    pid_t p = primary_pid(), self = (pid_t)syscall(SYS_getpid);
    if (p && (pid == p || pid == -p))
        pid = pid > 0 ? self : -self;
    if (pid == self && sig != 0)
        return signal_self(send_kill, pid, sig);
    if (llft_ctl && llft_ctl->fork_mode == LLFT_FORKS_REPLICATED)
        return kill_other(pid, sig);
    return REAL(kill)(pid, sig);
}

/* getppid() of a forked process: its parent as the program knows it,
 * while that parent lives. */
static int64_t fill_ppid(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    pid_t real = (pid_t)syscall(SYS_getppid);
    *(pid_t *)buf = real == llft_ctl->parent_local ? llft_ctl->parent_program : real;
    return (int64_t)n;
}

EXPORT pid_t getppid(void)
{
    pid_t p;
    if (!llft_ctl || !llft_ctl->parent_program)
        return (pid_t)syscall(SYS_getppid);
    llft_recorded_call(LLFT_OP_GETPPID, 0, &p, sizeof p, fill_ppid);
    return p;
}

/* raise() is tgkill of the calling thread. */
static int send_raise(pid_t unused, int sig)
{
    (void)unused;
    return (int)syscall(SYS_tgkill, syscall(SYS_getpid), syscall(SYS_gettid), sig) == 0 ? 0 : -1;
}

EXPORT int raise(int sig) { return signal_self(send_raise, 0, sig); }

/* Resource usage is this process's own (CPU time, RSS): every replica sees
 * the primary's, as programs turn it into statistics and allocations. */
static int64_t fill_rusage(void *buf, uint64_t n, uint64_t who)
{
    return REAL(getrusage)((int)who, buf) == 0 ? (int64_t)n : -1;
}

EXPORT int getrusage(int who, struct rusage *usage)
{
    return llft_recorded_call(LLFT_OP_GETRUSAGE, (uint64_t)(uint32_t)who, usage, sizeof *usage, fill_rusage) < 0
               ? -1 : 0;
}

struct times_result {
    clock_t ret;
    struct tms tms;
};

static int64_t fill_times(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    struct times_result *r = buf;
    r->ret = REAL(times)(&r->tms);
    return r->ret == (clock_t)-1 ? -1 : (int64_t)n;
}

EXPORT clock_t times(struct tms *out)
{
    struct times_result r;
    if (llft_recorded_call(LLFT_OP_TIMES, 0, &r, sizeof r, fill_times) < 0)
        return (clock_t)-1;
    if (out)
        *out = r.tms;
    return r.ret;
}

static int64_t fill_clock(void *buf, uint64_t n, uint64_t unused)
{
    (void)unused;
    *(clock_t *)buf = REAL(clock)();
    return (int64_t)n;
}

EXPORT clock_t clock(void)
{
    clock_t c;
    llft_recorded_call(LLFT_OP_CLOCK, 0, &c, sizeof c, fill_clock);
    return c;
}
