/* proxy_server: an application server in front of a backend, as an app
 * server talks to its database.  One thread per client connection; at the
 * client's first request the thread connects to the backend (127.0.0.1,
 * BACKEND_PORT; a blocking connect), then forwards each request line and
 * returns the backend's one-line answer.  Line protocol:
 *   any line       -> the backend's answer to it
 *   PROBE port     -> a non-blocking connect to 127.0.0.1:port, epoll until
 *                     writable, then SO_ERROR and getpeername:
 *                     "PROBE connected <peer port>" | "PROBE <strerror>"
 *   CONNECT port   -> the same with a blocking connect
 *   UDP port text  -> a UDP socket connected to 127.0.0.1:port sends text,
 *                     polls for the answer: "UDP <answer>" | "UDP timeout"
 *   UDPTO port text -> the same with sendto and recvfrom, unconnected:
 *                     "UDPTO <answer> from <port>"
 *   ASK port text  -> connects to 127.0.0.1:port, sends text and a newline,
 *                     shuts down its writing side (half-close), reads the
 *                     answer to its end: "ASK <answer>" | "ASK <strerror>"
 *   SHUTDOWN       -> BYE, and exit 0
 * usage: proxy_server PORT BACKEND_PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

static int backend_port;

static struct sockaddr_in loopback(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int send_all(int fd, const char *buf, size_t n)
{
    while (n) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One line from fd into b (complete lines stay in b): its length without
 * the newline, or -1 at the end of the input. */
static ssize_t next_line(int fd, struct linebuf *b, char *line, size_t cap)
{
    for (;;) {
        char *nl = memchr(b->data, '\n', b->len);
        if (nl) {
            size_t n = (size_t)(nl - b->data);
            size_t keep = n < cap - 1 ? n : cap - 1;
            memcpy(line, b->data, keep);
            line[keep] = 0;
            memmove(b->data, nl + 1, b->len - n - 1);
            b->len -= n + 1;
            return (ssize_t)keep;
        }
        if (b->len == sizeof b->data)
            b->len = 0; /* a line longer than the buffer: drop it */
        ssize_t r = recv(fd, b->data + b->len, sizeof b->data - b->len, 0);
        if (r <= 0)
            return -1;
        b->len += (size_t)r;
    }
}

/* PROBE and CONNECT: connect to port, report the outcome. */
static int probe(const char *cmd, int port, int nonblocking, char *out, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    struct sockaddr_in a = loopback(port);
    int err = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        err = errno;
        if (nonblocking && err == EINPROGRESS) {
            int ep = epoll_create1(0);
            struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &a}, got;
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
            int n = epoll_wait(ep, &got, 1, 10000);
            close(ep);
            socklen_t len = sizeof err;
            if (n != 1 || got.data.ptr != &a)
                err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                err = errno;
        }
    }
    int r;
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    if (err)
        r = snprintf(out, cap, "%s %s\n", cmd, strerror(err));
    else if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
        r = snprintf(out, cap, "%s getpeername: %s\n", cmd, strerror(errno));
    else
        r = snprintf(out, cap, "%s connected %u\n", cmd, ntohs(peer.sin_port));
    close(fd);
    return r;
}

/* UDP and UDPTO: one datagram to port and its answer, on a socket never
 * bound (the first send, or connect, gives it a port). */
static int udp_ask(const char *cmd, const char *arg, int connected, char *out, size_t cap)
{
    char *text;
    int port = (int)strtol(arg, &text, 10);
    text += *text == ' ';
    struct sockaddr_in a = loopback(port), from;
    socklen_t flen = sizeof from;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    ssize_t n = -1;
    if (connected)
        n = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? send(fd, text, strlen(text), 0) : -1;
    else
        n = sendto(fd, text, strlen(text), 0, (struct sockaddr *)&a, sizeof a);
    char answer[1024];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    if (n < 0)
        r = snprintf(out, cap, "%s %s\n", cmd, strerror(errno));
    else if (poll(&p, 1, 5000) != 1)
        r = snprintf(out, cap, "%s timeout\n", cmd);
    else if ((n = connected ? recv(fd, answer, sizeof answer - 1, 0)
                            : recvfrom(fd, answer, sizeof answer - 1, 0, (struct sockaddr *)&from, &flen)) < 0)
        r = snprintf(out, cap, "%s %s\n", cmd, strerror(errno));
    else if (connected)
        r = snprintf(out, cap, "%s %.*s\n", cmd, (int)n, answer);
    else
        r = snprintf(out, cap, "%s %.*s from %u\n", cmd, (int)n, answer, ntohs(from.sin_port));
    close(fd);
    return r;
}

