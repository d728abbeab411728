/* Reads what differs from one run to the next through syscall(), libc's
 * generic entry, rather than through each call's own libc function (as
 * OpenSSL and libuv reach getrandom): random bytes, the clocks, the
 * process id, resource usage.  Prints them; under llft every replica must
 * print the primary's.
 *
 * usage: syscall_inputs */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/times.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
    unsigned char rnd[16];
    long got = syscall(SYS_getrandom, rnd, sizeof rnd, 0);
    printf("getrandom %ld:", got);
    for (size_t i = 0; i < sizeof rnd; i++)
        printf(" %02x", rnd[i]);
    struct timespec rt, mono;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &rt);
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &mono);
    struct timeval tv;
    syscall(SYS_gettimeofday, &tv, NULL);
    printf("\nclocks %lld.%09ld %lld.%09ld %lld.%06ld\n", (long long)rt.tv_sec, rt.tv_nsec,
           (long long)mono.tv_sec, mono.tv_nsec, (long long)tv.tv_sec, (long)tv.tv_usec);
#ifdef SYS_time
    printf("time %ld\n", syscall(SYS_time, NULL));
#endif
    printf("pid %ld\n", syscall(SYS_getpid));
    volatile unsigned long spin = 0;
    for (unsigned long i = 0; i < 20000000; i++)
        spin += i;
    struct rusage ru;
    syscall(SYS_getrusage, RUSAGE_SELF, &ru);
    struct tms tm;
    long ticks = syscall(SYS_times, &tm);
    printf("usage %ld.%06ld %ld %ld\n", (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec, ticks, (long)tm.tms_utime);
    return 0;
}
