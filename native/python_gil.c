/* CPython hands the GIL over at blocking calls, which replicate exactly,
 * and also when a waiting thread's timed wait for it (the switch interval,
 * 5 ms) expires: the waiter then sets a flag that the holder reads without
 * a lock, between two bytecodes, at a point no record marks.  A backup's
 * holder reads it elsewhere, hands the GIL over at another point, and is
 * stopped as diverged (python -m http.server under load: about one run in
 * ten).  So in a CPython process the shim lengthens the switch interval to
 * 1000 s before the program's second thread starts, at every replica:
 * threads then take turns at blocking calls only, as Python allows (its
 * switching is a matter of fairness, not of meaning).  A thread that runs
 * Python code without blocking keeps the others waiting meanwhile.
 * LLFT_PYTHON_GIL_SWITCHING=1 in the environment keeps the program's own
 * interval (docs/determinizer.md). */
#include "shim.h"

#include <dlfcn.h>
#include <stdlib.h>

#define SWITCH_INTERVAL_US (1000UL * 1000 * 1000)

void llft_python_threads_start(void)
{
    static uint32_t done;
    if (__atomic_exchange_n(&done, 1, __ATOMIC_RELAXED))
        return;
    const char *keep = getenv("LLFT_PYTHON_GIL_SWITCHING");
    if (keep && *keep && *keep != '0')
        return;
    /* The interpreter's own setter, which sys.setswitchinterval calls;
     * programs that are not CPython have none. */
    void (*set_interval)(unsigned long) = (void (*)(unsigned long))dlsym(RTLD_DEFAULT, "_PyEval_SetSwitchInterval");
    if (set_interval)
        set_interval(SWITCH_INTERVAL_US);
}
