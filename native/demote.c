/* A copy of the primary, restored from its checkpoint to be a backup
 * (llft/checkpoint/, docs/checkpoints.md).  The controller restores it
 * with the role LLFT_ROLE_COPY; its first call, in whichever thread,
 * turns the primary's state into a backup's before any thread replays:
 *
 * - the replay engine starts afresh (the primary may have been a backup
 *   once, promoted since: its queues and its takeover are of that past);
 * - the turnstiles start at the primary's turn counts (every turn taken
 *   was recorded: the primary was held, quiesce.c);
 * - thread ids continue from the primary's;
 * - each thread takes its replay queue at its first replayed call
 *   (replay.c), its call count going on from the primary's.
 *
 * Threads frozen in the primary's lock waits give the lock back when they
 * get it and take their turn as a backup's; those in condition waits are
 * woken and do the same (wrap_lock.c); threads parked at a call's entry
 * make the call as a backup once the controller lets them go. */
#include "replay_queues.h"

#include <signal.h>
#include <sys/syscall.h>

#include "atomics.h"

int llft_demote(void)
{
    /* The progress is the control block's, which the controller makes
     * for each copy: a copy of a copy (promoted since) starts again. */
    uint32_t copy = LLFT_ROLE_COPY;
    if (__atomic_compare_exchange_n(&llft_ctl->role, &copy, LLFT_ROLE_DEMOTING, 0, SEQ, RLX)) {
        /* No signal handler meanwhile: its recorded call would wait below
         * for this very demotion to end. */
        sigset_t all, old;
        sigfillset(&all);
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, _NSIG / 8);
        llft_replay_restart(__atomic_load_n(&llft_next_tid, SEQ) - 1);
        llft_turnstiles_from_objects();
        STORE(&llft_ctl->role, LLFT_ROLE_BACKUP, SEQ);
        llft_cond_waits_wake();
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, _NSIG / 8);
    }
    while (LOAD(&llft_ctl->role, ACQ) >= LLFT_ROLE_COPY)
        llft_yield();
    return LLFT_ROLE_BACKUP;
}
