/* syscall(): the program's own raw system calls through libc's generic
 * entry.
 *
 * Calls whose outcome differs from one replica to another go to the
 * wrappers that record them, as the same calls through their own libc
 * functions do: libraries reach getrandom so (OpenSSL, libuv), and the
 * clocks and getpid.
 *
 * Runtimes that build their own synchronization on futexes call it too
 * (the JVM parks every thread at a safepoint in syscall(SYS_futex,
 * FUTEX_WAIT_PRIVATE, ...) until its VM thread lets them go), and under
 * --serialize a thread that waited there keeping the turn would stop the
 * thread that is to wake it: a futex wait is a switch point, as
 * pthread_cond_wait is.  Every other call passes through.
 *
 * The shim's own code reaches the kernel through llft_raw_syscall (the
 * build renames its calls to syscall, setup.py), never through this
 * wrapper: its futex waits on the ring are not the program's. */
#include "shim.h"

#include <linux/futex.h>
#include <stdarg.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/times.h>
#include <time.h>
#include <unistd.h>

#undef syscall

/* The system call instruction itself, with libc's convention: -1 and
 * errno on failure. */
static long raw6(long nr, long a, long b, long c, long d, long e, long f)
{
    long ret;
#if defined(__x86_64__)
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = nr;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    ret = x0;
#else
#error "llft_raw_syscall: no system call instruction for this architecture"
#endif
    if ((unsigned long)ret > -4096UL) {
        errno = (int)-ret;
        return -1;
    }
    return ret;
}

/* Reads six arguments whatever the call takes, as libc's syscall does:
 * the registers beyond those passed hold garbage the kernel ignores. */
#define SIX_ARGS(nr, a)                                                        \
    va_list ap;                                                                \
    va_start(ap, nr);                                                          \
    long a[6];                                                                 \
    for (int i_ = 0; i_ < 6; i_++)                                             \
        a[i_] = va_arg(ap, long);                                              \
    va_end(ap)

long llft_raw_syscall(long nr, ...)
{
    SIX_ARGS(nr, a);
    return raw6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static int futex_waits(long op)
{
    switch (op & FUTEX_CMD_MASK) {
    case FUTEX_WAIT:
    case FUTEX_WAIT_BITSET:
    case FUTEX_LOCK_PI:
    case FUTEX_LOCK_PI2:
    case FUTEX_WAIT_REQUEUE_PI:
        return 1;
    default:
        return 0;
    }
}

EXPORT long syscall(long nr, ...)
{
    SIX_ARGS(nr, a);
    switch (nr) {
    case SYS_getrandom:
        return getrandom((void *)a[0], (size_t)a[1], (unsigned)a[2]);
    case SYS_clock_gettime:
        return clock_gettime((clockid_t)a[0], (struct timespec *)a[1]);
    case SYS_gettimeofday:
        return gettimeofday((struct timeval *)a[0], (void *)a[1]);
#ifdef SYS_time
    case SYS_time:
        return time((time_t *)a[0]);
#endif
    case SYS_getpid:
        return getpid();
    case SYS_getrusage:
        return getrusage((int)a[0], (struct rusage *)a[1]);
    case SYS_times:
        return times((struct tms *)a[0]);
    case SYS_futex:
        if (futex_waits(a[1]))
            LLFT_SWITCH_POINT(long, raw6(nr, a[0], a[1], a[2], a[3], a[4], a[5]));
        break;
    }
    return raw6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
