/* OrderInfo ring and record codec.  Free of allocation and locks: producers
 * reserve slots with one atomic add, fill them, and publish each slot by
 * storing its sequence number last. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ring.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"

/* ---- record codec -------------------------------------------------- */

uint32_t llft_rec_check(const void *slot)
{
    const uint64_t *w = slot;
    const uint32_t *h = slot;
    uint64_t x = (uint64_t)h[3] * 0x9E3779B97F4A7C15ull;
    for (int i = 2; i < 8; i++)
        x = (x ^ w[i]) * 0xff51afd7ed558ccdull;
    return (uint32_t)(x >> 32) | 1u; /* never 0: a zeroed slot never passes */
}

void llft_rec_seal(void *slot)
{
    ((llft_rec_t *)slot)->check = llft_rec_check(slot);
}

static const char *const op_names[LLFT_OP_MAX] = {
    [LLFT_OP_DATA] = "data", [LLFT_OP_END] = "end-of-stream", [LLFT_OP_PROMOTE] = "promote",
    [LLFT_OP_CLOCK_GETTIME] = "clock_gettime", [LLFT_OP_GETTIMEOFDAY] = "gettimeofday",
    [LLFT_OP_TIME] = "time", [LLFT_OP_GETPID] = "getpid",
    [LLFT_OP_THREAD_CREATE] = "pthread_create", [LLFT_OP_THREAD_EXIT] = "thread-exit",
    [LLFT_OP_EXEC] = "execve", [LLFT_OP_EXEC_FAILED] = "execve-failed",
    [LLFT_OP_MUTEX_LOCK] = "pthread_mutex_lock", [LLFT_OP_MUTEX_TRYLOCK] = "pthread_mutex_trylock",
    [LLFT_OP_MUTEX_TIMEDLOCK] = "pthread_mutex_timedlock",
    [LLFT_OP_COND_WAIT] = "pthread_cond_wait", [LLFT_OP_COND_TIMEDWAIT] = "pthread_cond_timedwait",
    [LLFT_OP_RWLOCK_RDLOCK] = "pthread_rwlock_rdlock", [LLFT_OP_RWLOCK_WRLOCK] = "pthread_rwlock_wrlock",
    [LLFT_OP_RWLOCK_TRYRDLOCK] = "pthread_rwlock_tryrdlock",
    [LLFT_OP_RWLOCK_TRYWRLOCK] = "pthread_rwlock_trywrlock",
    [LLFT_OP_RWLOCK_TIMEDRDLOCK] = "pthread_rwlock_timedrdlock",
    [LLFT_OP_RWLOCK_TIMEDWRLOCK] = "pthread_rwlock_timedwrlock",
    [LLFT_OP_SEM_WAIT] = "sem_wait", [LLFT_OP_SEM_TRYWAIT] = "sem_trywait",
    [LLFT_OP_SEM_TIMEDWAIT] = "sem_timedwait",
    [LLFT_OP_GETRANDOM] = "getrandom", [LLFT_OP_RANDOM_READ] = "read(/dev/urandom)",
    [LLFT_OP_RANDOM_FREAD] = "fread(/dev/urandom)", [LLFT_OP_GETENTROPY] = "getentropy",
    [LLFT_OP_ARC4RANDOM] = "arc4random",
    [LLFT_OP_PROC_READ] = "read(/proc)", [LLFT_OP_PROC_FREAD] = "fread(/proc)",
    [LLFT_OP_GETRUSAGE] = "getrusage", [LLFT_OP_TIMES] = "times", [LLFT_OP_CLOCK] = "clock",
    [LLFT_OP_ACCEPT] = "accept", [LLFT_OP_READ] = "read", [LLFT_OP_WRITE] = "write",
    [LLFT_OP_POLL] = "poll", [LLFT_OP_SELECT] = "select", [LLFT_OP_EPOLL_WAIT] = "epoll_wait",
    [LLFT_OP_SENDFILE] = "sendfile", [LLFT_OP_DGRAM_RECV] = "recv(udp)", [LLFT_OP_DGRAM_SEND] = "send(udp)",
    [LLFT_OP_CONNECT] = "connect", [LLFT_OP_NEW_FD] = "new-fd", [LLFT_OP_BIND_PORT] = "bind-port",
    [LLFT_OP_CLOSE] = "close", [LLFT_OP_CHILD_READ] = "read(pipe from a forked child)",
    [LLFT_OP_SERIAL_TURN] = "the replica's turn (--serialize)",
    [LLFT_OP_SIGNAL_SELF] = "raise", [LLFT_OP_FORK] = "fork", [LLFT_OP_WAIT] = "wait",
    [LLFT_OP_GETPPID] = "getppid", [LLFT_OP_SIGNAL] = "a signal handler", [LLFT_OP_SIGSUSPEND] = "sigsuspend",
    [LLFT_OP_KILL] = "kill",
};

