/* Process identity.  Programs seed random generators with getpid() (redis
 * mixes it into its seeds), so every replica sees the primary's pid.  A
 * backup that signals "itself" by that pid must reach itself, not the
 * primary: kill() translates it back. */
#include "shim.h"

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

DEFINE_REAL(getpid)
DEFINE_REAL(kill)

static pid_t primary_pid; /* backup: the pid the primary's getpid() returned */

EXPORT pid_t getpid(void)
{
    struct llft_thread *t;
    int role = llft_mode(&t);
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_GETPID, &e)) {
            __atomic_store_n(&primary_pid, (pid_t)e.ret, __ATOMIC_RELAXED);
            return (pid_t)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        pid_t p = REAL(getpid)();
        llft_record(t, LLFT_OP_GETPID, 0, 0, p, 0, p);
        return p;
    }
    return REAL(getpid)();
}

EXPORT int kill(pid_t pid, int sig)
{
    pid_t p = __atomic_load_n(&primary_pid, __ATOMIC_RELAXED);
    if (p && (pid == p || pid == -p))
        pid = (pid_t)(pid > 0 ? 1 : -1) * (pid_t)syscall(SYS_getpid);
    return REAL(kill)(pid, sig);
}
