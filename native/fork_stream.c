/* Processes the program forks, replicated with it (llft-run --fork
 * replicate): each forked process has a record stream of its own, as a
 * thread has its own calls in its process's stream.  LLFT orders threads;
 * processes are the same problem with a different sharing model.
 *
 * At the primary, fork() forks for real and records FORK in the parent's
 * stream: the child's pid and its stream id.  The child makes its own
 * stream file (a memfd), hands it to the controller on the replica's
 * channel (LLFT_CHAN_STREAM) and records into it from its first call.  It
 * waits, before anything, until its parent's FORK is committed: a failover
 * then never finds a child whose fork the successor never makes.
 *
 * At a backup, fork() replays FORK first, forks for real, and returns the
 * primary's child pid; the child makes a stream of its own under the
 * recorded id and hands it over the same way, and the controller feeds it
 * the primary child's records (llft/determinizer/forked.py).  The parent
 * keeps which of its own children stands for which pid of the primary's
 * (the pid map), for its waits and its signals.
 *
 * A stream id is a function of the parent's id and its fork count, so
 * every replica derives the same one without asking anybody. */
#include "channel.h"
#include "fdtable.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the inbox: where a backup process gets its connections --------- *
 * At the primary, whichever process accepts a connection from the
 * listener they share records it in its own stream.  A backup's processes
 * must each get the very connections their counterparts accepted, so
 * each has an inbox of its own, a pair like a listener's, on which the
 * controller hands it those (llft/serving/routes.py); its replayed
 * accepts take them from there (wrap_socket.c). */
int llft_inbox = -1;

void llft_inbox_open(llft_ctl_t *ctl)
{
    /* An image this process exec'd: the inbox it had is its still, with
     * what the controller handed it meanwhile (a replacement's process is
     * handed its past connections the moment it hands its stream over). */
    int kept = ctl->inbox_fd;
    if (kept > 0 && syscall(SYS_fcntl, kept, F_GETFD) >= 0) {
        __atomic_store_n(&llft_inbox, kept, __ATOMIC_RELEASE);
        return;
    }
    int pair[2];
    if (syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        llft_log("llft: cannot make this process's inbox: %s", strerror(errno));
        return;
    }
    int mine = llft_above_the_floor(pair[0]);
    syscall(SYS_fcntl, mine, F_SETFD, 0); /* kept across exec */
    llft_channel_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = LLFT_CHAN_INBOX;
    memcpy(m.addr, &ctl->stream_id, 8);
    int err = llft_channel_send(&m, pair[1]);
    syscall(SYS_close, pair[1]);
    if (err) {
        syscall(SYS_close, mine);
        llft_log("llft: cannot hand this process's inbox to the controller: %s", strerror(err));
        return;
    }
    ctl->inbox_fd = mine;
    int old = __atomic_exchange_n(&llft_inbox, mine, __ATOMIC_ACQ_REL);
    if (old >= 0 && old != mine)
        syscall(SYS_close, old); /* (a forked child's: its parent's inbox) */
}

/* ---- the pid map: program pid <-> this process's own child ---------- */
#define PIDS 1024
static struct {
    pid_t program, local;
} pids[PIDS];

pid_t llft_pid_local(pid_t program)
{
    for (int i = 0; i < PIDS; i++)
        if (pids[i].program == program && program > 0)
            return pids[i].local;
    return program;
}

pid_t llft_pid_program(pid_t local)
{
    for (int i = 0; i < PIDS; i++)
        if (pids[i].local == local && local > 0)
            return pids[i].program;
    return local;
}

void llft_pid_forget(pid_t program)
{
    for (int i = 0; i < PIDS; i++)
        if (pids[i].program == program)
            pids[i].program = pids[i].local = 0;
}

static void pid_note(pid_t program, pid_t local)
{
    if (program == local)
        return;
    for (int i = 0; i < PIDS; i++)
        if (pids[i].program == 0) {
            pids[i].program = program;
            pids[i].local = local;
            return;
        }
    llft_log("llft: more than %d forked processes alive at once: waits and signals for the next one use the "
             "primary's pid", PIDS);
}

/* ---- the gates: a child waits until its parent has its fork on record --
 * At the primary, until the parent has recorded FORK; at a backup, until
 * the parent has taken the primary's FORK, which says the pid the program
 * sees for the child (what the primary's fork returned): the parent
 * leaves it beside the gate. */
#define GATES 64
static uint32_t *gates; /* shared with the children: gates[n % GATES] >= n + 1 once fork n is on record */
static int32_t *gate_pids; /* ...and the pid the program sees for that child */

int llft_fork_gates_at(unsigned long addr)
{
    return gates && (unsigned long)gates == addr;
}

static int gates_ready(void)
{
    if (gates)
        return 1;
    void *p = llft_shared_page();
    if (!p)
        return 0;
    gate_pids = (int32_t *)((uint32_t *)p + GATES);
    gates = p;
    return 1;
}

