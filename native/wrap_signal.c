/* Asynchronous signals, under --fork replicate: a signal handler runs at
 * a point of the program's own choosing at the primary, and its effects
 * (flags its main loop reads, the calls it makes) must land at the same
 * point at every backup.  The shim installs its own handler in the
 * program's place (sigaction and the older ways to set one):
 *
 *   - at the primary, it records SIGNAL (the signal and its siginfo) in
 *     the thread's stream, then runs the program's handler, whose calls
 *     are recorded after it;
 *   - at a backup, a real signal does nothing: the program's handler runs
 *     when the thread's replay reaches that SIGNAL record, that is before
 *     the call the thread made next at the primary, with the primary's
 *     siginfo.
 *
 * A thread that waits for signals alone (sigsuspend, pause) is replayed
 * too: at a backup it runs the handlers the primary's ran meanwhile, and
 * returns as the primary's did, whatever signals reach the backup itself
 * (a backup's workers exit, and signal their master, later than the
 * primary's).  Signals that faults raise (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGSYS) are the thread's own and keep the program's
 * handler, as do the shim's quiesce signals. */
#include "shim.h"

#include <string.h>
#include <ucontext.h>

DEFINE_REAL(sigaction)
DEFINE_REAL(sigsuspend)
DEFINE_REAL(pause)

/* The program's handlers, as it set them (NULL: none of ours): the
 * sa_handler/sa_sigaction union of its sigaction. */
static struct {
    void *handler;
    int flags;
} programs[_NSIG];

static int deferred(int sig)
{
    if (sig <= 0 || sig >= _NSIG || sig == SIGKILL || sig == SIGSTOP || sig == SIGSEGV || sig == SIGBUS ||
        sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS || sig == LLFT_CENSUS_SIGNAL ||
        sig == LLFT_KICK_SIGNAL)
        return 0;
    if (UNLIKELY(__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) != 2))
        llft_init_slow();
    return llft_ctl && llft_ctl->fork_mode == LLFT_FORKS_REPLICATED;
}

static void run_program_handler(int sig, siginfo_t *info, void *uctx)
{
    struct sigaction how; /* (its union tells the two kinds of handler apart) */
    how.sa_handler = NULL;
    *(void **)&how.sa_sigaction = __atomic_load_n(&programs[sig].handler, __ATOMIC_ACQUIRE);
    if (!how.sa_handler)
        return; /* set back to the default or ignored since */
    if (programs[sig].flags & SA_SIGINFO)
        how.sa_sigaction(sig, info, uctx);
    else
        how.sa_handler(sig);
}

/* A primary's thread the signal caught inside the shim (writing a record,
 * taking over from its replay) cannot record it there, and the handler's
 * own calls would go unrecorded: the signal is sent again to the thread,
 * blocked until its call blocks in the kernel or ends
 * (llft_signals_release), and handled then. */
static int held_for_later(int sig, siginfo_t *info, void *uctx)
{
    struct llft_thread *t = &llft_self;
    if (t->state != TS_TRACKED || !t->depth || !uctx || sig > 64 || (programs[sig].flags & SA_RESETHAND))
        return 0; /* (a one-shot handler is the default action by now: it runs here) */
    if (syscall(SYS_rt_tgsigqueueinfo, (pid_t)syscall(SYS_getpid), (pid_t)syscall(SYS_gettid), sig, info) != 0)
        return 0;
    sigaddset(&((ucontext_t *)uctx)->uc_sigmask, sig); /* (the mask the thread returns to) */
    t->held_signals |= 1ull << (sig - 1);
    return 1;
}

/* (held_signals is the kernel's own sigset: bit sig - 1 for signal sig) */
void llft_signals_release(struct llft_thread *t)
{
    uint64_t held = t->held_signals;
    t->held_signals = 0;
    syscall(SYS_rt_sigprocmask, SIG_UNBLOCK, &held, NULL, sizeof held);
}

static void trampoline(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    uint32_t role = llft_ctl ? __atomic_load_n(&llft_ctl->role, __ATOMIC_ACQUIRE) : LLFT_ROLE_OFF;
    if (role >= LLFT_ROLE_BACKUP) {
        errno = saved; /* the primary's record says when the handler runs here */
        return;
    }
    struct llft_thread *t;
    int mode = llft_mode(&t);
    if (mode == LLFT_ROLE_OFF && role == LLFT_ROLE_PRIMARY && held_for_later(sig, info, uctx)) {
        errno = saved;
        return;
    }
    if (mode == LLFT_ROLE_PRIMARY)
        llft_record_data(t, LLFT_OP_SIGNAL, 0, 0, 0, 0, info, sizeof *info);
    run_program_handler(sig, info, uctx);
    errno = saved;
}

/* Backup: the thread has reached the primary's SIGNAL record e (replay.c). */
void llft_signal_replayed(const llft_rec_t *e, siginfo_t *info)
{
    int sig = (int)info->si_signo;
    if (sig <= 0 || sig >= _NSIG)
        return;
    run_program_handler(sig, info, NULL);
    (void)e;
}

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!deferred(sig))
        return REAL(sigaction)(sig, act, old);
    struct sigaction real_old, ours;
    const struct sigaction *give = act;
    int taking = act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
    if (taking) {
        ours = *act;
        ours.sa_sigaction = trampoline;
        ours.sa_flags |= SA_SIGINFO;
        give = &ours;
    }
    void *was = programs[sig].handler;
    int was_flags = programs[sig].flags;
    if (REAL(sigaction)(sig, give, &real_old) != 0)
        return -1;
    if (act) {
        programs[sig].flags = taking ? act->sa_flags : 0;
        __atomic_store_n(&programs[sig].handler, taking ? *(void *const *)&act->sa_sigaction : NULL,
                         __ATOMIC_RELEASE);
    }
    if (old) {
        *old = real_old;
        if (real_old.sa_sigaction == trampoline && was) {
            *(void **)&old->sa_sigaction = was;
            old->sa_flags = was_flags;
        }
    }
    return 0;
}

/* signal() and its kin go through sigaction inside libc, past the wrapper
 * above: each is done here as glibc does it. */
static sighandler_t set_handler(int sig, sighandler_t h, int flags)
{
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = h;
    act.sa_flags = flags;
    sigemptyset(&act.sa_mask);
    sigaddset(&act.sa_mask, sig);
    if (sigaction(sig, &act, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

EXPORT sighandler_t signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART); }
EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART); }
EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESETHAND | SA_NODEFER); }

/* A wait for signals alone: replayed under --fork replicate (the handlers
 * the primary's ran come first, from its SIGNAL records).  A daemon's
 * held child is let go first either way (daemon_fork.c). */
static int signal_wait(int which, const sigset_t *mask)
{
    if (llft_fork_held)
        llft_daemon_fork_settle(0);
    struct llft_thread *t;
    int role = deferred(SIGTERM) ? llft_mode(&t) : LLFT_ROLE_OFF;
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_SIGSUSPEND, &e)) {
            errno = e.err;
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    int r = which ? REAL(pause)() : REAL(sigsuspend)(mask);
    int err = errno;
    if (role == LLFT_ROLE_PRIMARY)
        llft_record_aux(t, LLFT_OP_SIGSUSPEND, 0, 0, r, err, 0, (uint32_t)which);
    errno = err;
    return r;
}

EXPORT int sigsuspend(const sigset_t *mask) { LLFT_SWITCH_POINT(int, signal_wait(0, mask)); }
EXPORT int pause(void) { LLFT_SWITCH_POINT(int, signal_wait(1, NULL)); }