/* ASK: a request whose answer comes once the server has read to the end of
 * its input (a half-closed connection). */
static int ask(const char *arg, char *out, size_t cap)
{
    char *text;
    int port = (int)strtol(arg, &text, 10);
    text += *text == ' ';
    struct sockaddr_in a = loopback(port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    char req[8200], answer[4096];
    int n = snprintf(req, sizeof req, "%s\n", text);
    size_t got = 0;
    ssize_t r = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send_all(fd, req, (size_t)n) != 0 ||
        shutdown(fd, SHUT_WR) != 0) {
        n = snprintf(out, cap, "ASK %s\n", strerror(errno));
        close(fd);
        return n;
    }
    while (got < sizeof answer && (r = recv(fd, answer + got, sizeof answer - got, 0)) > 0)
        got += (size_t)r;
    close(fd);
    if (r < 0)
        return snprintf(out, cap, "ASK %s\n", strerror(errno));
    while (got && answer[got - 1] == '\n')
        got--;
    return snprintf(out, cap, "ASK %.*s\n", (int)got, answer);
}

static int forward(int *backend, struct linebuf *bb, const char *line, size_t len, char *out, size_t cap)
{
    if (*backend < 0) {
        *backend = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = loopback(backend_port);
        bb->len = 0;
        if (connect(*backend, (struct sockaddr *)&a, sizeof a) != 0) {
            int r = snprintf(out, cap, "ERROR backend: %s\n", strerror(errno));
            close(*backend);
            *backend = -1;
            return r;
        }
    }
    char req[8200];
    int n = snprintf(req, sizeof req, "%.*s\n", (int)len, line);
    ssize_t got;
    if (send_all(*backend, req, (size_t)n) != 0 || (got = next_line(*backend, bb, out, cap - 1)) < 0) {
        close(*backend);
        *backend = -1;
        return snprintf(out, cap, "ERROR backend closed\n");
    }
    out[got] = '\n';
    return (int)got + 1;
}

static void *serve(void *arg)
{
    int fd = (int)(intptr_t)arg, backend = -1;
    struct linebuf in = {.len = 0}, bb = {.len = 0};
    char line[8192], out[8192];
    ssize_t len;
    while ((len = next_line(fd, &in, line, sizeof line)) >= 0) {
        if (len && line[len - 1] == '\r')
            line[--len] = 0;
        int n;
        if (strcmp(line, "SHUTDOWN") == 0) {
            send_all(fd, "BYE\n", 4);
            exit(0);
        } else if (strncmp(line, "PROBE ", 6) == 0) {
            n = probe("PROBE", atoi(line + 6), 1, out, sizeof out);
        } else if (strncmp(line, "CONNECT ", 8) == 0) {
            n = probe("CONNECT", atoi(line + 8), 0, out, sizeof out);
        } else if (strncmp(line, "UDP ", 4) == 0) {
            n = udp_ask("UDP", line + 4, 1, out, sizeof out);
        } else if (strncmp(line, "UDPTO ", 6) == 0) {
            n = udp_ask("UDPTO", line + 6, 0, out, sizeof out);
        } else if (strncmp(line, "ASK ", 4) == 0) {
            n = ask(line + 4, out, sizeof out);
        } else {
            n = forward(&backend, &bb, line, (size_t)len, out, sizeof out);
        }
        if (send_all(fd, out, (size_t)n) != 0)
            break;
    }
    if (backend >= 0)
        close(backend);
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT BACKEND_PORT\n", argv[0]);
        return 2;
    }
    backend_port = atoi(argv[2]);
    int lfd = listen_on(atoi(argv[1]));
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_t th;
        pthread_create(&th, NULL, serve, (void *)(intptr_t)fd);
        pthread_detach(th);
    }
}