static void gate_open(uint32_t n, pid_t program_pid)
{
    uint32_t *g = &gates[n % GATES];
    __atomic_store_n(&gate_pids[n % GATES], program_pid, __ATOMIC_RELAXED);
    uint32_t seen = __atomic_load_n(g, __ATOMIC_ACQUIRE);
    while (seen < n + 1 &&
           !__atomic_compare_exchange_n(g, &seen, n + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
    llft_futex_wake(g);
}

/* In the child: until its parent has its fork on record; returns the pid
 * the program sees for this process.  A parent that died first never
 * recorded it: this process is no replica's. */
static pid_t gate_wait(uint32_t n, pid_t parent)
{
    uint32_t *g = &gates[n % GATES];
    uint32_t seen;
    while ((seen = __atomic_load_n(g, __ATOMIC_ACQUIRE)) < n + 1) {
        if ((pid_t)syscall(SYS_getppid) != parent)
            llft_exit_now(0);
        llft_futex_wait(g, seen, 100);
    }
    return __atomic_load_n(&gate_pids[n % GATES], __ATOMIC_RELAXED);
}

/* ---- the child's own stream ------------------------------------------ */

static uint64_t stream_id(uint64_t parent, uint32_t n)
{
    uint64_t z = parent ^ ((uint64_t)n + 1) * 0x9E3779B97F4A7C15ull; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

struct fork_plan {
    char shared[96];        /* the memory the parent shares with it (llft_shared_memory) */
    uint64_t stream;        /* the child's stream id */
    int role;               /* LLFT_ROLE_PRIMARY or LLFT_ROLE_BACKUP */
    pid_t program_pid;      /* the child's pid as the program sees it (the primary's child's) */
    pid_t parent_program;   /* the parent's pid as the program sees it */
};

void llft_obj_forget_all(void);         /* objtable.c */
void llft_turnstiles_forget_all(void);  /* turnstile.c */
void llft_wait_notes_forget_all(void);  /* wait_order.c */
void llft_early_forget(void);           /* wrap_socket.c */
void llft_process_forked(llft_ctl_t *c, pid_t program_pid, pid_t parent_program); /* wrap_process.c */
pid_t llft_program_pid(void);           /* wrap_process.c */

static __attribute__((noreturn)) void setup_failed(const char *what)
{
    llft_log("llft: a forked process cannot make its record stream: %s: %s", what, strerror(errno));
    llft_exit_now(LLFT_EXIT_NOSTREAM);
}

/* In the child, once it goes on: its own stream, as the controller's
 * streams are made, and the shim's per-process state started afresh (one
 * thread, thread ids from 1, no lock known, nothing to replay), alike at
 * every replica so that address layouts stay equal too. */
static void child_goes_on(const struct fork_plan *plan)
{
    llft_ctl_t *parent = llft_forked_from;
    uint64_t parent_bytes = llft_shm_bytes(llft_ring->capacity);
    uint64_t bytes = llft_shm_bytes(LLFT_CHILD_SLOTS);
    int fd = (int)syscall(SYS_memfd_create, "llft-stream", 0);
    if (fd < 0)
        setup_failed("memfd_create");
    if (syscall(SYS_ftruncate, fd, bytes) != 0)
        setup_failed("ftruncate");
    void *base = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if ((long)base < 0 && (long)base > -4096)
        setup_failed("mmap");
    llft_shm_format(base, bytes, LLFT_CHILD_SLOTS, (uint32_t)plan->role, parent->replica);
    llft_ctl_t *c = llft_shm_ctl(base);
    c->stall_timeout_ms = parent->stall_timeout_ms;
    c->end_grace_ms = parent->end_grace_ms;
    c->channel_fd = parent->channel_fd;
    c->lease_fd = parent->lease_fd;
    c->stopping = parent->stopping;
    c->fork_mode = parent->fork_mode;
    memcpy(c->clock_offset_ns, parent->clock_offset_ns, sizeof c->clock_offset_ns);
    memcpy(c->clock_last_ns, parent->clock_last_ns, sizeof c->clock_last_ns);
    c->stream_id = plan->stream;
    c->parent_stream = parent->stream_id;
    memcpy(c->shared_memory, plan->shared, sizeof c->shared_memory);
    c->shared_memory[sizeof c->shared_memory - 1] = 0;
    c->attached_pid = (int32_t)syscall(SYS_getpid);
    c->waited_for = llft_fork_waited_for;

    /* The stream file takes the parent's kept number: an exec attaches to
     * it through the environment, as the replica's first image did. */
    int kept = __atomic_load_n(&llft_stream_fd, __ATOMIC_ACQUIRE);
    if (kept >= 0) {
        if (syscall(SYS_dup3, fd, kept, 0) < 0)
            setup_failed("dup3");
        syscall(SYS_close, fd);
        fd = kept;
    } else {
        llft_stream_keep(fd);
        fd = llft_stream_fd;
    }
    syscall(SYS_munmap, parent, parent_bytes);

    llft_channel_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = LLFT_CHAN_STREAM;
    m.type = (uint32_t)plan->role;
    memcpy(m.addr, &c->stream_id, 8);
    memcpy(m.addr + 8, &c->parent_stream, 8);
    int err = llft_channel_send(&m, fd);
    if (err) {
        errno = err;
        setup_failed("no channel to the controller");
    }

    llft_obj_forget_all();
    llft_turnstiles_forget_all();
    llft_wait_notes_forget_all();
    llft_replay_restart(0);
    llft_early_forget();
    memset(pids, 0, sizeof pids);
    llft_process_forked(c, plan->role == LLFT_ROLE_BACKUP ? plan->program_pid : 0, plan->parent_program);
    struct llft_thread *t = &llft_self;
    t->tid = 0;
    t->tn = 0;
    t->cached_tail = 0;
    t->ring_end = 0;
    t->stamp = 0;
    t->q = NULL;
    t->state = TS_TRACKED;
    llft_serial_forked(t);
    __atomic_store_n(&llft_next_tid, 1, __ATOMIC_SEQ_CST);
    llft_ring = llft_shm_ring(base);
    llft_forked_from = NULL;
    __atomic_store_n(&llft_ctl, c, __ATOMIC_RELEASE);
    if (plan->role == LLFT_ROLE_BACKUP) {
        llft_inbox_open(c);
        llft_replay_setup();
    } else {
        int inbox = __atomic_exchange_n(&llft_inbox, -1, __ATOMIC_ACQ_REL); /* a taken-over parent's */
        if (inbox >= 0)
            syscall(SYS_close, inbox);
    }
}

/* Backup, the parent: the primary's FORK of this n-th fork, which came
 * after the calls the program's fork handlers made in the parent (the
 * fork itself runs them: an allocator's locks).  0, or LLFT_PROMOTED. */
static int fork_replayed(struct llft_thread *t, uint32_t n, pid_t p, pid_t *program_pid)
{
    llft_rec_t e;
    if (llft_replay_next(t, LLFT_OP_FORK, &e))
        return LLFT_PROMOTED;
    if (e.ret < 0) { /* it failed at the primary: so does it here */
        syscall(SYS_kill, p, SIGKILL);
        while (syscall(SYS_wait4, p, NULL, __WALL, NULL) < 0 && errno == EINTR)
            ;
        errno = e.err;
        *program_pid = -1;
        return 0;
    }
    if (e.aux != n)
        llft_diverge(t, LLFT_OP_FORK, &e, LLFT_EXIT_DIVERGED, "this process's fork #%u was its fork #%u at the "
                     "primary (its threads forked in another order)", n + 1, e.aux + 1);
    pid_note((pid_t)e.ret, p);
    *program_pid = (pid_t)e.ret;
    return 0;
}

/* fork() of a thread llft tracks, under --fork replicate.  Every replica
 * forks its n-th fork under the same stream id; the primary's parent
 * records FORK once the fork has returned, and a backup's parent takes it
 * then (the child goes on meanwhile, its own stream waiting for it). */
pid_t llft_fork_replicated(pid_t (*real_fork)(void))
{
    struct llft_thread *t;
    /* Not LLFT_CALL: a daemon's parent resumes in this frame as its child
     * (daemon_fork.c), and would leave the call twice. */
    int role = llft_mode(&t);
    struct fork_plan plan = {.role = role, .parent_program = llft_program_pid()};
    strncpy(plan.shared, llft_shared_memory(), sizeof plan.shared - 1);
    int how;
    if (!gates_ready()) {
        errno = ENOMEM;
        return -1;
    }
    uint32_t n = __atomic_fetch_add(&llft_ctl->forks, 1, __ATOMIC_SEQ_CST);
    plan.stream = stream_id(llft_ctl->stream_id, n);
    pid_t self = (pid_t)syscall(SYS_getpid);
    llft_lease_hold();
    pid_t p = llft_daemon_fork(real_fork, &how);
    if (how == LLFT_FORK_RESUMED) {
        llft_lease_forked(0);
        return 0;
    }
    if (p == 0) {
        llft_lease_forked(1);
        plan.program_pid = gate_wait(n, self);
        child_goes_on(&plan);
        return 0;
    }
    int err = errno;
    if (role == LLFT_ROLE_BACKUP) {
        if (p < 0)
            llft_diverge(t, LLFT_OP_FORK, NULL, LLFT_EXIT_DIVERGED, "this backup cannot fork: %s", strerror(err));
        pid_t program_pid;
        if (!fork_replayed(t, n, p, &program_pid)) {
            gate_open(n, program_pid);
            return program_pid;
        }
        /* Taken over before the record: the child goes on as the primary's
         * of its stream (the controller promotes it, llft/determinizer/forked.py). */
    }
    llft_record_aux(t, LLFT_OP_FORK, 0, 0, p, p < 0 ? err : 0, (int64_t)plan.stream, n);
    llft_wait_committed(t);
    gate_open(n, p);
    errno = err;
    return p;
}
