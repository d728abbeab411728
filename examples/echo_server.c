/* echo_server: blocking I/O, one thread per connection (see lineproto.h).
 * usage: echo_server PORT */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lineproto.h"

int main(int argc, char **argv)
{
    serve_with_threads(listen_on(argc > 1 ? atoi(argv[1]) : 7000));
}