int llft_op_valid(int op)
{
    return op > 0 && op < LLFT_OP_MAX && op_names[op] != NULL;
}

const char *llft_op_name(int op)
{
    return llft_op_valid(op) ? op_names[op] : "unknown-op";
}

uint32_t llft_data_slots(uint64_t nbytes)
{
    return (uint32_t)((nbytes + LLFT_DATA_BYTES - 1) / LLFT_DATA_BYTES);
}

int llft_rec_validate(const void *slot, uint64_t expected_seq)
{
    const llft_rec_t *r = slot;
    uint64_t seq = LOAD(&r->seq, ACQ);
    if (seq != expected_seq)
        return (seq < expected_seq) ? LLFT_REC_PENDING : LLFT_REC_CORRUPT;
    return llft_rec_check_fields(slot);
}

int llft_rec_check_fields(const void *slot)
{
    const llft_rec_t *r = slot;
    if (r->check != llft_rec_check(r))
        return LLFT_REC_CORRUPT;
    if (!llft_op_valid(r->op))
        return LLFT_REC_BADFIELD;
    if (r->op == LLFT_OP_DATA)
        return ((const llft_data_t *)r)->len <= LLFT_DATA_BYTES ? LLFT_REC_OK : LLFT_REC_BADFIELD;
    if (r->nslots < 1 || r->nslots > LLFT_MAX_GROUP)
        return LLFT_REC_BADFIELD;
    return LLFT_REC_OK;
}

/* Validates a buffer of slots holding whole groups (as llft_ring_read
 * returns them, or as they arrive over the network).  Returns the number of
 * groups, or -(1 + index of the first bad slot). */
long llft_count_groups(const void *slots, long n)
{
    long groups = 0;
    for (long i = 0; i < n;) {
        const llft_rec_t *h = (const llft_rec_t *)((const char *)slots + i * LLFT_REC_SIZE);
        if (llft_rec_check_fields(h) != LLFT_REC_OK || h->op == LLFT_OP_DATA || i + h->nslots > n)
            return -(1 + i);
        for (long j = 1; j < h->nslots; j++) {
            const llft_rec_t *d = (const llft_rec_t *)((const char *)h + j * LLFT_REC_SIZE);
            if (llft_rec_check_fields(d) != LLFT_REC_OK || d->op != LLFT_OP_DATA)
                return -(1 + i + j);
        }
        i += h->nslots;
        groups++;
    }
    return groups;
}

/* The connection ids of the successful accepts among whole record groups
 * (llft_count_groups's input): up to max into ids; returns how many. */
long llft_scan_accepts(const void *slots, long n, uint64_t *ids, long max)
{
    long found = 0;
    for (long i = 0; i < n && found < max;) {
        const llft_rec_t *h = (const llft_rec_t *)((const char *)slots + i * LLFT_REC_SIZE);
        if (h->nslots < 1)
            break;
        if (h->op == LLFT_OP_ACCEPT && h->ret >= 0 && h->nslots > 1 && i + 1 < n) {
            const llft_data_t *d = (const llft_data_t *)((const char *)h + LLFT_REC_SIZE);
            if (d->len >= sizeof(uint64_t))
                memcpy(&ids[found++], d->bytes, sizeof(uint64_t));
        }
        i += h->nslots;
    }
    return found;
}

