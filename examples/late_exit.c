/* late_exit: reads the clock, then ends with _exit(STATUS), which runs no
 * destructors.  The replica named by $LATE_REPLICA (llft's $LLFT_REPLICA)
 * first spins for a while (about 0.3 s here) without a call llft sees, so that it ends last:
 * a test makes the primary late and checks its backups still end after it.
 * usage: late_exit STATUS */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *late = getenv("LATE_REPLICA"), *me = getenv("LLFT_REPLICA");
    if (late && me && atoi(late) == atoi(me))
        for (volatile unsigned long spins = 0; spins < 1500000000ul; spins++)
            ;
    _exit(argc > 1 ? atoi(argv[1]) : 0);
}
