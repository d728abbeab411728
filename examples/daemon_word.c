/* daemon_word: the echo server (one thread per connection, see
 * lineproto.h) daemonized as lighttpd and dnsmasq do when they are not
 * told to stay in the foreground: it listens (so that a port in use is
 * said on the terminal), forks, and the parent waits on a pipe for its
 * child's word: the pipe's end once the server is up (it exits 0), or a
 * byte if setting up failed (it exits 1).  The child starts a session of
 * its own, sets itself up for PAUSE_MS milliseconds, forks again and
 * exits; the grandchild closes the pipe, its word, and serves.  With
 * "stay" the child neither starts a session nor forks again: it stays in
 * its parent's process group and serves itself once it has said its word.
 * usage: daemon_word PORT [PAUSE_MS [stay]] */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

static void set_up_failed(int word)
{
    if (write(word, "!", 1) != 1)
        _exit(2);
    _exit(1);
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7000;
    int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    int stay = argc > 3 && strcmp(argv[3], "stay") == 0;
    int lfd = listen_on(port);
    int word[2];
    if (pipe(word) != 0) {
        perror("pipe");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child > 0) {
        char failed;
        close(word[1]);
        _exit(read(word[0], &failed, 1) == 0 ? 0 : 1);
    }
    close(word[0]);
    if (!stay && setsid() < 0)
        set_up_failed(word[1]);
    usleep(pause_ms * 1000);
    pid_t daemon = stay ? 0 : fork();
    if (daemon != 0)
        _exit(daemon < 0);
    int null = open("/dev/null", O_RDWR);
    if (null < 0)
        set_up_failed(word[1]);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    close(word[1]);
    serve_with_threads(lfd);
}