/* ---- shared file layout -------------------------------------------- */

llft_ctl_t *llft_shm_ctl(void *base) { return base; }
llft_ring_t *llft_shm_ring(void *base) { return (llft_ring_t *)((char *)base + LLFT_CTL_BYTES); }

int llft_shm_format(void *base, uint64_t mapped, uint64_t slots, uint32_t role, uint32_t replica)
{
    if (slots < LLFT_MAX_GROUP || (slots & (slots - 1)) || mapped < llft_shm_bytes(slots))
        return -EINVAL;
    memset(base, 0, LLFT_CTL_BYTES + LLFT_RING_HDR);
    llft_ctl_t *c = llft_shm_ctl(base);
    c->magic = LLFT_CTL_MAGIC;
    c->version = LLFT_ABI_VERSION;
    c->role = role;
    c->replica = replica;
    c->stall_timeout_ms = 60000;
    c->end_grace_ms = 3000;
    llft_ring_t *r = llft_shm_ring(base);
    r->magic = LLFT_RING_MAGIC;
    r->version = LLFT_ABI_VERSION;
    r->rec_size = LLFT_REC_SIZE;
    r->capacity = slots;
    return 0;
}

int llft_shm_check(const void *base, uint64_t mapped)
{
    if (mapped < LLFT_CTL_BYTES + LLFT_RING_HDR)
        return -EINVAL;
    const llft_ctl_t *c = base;
    const llft_ring_t *r = (const llft_ring_t *)((const char *)base + LLFT_CTL_BYTES);
    if (c->magic != LLFT_CTL_MAGIC || r->magic != LLFT_RING_MAGIC)
        return -EBADMSG;
    if (c->version != LLFT_ABI_VERSION || r->version != LLFT_ABI_VERSION || r->rec_size != LLFT_REC_SIZE)
        return -EPROTO;
    if (r->capacity < LLFT_MAX_GROUP || (r->capacity & (r->capacity - 1)) ||
        mapped < llft_shm_bytes(r->capacity))
        return -EINVAL;
    return 0;
}

/* ---- futex --------------------------------------------------------- */

/* The shim's waits leave errno as the program had it: a program may read
 * errno after a call that succeeded (CPython's poll loop retries when it
 * says EINTR, whatever poll returned), and a wait that a stop interrupts
 * (a debugger, CRIU's checkpoint of a backup) fails with EINTR, which a
 * backup's replayed call would otherwise seem to have had. */
int llft_futex_wait(uint32_t *addr, uint32_t expected, int timeout_ms)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ms >= 0) {
        ts.tv_sec = timeout_ms / 1000;
        ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
        tsp = &ts;
    }
    int saved = errno;
    int r = (int)syscall(SYS_futex, addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    errno = saved;
    return r;
}

void llft_futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int llft_futex_wait_bits(uint32_t *addr, uint32_t expected, int timeout_ms, uint32_t bits)
{
    struct timespec ts; /* FUTEX_WAIT_BITSET's timeout is absolute, on CLOCK_MONOTONIC */
    int saved = errno;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)(timeout_ms % 1000) * 1000000L;
    ts.tv_sec += timeout_ms / 1000 + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    int r = (int)syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, expected, &ts, NULL, bits);
    errno = saved;
    return r;
}

void llft_futex_wake_bits(uint32_t *addr, int count, uint32_t bits)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_BITSET, count, NULL, NULL, bits);
}

/* ---- producer ------------------------------------------------------ */

