#define _GNU_SOURCE
/* stall_replica: reads the clock every 10 ms for SECONDS, printing a tick
 * count at the end; the replica named by $STALL_REPLICA (llft's
 * $LLFT_REPLICA) first opens DIR/fifo-<replica> for reading, which blocks
 * until someone opens it for writing.  A test stalls one backup on purpose
 * with it: the others run on.
 * usage: stall_replica DIR SECONDS */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *who = getenv("STALL_REPLICA"), *me = getenv("LLFT_REPLICA");
    if (who && me && atoi(who) == atoi(me)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/fifo-%d", argv[1], atoi(me));
        /* Blocks, in a system call made directly: one replica alone opens
         * the FIFO, and llft records (and checks) every open() a program
         * makes. */
        long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
        if (fd >= 0)
            syscall(SYS_close, fd);
    }
    double secs = atof(argv[2]);
    struct timespec start, now, nap = {0, 10000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    long ticks = 0;
    do {
        nanosleep(&nap, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        ticks++;
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < secs);
    printf("%ld ticks\n", ticks);
    return 0;
}
