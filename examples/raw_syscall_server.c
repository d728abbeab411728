/* A server that makes its socket calls as Go's runtime does: with the
 * syscall instruction itself, never through the C library, so no preload
 * library sees them.  It listens on the port given and answers each line
 * with the line.  Under llft its primary would hold the real port and
 * serve clients unreplicated: llft-run must refuse it.
 *
 * Usage: raw_syscall_server PORT */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>

static long raw(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    long s = raw(SYS_socket, AF_INET, SOCK_STREAM, 0);
    int one = 1;
    long r10 = (long)&one, r8 = sizeof one;
    long ret;
    register long a4 __asm__("r10") = r10;
    register long a5 __asm__("r8") = r8;
    __asm__ volatile("syscall" : "=a"(ret)
                     : "a"((long)SYS_setsockopt), "D"(s), "S"((long)SOL_SOCKET), "d"((long)SO_REUSEADDR), "r"(a4),
                       "r"(a5)
                     : "rcx", "r11", "memory");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[1]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || raw(SYS_bind, s, (long)&a, sizeof a) < 0) {
        raw(SYS_write, 2, (long)"raw_syscall_server: bind: address in use?\n", 42);
        return 1;
    }
    if (raw(SYS_listen, s, 16, 0) < 0)
        return 1;
    for (;;) {
        long c = raw(SYS_accept, s, 0, 0);
        if (c < 0)
            continue;
        char buf[512];
        long n;
        while ((n = raw(SYS_read, c, (long)buf, sizeof buf)) > 0)
            raw(SYS_write, c, (long)buf, n);
        raw(SYS_close, c, 0, 0);
    }
}
