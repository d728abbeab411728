/* Start-up, attaching to the controller's shared file, exits and
 * divergence reports.  Uses raw system calls only: it runs before, and
 * underneath, the functions it wraps. */
#include "shim.h"
#include "channel.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__thread struct llft_thread llft_self TLS_IE;
int llft_state;
llft_ctl_t *llft_ctl;
llft_ring_t *llft_ring;
uint32_t llft_next_tid = 1;

void *llft_resolve(const char *name, const char *version)
{
    void *p = version ? dlvsym(RTLD_NEXT, name, version) : dlsym(RTLD_NEXT, name);
    if (!p) {
        llft_log("llft: cannot find the real %s: %s", name, dlerror());
        llft_exit_now(LLFT_EXIT_NOSTREAM);
    }
    return p;
}

uint64_t llft_now_ns(void)
{
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t llft_now_ms(void)
{
    return llft_now_ns() / 1000000u;
}

uint64_t llft_waited_ms(struct llft_waited *w)
{
    uint64_t now = llft_now_ms();
    if (w->last_ms)
        w->ms += now - w->last_ms < LLFT_LOOK_MAX_MS ? now - w->last_ms : LLFT_LOOK_MAX_MS;
    w->last_ms = now;
    return w->ms;
}

static void write_all(int fd, const char *s, size_t n)
{
    while (n) {
        long w = syscall(SYS_write, fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

void llft_log(const char *fmt, ...)
{
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    write_all(2, buf, (size_t)n);
}

static __attribute__((noreturn)) void fail_attach(const char *path, const char *why)
{
    llft_log("llft: cannot attach the record stream %s: %s", path, why);
    llft_exit_now(LLFT_EXIT_NOSTREAM);
}

/* LLFT_SHM is "fd:N", the stream file's fd handed down by the controller
 * (kept open for the next image an exec starts), or a path. */
static void attach(const char *spec)
{
    int by_fd = strncmp(spec, "fd:", 3) == 0, fd;
    if (by_fd) {
        fd = atoi(spec + 3);
        if (syscall(SYS_fcntl, fd, F_GETFD) < 0)
            fail_attach(spec, "that fd is not open (closed by a program that ran before this one?)");
    } else {
        fd = (int)syscall(SYS_openat, AT_FDCWD, spec, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            fail_attach(spec, strerror(errno));
    }
    struct stat st;
    if (syscall(SYS_fstat, fd, &st) != 0)
        fail_attach(spec, strerror(errno));
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!by_fd)
        syscall(SYS_close, fd);
    if (base == MAP_FAILED)
        fail_attach(spec, strerror(errno));
    int rc = llft_shm_check(base, (uint64_t)st.st_size);
    if (rc != 0)
        fail_attach(spec, rc == -EPROTO ? "ABI version mismatch" : "not an llft stream (truncated or foreign file)");
    llft_ctl_t *ctl = llft_shm_ctl(base);
    int32_t me = (int32_t)syscall(SYS_getpid), none = 0;
    /* A program started by the replica (exec) inherits the environment:
     * only the first process to attach is the replica itself. */
    if (!__atomic_compare_exchange_n(&ctl->attached_pid, &none, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
        && none != me) {
        munmap(base, (size_t)st.st_size);
        return;
    }
    if (by_fd)
        llft_stream_keep(fd);
    llft_ring = llft_shm_ring(base);
    llft_obj_reserve();
    llft_replay_reserve();
    llft_channel_attach(ctl);
    llft_lease_attach(ctl);
    if (ctl->role == LLFT_ROLE_BACKUP && ctl->fork_mode == LLFT_FORKS_REPLICATED)
        llft_inbox_open(ctl);
    if (ctl->role == LLFT_ROLE_BACKUP)
        llft_replay_setup();
    llft_serial_init();
    llft_quiesce_init();
    llft_self.tid = 0;
    llft_self.state = TS_TRACKED;
    __atomic_store_n(&llft_ctl, ctl, __ATOMIC_RELEASE);
}

void llft_init_slow(void)
{
    if (__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) == LLFT_STATE_FORKING) {
        llft_fork_child_check();
        return;
    }
    int expected = 0;
    if (!__atomic_compare_exchange_n(&llft_state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* already running (a nested call passes through) or done */
    llft_library_keep();
    const char *path = getenv("LLFT_SHM");
    if (path && *path)
        attach(path);
    __atomic_store_n(&llft_state, 2, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void llft_ctor(void)
{
    if (__atomic_load_n(&llft_state, __ATOMIC_ACQUIRE) == 0)
        llft_init_slow();
}

/* The frames as text, one per line (function+offset, object), without
 * allocating: the controller keeps it in the run dir. */
static void where_into(char *out, size_t cap, void *const *frames, int n)
{
    size_t len = 0;
    out[0] = 0;
    Dl_info self;
    void *self_base = dladdr((void *)where_into, &self) ? self.dli_fbase : NULL;
    for (int i = 0; i < n && len + 1 < cap; i++) {
        Dl_info info;
        int w;
        int found = dladdr(frames[i], &info);
        if (found && info.dli_fbase == self_base && llft_library_path[0])
            info.dli_fname = llft_library_path; /* loaded as /proc/self/fd/N: name the file */
        if (found && info.dli_sname)
            w = snprintf(out + len, cap - len, "#%d %s+%#lx (%s)\n", i, info.dli_sname,
                         (unsigned long)((char *)frames[i] - (char *)info.dli_saddr), info.dli_fname);
        else if (found && info.dli_fname)
            w = snprintf(out + len, cap - len, "#%d %p (%s+%#lx)\n", i, frames[i], info.dli_fname,
                         (unsigned long)((char *)frames[i] - (char *)info.dli_fbase));
        else
            w = snprintf(out + len, cap - len, "#%d %p\n", i, frames[i]);
        if (w < 0 || (size_t)w >= cap - len)
            break;
        len += (size_t)w;
    }
}

/* A backup thread's calls before the one it diverged at, as the primary
 * recorded them, newest first, a line each: what led there. */
static void calls_before(const struct llft_thread *t, const llft_rec_t *got, char *out, size_t cap)
{
    llft_rec_t recent[12];
    int n = llft_replay_recent(t, recent, 12);
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        const llft_rec_t *r = &recent[i];
        if (got && r->tn >= got->tn)
            continue; /* the record in hand, or one after it */
        int w = snprintf(out + len, cap - len, "#%u %s (object %#llx, turn %llu, result %lld)\n", r->tn,
                         llft_op_name(r->op), (unsigned long long)r->obj, (unsigned long long)r->turn,
                         (long long)r->ret);
        if (w < 0 || (size_t)w >= cap - len) {
            out[len] = 0;
            break;
        }
        len += (size_t)w;
    }
}

void llft_diverge(const struct llft_thread *t, uint16_t want_op, const llft_rec_t *got,
                  int exit_code, const char *fmt, ...)
{
    char what[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    llft_ctl_t *c = llft_ctl;
    char text[sizeof c->div_text + 256], process[48] = "";
    if (c && c->stream_id) /* a process the replica forked (fork_stream.c) */
        snprintf(process, sizeof process, " (forked process %llx, pid %d)", (unsigned long long)c->stream_id,
                 (int)syscall(SYS_getpid));
    if (got)
        snprintf(text, sizeof text,
                 "replica %u%s thread %u call #%u: called %s; the primary's next record for this thread is "
                 "%s (call #%u, object %#llx, turn %llu, result %lld): %s",
                 c ? c->replica : 0, process, t ? t->tid : 0, t ? t->tn + 1 : 0, llft_op_name(want_op),
                 llft_op_name(got->op), got->tn, (unsigned long long)got->obj,
                 (unsigned long long)got->turn, (long long)got->ret, what);
    else
        snprintf(text, sizeof text, "replica %u%s thread %u call #%u (%s): %s", c ? c->replica : 0, process,
                 t ? t->tid : 0, t ? t->tn + 1 : 0, llft_op_name(want_op), what);
    char before[sizeof c->div_before];
    calls_before(t, got, before, sizeof before);
    if (c) {
        uint32_t zero = 0;
        if (__atomic_compare_exchange_n(&c->diverged, &zero, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            c->div_tid = t ? t->tid : 0;
            c->div_tn = t ? t->tn + 1 : 0;
            c->div_want_op = want_op;
            c->div_got_op = got ? got->op : 0;
            memcpy(c->div_text, text, sizeof c->div_text - 1);
            memcpy(c->div_before, before, sizeof c->div_before - 1);
        }
    }
    llft_log("llft: %s: %s", exit_code == LLFT_EXIT_DIVERGED ? "divergence" : "incomplete record stream", text);
    void *frames[24];
    int n = backtrace(frames, 24);
    char where[sizeof c->div_where];
    where_into(where, sizeof where, frames, n);
    llft_log("llft: where the backup was (innermost first):");
    write_all(2, where, strlen(where));
    if (before[0]) {
        llft_log("llft: this thread's calls before it, as the primary recorded them (newest first):");
        write_all(2, before, strlen(before));
    }
    if (c)
        memcpy(c->div_where, where, sizeof c->div_where);
    llft_exit_now(exit_code);
}

void llft_refuse(const char *fmt, ...)
{
    char text[sizeof llft_ctl->div_text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    llft_ctl_t *c = llft_ctl ? llft_ctl : llft_forked_from;
    if (c) {
        memcpy(c->div_text, text, sizeof c->div_text - 1);
        __atomic_store_n(&c->refused, 1, __ATOMIC_RELEASE);
    }
    llft_log("llft: cannot replicate: %s", text);
    llft_exit_now(LLFT_EXIT_UNREACHABLE);
}

/* exit(): a backup's exiting thread waits for the primary's end of stream. */
static void at_exit(void)
{
    struct llft_thread *t;
    llft_serial_give(); /* the others run on to where the primary's were */
    if (llft_mode(&t) == LLFT_ROLE_BACKUP)
        llft_replay_at_exit(t);
}

__attribute__((destructor)) static void llft_dtor(void) { at_exit(); }

/* _exit() skips the destructors, and a program that ends with it (dash's
 * exit builtin) must end as exit() does: a backup's ending before its
 * primary's would read as a backup gone astray. */
DEFINE_REAL(_exit)
EXPORT void _exit(int status)
{
    llft_lease_leaving(1);
    llft_daemon_exit();
    at_exit();
    ((void (*)(int))REAL(_exit))(status);
    __builtin_unreachable();
}

EXPORT void _Exit(int status) { _exit(status); }

/* exit(): a daemon's parent leaving its child to go on (daemon_fork.c). */
DEFINE_REAL(exit)
EXPORT void exit(int status)
{
    llft_lease_leaving(1);
    llft_daemon_exit();
    ((void (*)(int))REAL(exit))(status);
    __builtin_unreachable();
}

long llft_read_small_file(const char *path, char *buf, size_t cap)
{
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    long n = syscall(SYS_read, fd, buf, cap - 1);
    syscall(SYS_close, fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return n;
}

void llft_exit_now(int code)
{
    syscall(SYS_exit_group, code);
    __builtin_unreachable();
}
