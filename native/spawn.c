/* Helpers the controller calls in a replica between fork and exec. */
#include "llft_abi.h"

#include <signal.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Same address layout in every replica (as setarch -R and rr do): programs
 * that let pointer values steer behaviour then behave alike.  OrderInfo
 * never relies on it. */
int llft_disable_aslr(void)
{
    int cur = personality(0xffffffff);
    return cur < 0 ? cur : personality((unsigned long)cur | ADDR_NO_RANDOMIZE);
}

/* The quiesce's signals (native/quiesce.c) are ignored until the preload
 * library installs its handlers: their default action ends a process, and
 * the controller may send them while the program is still starting.  An
 * ignored signal stays ignored through exec. */
int llft_ignore_census_signals(void)
{
    if (signal(LLFT_CENSUS_SIGNAL, SIG_IGN) == SIG_ERR || signal(LLFT_KICK_SIGNAL, SIG_IGN) == SIG_ERR)
        return -1;
    return 0;
}

/* Orphans of the replicas (a daemon's forked self) are re-parented to the
 * controller, which ends them with the group (llft/process_tree.py). */
int llft_become_subreaper(void)
{
    return prctl(PR_SET_CHILD_SUBREAPER, 1);
}

/* A replica does not outlive its controller: SIGKILLed with it (a replica
 * left running would hold the program's ports and files).  The parent may
 * have died between fork and this call: then exit at once. */
int llft_die_with_parent(int parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return -1;
    if (getppid() != parent)
        _exit(1);
    return 0;
}
