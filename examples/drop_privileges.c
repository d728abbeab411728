/* A privilege-dropping launcher, as daemons have built in: switches to the
 * given user and group ids itself (setgroups, setgid, setuid), then execs
 * the program with an environment of its own (PATH only), as wrappers that
 * scrub the environment do.
 *
 * Usage: drop_privileges UID GID PROGRAM [ARGS...] */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: drop_privileges UID GID PROGRAM [ARGS...]\n");
        return 2;
    }
    uid_t uid = (uid_t)atoi(argv[1]);
    gid_t gid = (gid_t)atoi(argv[2]);
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
        perror("drop_privileges");
        return 1;
    }
    if (getuid() != uid || geteuid() != uid) {
        fprintf(stderr, "drop_privileges: still uid %d\n", (int)geteuid());
        return 1;
    }
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    execve(argv[3], argv + 3, env);
    perror("drop_privileges: execve");
    return 127;
}
