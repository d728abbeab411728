/* A replica's private view of the files, made between fork and exec: a
 * mount namespace of its own with the overlays and binds that
 * llft/private_files.py planned, one per line:
 *
 *     overlay <TAB> target <TAB> upperdir <TAB> workdir
 *     bind <TAB> target
 *
 * Every path is opened (O_PATH) before anything is mounted and named
 * through /proc/self/fd afterwards: an overlay on /run would otherwise
 * hide /run/netns, the mount that a later line overlays or binds again,
 * and an upper layer kept under /tmp would be found on /tmp's overlay,
 * where an upper layer cannot be. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define MAX_STEPS 256

struct step {
    int bind;
    char *target, *upper, *work;
    int fd, upper_fd, work_fd;
};

static int fail(const char *what, const char *path)
{
    int err = errno;
    dprintf(2, "llft: cannot give this replica its private files: %s %s: %s\n", what, path, strerror(err));
    return -1;
}

/* Splits line at tabs into at most n fields; returns how many. */
static int split(char *line, char **fields, int n)
{
    int k = 0;
    for (char *p = line; k < n; k++) {
        fields[k] = p;
        p = strchr(p, '\t');
        if (!p)
            return k + 1;
        *p++ = 0;
    }
    return k;
}

int llft_private_files(const char *plan)
{
    static char text[1 << 16];
    static struct step steps[MAX_STEPS];
    size_t len = strlen(plan);
    if (len >= sizeof text) {
        errno = E2BIG;
        return fail("plan of", "the mounts");
    }
    memcpy(text, plan, len + 1);

    int n = 0;
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end)
            break;
        if (n == MAX_STEPS) {
            errno = E2BIG;
            return fail("plan of", "the mounts (too many)");
        }
        *end = 0;
        char *f[4];
        int k = split(line, f, 4);
        struct step *s = &steps[n];
        s->bind = strcmp(f[0], "bind") == 0;
        if (!(s->bind ? k == 2 : k == 4 && strcmp(f[0], "overlay") == 0)) {
            errno = EINVAL;
            return fail("plan line", f[0]);
        }
        s->target = f[1];
        s->upper = s->bind ? NULL : f[2];
        s->work = s->bind ? NULL : f[3];
        n++;
    }

    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return fail("getcwd", "");
    if (unshare(CLONE_NEWNS) != 0)
        return fail("unshare", "the mount namespace");
    /* Nothing mounted here reaches the machine's namespace, nor the other way. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return fail("make private", "/");
    for (int i = 0; i < n; i++) {
        struct step *s = &steps[i];
        s->upper_fd = s->work_fd = -1;
        s->fd = open(s->target, O_PATH | O_CLOEXEC);
        /* A mount may be gone since the plan (a network namespace's file
         * under /run/netns, a tool's scratch mount under /tmp, removed
         * meanwhile): nothing to show or to overlay then; the mount above
         * it covers its path. */
        if (s->fd < 0 && errno == ENOENT)
            continue;
        if (s->fd < 0)
            return fail("open", s->target);
        if (s->bind)
            continue;
        s->upper_fd = open(s->upper, O_PATH | O_CLOEXEC | O_DIRECTORY);
        if (s->upper_fd < 0)
            return fail("open", s->upper);
        s->work_fd = open(s->work, O_PATH | O_CLOEXEC | O_DIRECTORY);
        if (s->work_fd < 0)
            return fail("open", s->work);
    }
    for (int i = 0; i < n; i++) {
        struct step *s = &steps[i];
        char source[64];
        snprintf(source, sizeof source, "/proc/self/fd/%d", s->fd);
        if (s->fd < 0)
            continue;
        if (s->bind) {
            if (mount(source, s->target, NULL, MS_BIND | MS_REC, NULL) != 0 && errno != ENOENT)
                return fail("bind", s->target);
            continue;
        }
        char options[160];
        snprintf(options, sizeof options, "lowerdir=%s,upperdir=/proc/self/fd/%d,workdir=/proc/self/fd/%d", source,
                 s->upper_fd, s->work_fd);
        if (mount("overlay", s->target, "overlay", 0, options) != 0)
            return fail("overlay", s->target);
    }
    for (int i = 0; i < n; i++) {
        if (steps[i].fd >= 0)
            close(steps[i].fd);
        if (steps[i].upper_fd >= 0)
            close(steps[i].upper_fd);
        if (steps[i].work_fd >= 0)
            close(steps[i].work_fd);
    }
    /* The working directory still names the directory under the overlay. */
    if (chdir(cwd) != 0)
        return fail("chdir", cwd);
    return 0;
}