int llft_ring_wait_space(llft_ring_t *r, uint64_t pos, uint32_t n, uint64_t *cached_tail, int timeout_ms)
{
    int waited = 0;
    for (;;) {
        uint64_t tail = LOAD(&r->tail, ACQ);
        *cached_tail = tail;
        if (pos + n - tail <= r->capacity)
            return 0;
        if (timeout_ms >= 0 && waited >= timeout_ms)
            return -ETIMEDOUT;
        uint32_t f = LOAD(&r->space_futex, SEQ);
        __atomic_fetch_add(&r->producer_waiting, 1, SEQ);
        tail = LOAD(&r->tail, SEQ);
        if (pos + n - tail > r->capacity)
            llft_futex_wait(&r->space_futex, f, 10);
        __atomic_fetch_sub(&r->producer_waiting, 1, SEQ);
        waited += 10;
    }
}

uint64_t llft_ring_reserve(llft_ring_t *r, uint32_t n, uint64_t *cached_tail)
{
    uint64_t pos = __atomic_fetch_add(&r->head, n, RLX);
    if (__builtin_expect(pos + n - *cached_tail > r->capacity, 0))
        llft_ring_wait_space(r, pos, n, cached_tail, -1);
    return pos;
}

void llft_ring_commit(void *slot, uint64_t pos)
{
    llft_rec_seal(slot);
    STORE(&((llft_rec_t *)slot)->seq, pos + 1, REL);
}

void llft_ring_doorbell(llft_ring_t *r)
{
    if (LOAD(&r->consumer_waiting, SEQ)) {
        __atomic_fetch_add(&r->data_futex, 1, SEQ);
        llft_futex_wake(&r->data_futex);
    }
}

/* Single-producer bulk write (the controller feeding a backup): copies n
 * slots, giving each its position here; returns slots written. */
long llft_ring_write(llft_ring_t *r, const void *slots, long n, int timeout_ms)
{
    long done = 0;
    uint64_t cached = 0;
    while (done < n) {
        uint64_t pos = LOAD(&r->head, RLX);
        if (llft_ring_wait_space(r, pos, 1, &cached, timeout_ms) != 0)
            break;
        long room = (long)(r->capacity - (pos - cached));
        long chunk = n - done < room ? n - done : room;
        for (long i = 0; i < chunk; i++) {
            llft_rec_t *dst = llft_ring_slot(r, pos + i);
            memcpy((char *)dst + 8, (const char *)slots + (done + i) * LLFT_REC_SIZE + 8, LLFT_REC_SIZE - 8);
            STORE(&dst->seq, pos + i + 1, REL);
        }
        STORE(&r->head, pos + chunk, REL);
        done += chunk;
        __atomic_thread_fence(SEQ);
        llft_ring_doorbell(r);
    }
    return done;
}

int llft_ring_write_end(llft_ring_t *r, int status, int timeout_ms)
{
    return llft_ring_write_control(r, LLFT_OP_END, status, timeout_ms);
}

/* END (the primary exited, with exit status ret, or -1 if unknown) or
 * PROMOTE (it failed; this backup takes over): the last record of the
 * stream this ring carries from the controller. */
int llft_ring_write_control(llft_ring_t *r, int op, int ret, int timeout_ms)
{
    llft_rec_t end;
    memset(&end, 0, sizeof end);
    end.op = (uint16_t)op;
    end.ret = ret;
    end.nslots = 1;
    llft_rec_seal(&end);
    long w = llft_ring_write(r, &end, 1, timeout_ms);
    /* After PROMOTE the replica writes this ring and the controller reads
     * it again: it is not closed (a closed ring never lets the reader sleep
     * in llft_ring_wait_data, so the new primary's shipper would spin). */
    if (op == LLFT_OP_END)
        STORE(&r->closed, 1, REL);
    __atomic_fetch_add(&r->data_futex, 1, SEQ);
    llft_futex_wake(&r->data_futex);
    return w == 1 ? 0 : -ETIMEDOUT;
}

/* ---- consumer ------------------------------------------------------ */

