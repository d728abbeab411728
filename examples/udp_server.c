/* udp_server: the line protocol (lineproto.h) over UDP, one datagram per
 * line, served by a non-blocking epoll loop that reads until EAGAIN.
 * Each reply goes to the sender's address and ends with " from IP:PORT",
 * the sender as recvfrom/recvmsg reported it.  Datagrams alternate between
 * recvfrom/sendto and recvmsg/sendmsg.
 * usage: udp_server PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "lineproto.h"

static int bind_udp(int port)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("udp socket/bind");
        exit(1);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Receives one datagram (alternating calls); returns its length or -1. */
static ssize_t receive(int fd, char *buf, size_t cap, struct sockaddr_in *from, socklen_t *len, int k)
{
    if (k % 2 == 0)
        return recvfrom(fd, buf, cap, 0, (struct sockaddr *)from, len);
    struct iovec v = {buf, cap};
    struct msghdr m = {.msg_name = from, .msg_namelen = *len, .msg_iov = &v, .msg_iovlen = 1};
    ssize_t r = recvmsg(fd, &m, 0);
    *len = m.msg_namelen;
    return r;
}

static void reply(int fd, const char *buf, size_t n, const struct sockaddr_in *to, int k)
{
    if (k % 2 == 0) {
        sendto(fd, buf, n, 0, (const struct sockaddr *)to, sizeof *to);
        return;
    }
    struct iovec v[2] = {{(void *)buf, n / 2}, {(void *)(buf + n / 2), n - n / 2}};
    struct msghdr m = {.msg_name = (void *)to, .msg_namelen = sizeof *to, .msg_iov = v, .msg_iovlen = 2};
    sendmsg(fd, &m, 0);
}

int main(int argc, char **argv)
{
    int fd = bind_udp(argc > 1 ? atoi(argv[1]) : 7000);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &fd}; /* a pointer, as servers often use */
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    static char buf[65536], out[65536 + 128];
    for (int k = 0;;) {
        struct epoll_event got;
        int n = epoll_wait(ep, &got, 1, 1000);
        if (n <= 0 || got.data.ptr != &fd)
            continue;
        for (;; k++) {
            struct sockaddr_in from;
            socklen_t len = sizeof from;
            ssize_t r = receive(fd, buf, sizeof buf, &from, &len, k);
            if (r < 0)
                break; /* EAGAIN: back to epoll */
            char who[64];
            snprintf(who, sizeof who, " from %s:%u", inet_ntoa(from.sin_addr), ntohs(from.sin_port));
            int m = handle_line(buf, (size_t)r, out, sizeof out - sizeof who);
            if (m < 0) {
                reply(fd, "BYE", 3, &from, k);
                exit(0);
            }
            if (m > 0 && out[m - 1] == '\n')
                m--;
            if ((size_t)m > sizeof out - sizeof who)
                m = (int)(sizeof out - sizeof who);
            memcpy(out + m, who, strlen(who));
            reply(fd, out, (size_t)m + strlen(who), &from, k);
        }
    }
}
