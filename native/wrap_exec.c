/* execve and friends.  The replica keeps its stream across execve (the
 * environment carries LD_PRELOAD and LLFT_SHM, and the pid is the same), so
 * the primary marks where one program image ends: a backup's dispatcher then
 * never moves the next image's records into queues that execve will wipe.
 * glibc's execl*, execv* and system() call execve internally, bypassing a
 * wrapper, so each entry point is wrapped. */
#include "shim.h"

#include <alloca.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

DEFINE_REAL(execve)
DEFINE_REAL(execvpe)
DEFINE_REAL(fexecve)

typedef int (*exec_fn)(const void *target, char *const argv[], char *const envp[]);

/* What the next image needs to attach as this replica.  A program that
 * hands its exec an environment of its own (a privilege-dropping wrapper,
 * a daemon scrubbing it) would otherwise start the image unreplicated. */
static const char *const REPLICA_VARS[] = {"LD_PRELOAD", "LLFT_SHM", "LLFT_CHANNEL", "LLFT_REPLICA",
                                           "LLFT_SERIALIZE"};
#define NVARS (sizeof REPLICA_VARS / sizeof REPLICA_VARS[0])

static int has_var(char *const envp[], const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return 1;
    return 0;
}

static size_t env_count(char *const envp[])
{
    size_t n = 0;
    while (envp && envp[n])
        n++;
    return n;
}

/* envp, or a copy (in out, room for its entries + NVARS + 1) with the
 * replica's variables it lacks taken from this process's environment. */
static char *const *with_replica_vars(char *const envp[], char **out)
{
    size_t n = env_count(envp), k;
    const char *add[NVARS];
    size_t nadd = 0;
    for (k = 0; k < NVARS; k++) {
        if (has_var(envp, REPLICA_VARS[k]))
            continue;
        size_t len = strlen(REPLICA_VARS[k]);
        for (char **e = environ; e && *e; e++)
            if (strncmp(*e, REPLICA_VARS[k], len) == 0 && (*e)[len] == '=') {
                add[nadd++] = *e;
                break;
            }
    }
    if (nadd == 0)
        return envp;
    for (k = 0; k < n; k++)
        out[k] = envp[k];
    for (size_t i = 0; i < nadd; i++)
        out[n + i] = (char *)add[i];
    out[n + nadd] = NULL;
    return out;
}

enum exec_target { BY_PATH, ON_PATH, BY_FD };

/* An image the library cannot reach stops the replica, saying so, before
 * it could run unrecorded (at the primary: serve unreplicated). */
static void check_reachable(const void *target, enum exec_target how)
{
    const char *name = how == BY_FD ? "(an open file)" : target;
    const char *why = llft_exec_unreachable(how == BY_FD ? NULL : target, how == ON_PATH,
                                            how == BY_FD ? *(const int *)target : -1);
    if (why)
        llft_refuse("the program execs %s, which is %s", name, why);
}

/* Runs one exec attempt with the EXEC / EXEC_FAILED records around it. */
static int recorded_exec(exec_fn fn, const void *target, enum exec_target how, char *const argv[],
                           char *const envp[])
{
    if (UNLIKELY(llft_fork_held))
        llft_daemon_fork_settle(0); /* a forked child goes on once its parent execs */
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (role != LLFT_ROLE_OFF) {
        check_reachable(target, how);
        envp = with_replica_vars(envp, alloca((env_count(envp) + NVARS + 1) * sizeof(char *)));
    }
    if (role == LLFT_ROLE_BACKUP) {
        llft_rec_t e;
        if (!llft_replay_next(t, LLFT_OP_EXEC, &e)) {
            int r = fn(target, argv, envp);
            llft_replay_exec_failed();
            if (llft_replay_next(t, LLFT_OP_EXEC_FAILED, &e)) { /* taken over meanwhile */
                int err = errno;
                llft_record(t, LLFT_OP_EXEC_FAILED, 0, 0, r, err, 0);
                errno = err;
                return r;
            }
            if (e.err)
                errno = e.err;
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (role == LLFT_ROLE_PRIMARY) {
        llft_record(t, LLFT_OP_EXEC, 0, 0, 0, 0, 0);
        llft_quiesce_exec();
        int r = fn(target, argv, envp);
        int err = errno;
        llft_quiesce_init();
        llft_record(t, LLFT_OP_EXEC_FAILED, 0, 0, r, err, 0);
        errno = err;
        return r;
    }
    return fn(target, argv, envp);
}

/* An exec ends every thread, the replica lease's holder with them: on
 * purpose (replica_lease.c), unless it fails. */
static int replicated_exec(exec_fn fn, const void *target, enum exec_target how, char *const argv[],
                           char *const envp[])
{
    llft_lease_leaving(1);
    int r = recorded_exec(fn, target, how, argv, envp);
    llft_lease_leaving(0);
    return r;
}

static int do_execve(const void *path, char *const argv[], char *const envp[])
{
    return REAL(execve)(path, argv, envp);
}

static int do_execvpe(const void *file, char *const argv[], char *const envp[])
{
    return REAL(execvpe)(file, argv, envp);
}

static int do_fexecve(const void *fd, char *const argv[], char *const envp[])
{
    return REAL(fexecve)(*(const int *)fd, argv, envp);
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    return replicated_exec(do_execve, path, BY_PATH, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
    return replicated_exec(do_execve, path, BY_PATH, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    return replicated_exec(do_execvpe, file, ON_PATH, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
    return replicated_exec(do_execvpe, file, ON_PATH, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    return replicated_exec(do_fexecve, &fd, BY_FD, argv, envp);
}

/* execl, execlp, execle: gather the variadic arguments into an argv. */
#define COLLECT_ARGS(first, argv, ap)                                                \
    size_t argc = 1;                                                                 \
    va_start(ap, first);                                                             \
    while (va_arg(ap, char *))                                                       \
        argc++;                                                                      \
    va_end(ap);                                                                      \
    char **argv = alloca((argc + 1) * sizeof(char *));                               \
    argv[0] = (char *)(first);                                                       \
    va_start(ap, first);                                                             \
    for (size_t i = 1; i <= argc; i++)                                               \
        argv[i] = va_arg(ap, char *);

EXPORT int execl(const char *path, const char *arg, ...)
{
    va_list ap;
    COLLECT_ARGS(arg, argv, ap)
    va_end(ap);
    return replicated_exec(do_execve, path, BY_PATH, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    va_list ap;
    COLLECT_ARGS(arg, argv, ap)
    va_end(ap);
    return replicated_exec(do_execvpe, file, ON_PATH, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    va_list ap;
    COLLECT_ARGS(arg, argv, ap)
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return replicated_exec(do_execve, path, BY_PATH, argv, envp);
}