/* Wakes a consumer sleeping in llft_ring_wait_data, data or not (the
 * controller telling its own reader thread to look again). */
void llft_ring_wake(llft_ring_t *r)
{
    __atomic_fetch_add(&r->data_futex, 1, SEQ);
    llft_futex_wake(&r->data_futex);
}

uint64_t llft_ring_head(const llft_ring_t *r) { return LOAD(&r->head, ACQ); }
uint64_t llft_ring_tail(const llft_ring_t *r) { return LOAD(&r->tail, ACQ); }

void llft_ring_release(llft_ring_t *r, uint64_t new_tail)
{
    STORE(&r->tail, new_tail, SEQ);
    if (LOAD(&r->producer_waiting, SEQ)) {
        __atomic_fetch_add(&r->space_futex, 1, SEQ);
        llft_futex_wake(&r->space_futex);
    }
}

/* Copies up to max_slots committed slots, whole groups only, and frees
 * them.  Returns the count, or a negative LLFT_REC_* code when the slot at
 * the tail is corrupt (the tail stays on it; see llft_ring_error_pos). */
long llft_ring_read(llft_ring_t *r, void *out, long max_slots)
{
    uint64_t tail = LOAD(&r->tail, RLX);
    long got = 0;
    while (got < max_slots) {
        uint64_t pos = tail + (uint64_t)got;
        const llft_rec_t *h = llft_ring_slot(r, pos);
        int v = llft_rec_validate(h, pos + 1);
        if (v == LLFT_REC_PENDING)
            break;
        if (v != LLFT_REC_OK || h->op == LLFT_OP_DATA) {
            if (got)
                break; /* hand over what is good; report the bad slot next call */
            return v != LLFT_REC_OK ? v : LLFT_REC_BADFIELD;
        }
        uint32_t n = h->nslots;
        if (got + (long)n > max_slots)
            break;
        uint32_t i;
        for (i = 1; i < n; i++) {
            int dv = llft_rec_validate(llft_ring_slot(r, pos + i), pos + i + 1);
            const llft_rec_t *d = llft_ring_slot(r, pos + i);
            if (dv == LLFT_REC_PENDING)
                break;
            if (dv != LLFT_REC_OK || d->op != LLFT_OP_DATA) {
                if (got)
                    goto out;
                return dv != LLFT_REC_OK ? dv : LLFT_REC_BADFIELD;
            }
        }
        if (i < n)
            break; /* group not complete yet */
        for (i = 0; i < n; i++)
            memcpy((char *)out + (got + i) * LLFT_REC_SIZE, llft_ring_slot(r, pos + i), LLFT_REC_SIZE);
        got += n;
    }
out:
    if (got)
        llft_ring_release(r, tail + (uint64_t)got);
    return got;
}

uint64_t llft_ring_error_pos(const llft_ring_t *r) { return LOAD(&r->tail, ACQ); }

/* Waits until the slot at the tail may be committed, or the producer closed.
 * Returns 1 if there may be data, 0 on timeout. */
int llft_ring_wait_data(llft_ring_t *r, int timeout_ms)
{
    uint64_t tail = LOAD(&r->tail, ACQ);
    const llft_rec_t *h = llft_ring_slot(r, tail);
    if (LOAD(&h->seq, ACQ) == tail + 1 || LOAD(&r->closed, ACQ))
        return 1;
    uint32_t f = LOAD(&r->data_futex, SEQ);
    __atomic_fetch_add(&r->consumer_waiting, 1, SEQ);
    int ready = LOAD(&h->seq, SEQ) == tail + 1 || LOAD(&r->closed, SEQ);
    if (!ready)
        llft_futex_wait(&r->data_futex, f, timeout_ms);
    __atomic_fetch_sub(&r->consumer_waiting, 1, SEQ);
    return LOAD(&h->seq, ACQ) == tail + 1 || LOAD(&r->closed, ACQ);
}
