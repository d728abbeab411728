/* Consistent Time Service (LLFT §V-D): the primary records every clock
 * reading; a backup returns the primary's value and keeps, per clock, the
 * offset between the group clock and its own, so that if it becomes primary
 * the group clock neither goes back nor jumps. */
#include "shim.h"

#include <errno.h>
#include <sys/time.h>
#include <time.h>

DEFINE_REAL(clock_gettime)
DEFINE_REAL(gettimeofday)
DEFINE_REAL(time)


/* Clocks that follow wall or monotonic time carry an offset; CPU-time
 * clocks (2, 3 and negative ids) are per-process and do not. */
static inline int offset_slot(clockid_t c)
{
    return (c >= 0 && c < LLFT_NCLOCKS && c != CLOCK_PROCESS_CPUTIME_ID && c != CLOCK_THREAD_CPUTIME_ID) ? c : -1;
}

static inline void atomic_max(int64_t *p, int64_t v)
{
    int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* Primary: local reading -> group clock.  The offset is 0 until this
 * replica takes over from a failed primary. */
static inline int64_t to_group(int slot, int64_t local)
{
    if (slot < 0)
        return local;
    int64_t off = __atomic_load_n(&llft_ctl->clock_offset_ns[slot], __ATOMIC_RELAXED);
    if (LIKELY(off == 0))
        return local;
    int64_t v = local + off, last = __atomic_load_n(&llft_ctl->clock_last_ns[slot], __ATOMIC_RELAXED);
    if (v < last)
        return last;
    atomic_max(&llft_ctl->clock_last_ns[slot], v);
    return v;
}

/* Backup: remember how far the group clock is from ours, as the largest
 * offset any replayed reading showed.  Threads replay at lags of their
 * own, so the last reading replayed may show a larger lag than an earlier
 * one of another thread; an offset taken from it would put the clock after
 * a takeover below a reading the primary had already handed out (a kv
 * client saw TIME go back).  With the largest, local time plus the offset
 * is at least every reading replayed, and is closest to real time. */
static inline void note_offset(int slot, int64_t group, int64_t local)
{
    if (slot < 0)
        return;
    int64_t *off = &llft_ctl->clock_offset_ns[slot], *last = &llft_ctl->clock_last_ns[slot];
    if (__atomic_load_n(last, __ATOMIC_ACQUIRE) == 0) /* the first reading replayed: nothing to compare */
        __atomic_store_n(off, group - local, __ATOMIC_RELAXED);
    else
        atomic_max(off, group - local);
    atomic_max(last, group);
}


const struct timespec *llft_local_deadline(int clock, const struct timespec *at, struct timespec *buf)
{
    int slot = offset_slot(clock);
    if (!at || slot < 0 || !llft_ctl || llft_self.state != TS_TRACKED)
        return at;
    int64_t off = __atomic_load_n(&llft_ctl->clock_offset_ns[slot], __ATOMIC_RELAXED);
    if (LIKELY(off == 0) || __atomic_load_n(&llft_ctl->role, __ATOMIC_RELAXED) != LLFT_ROLE_PRIMARY)
        return at;
    int64_t v = llft_ts_ns(at) - off;
    if (v < 0)
        v = 0;
    buf->tv_sec = v / LLFT_NS;
    buf->tv_nsec = v % LLFT_NS;
    return buf;
}

static int64_t local_ns(clockid_t c)
{
    struct timespec ts;
    return REAL(clock_gettime)(c, &ts) == 0 ? llft_ts_ns(&ts) : 0;
}

/* Backup: the primary's reading of clock c, after checking the call
 * matches; LLFT_PROMOTED if this replica has just taken over. */
static int replay_clock(struct llft_thread *t, uint16_t op, clockid_t c, llft_rec_t *e)
{
    if (llft_replay_next(t, op, e))
        return LLFT_PROMOTED;
    if (UNLIKELY(e->obj != (uint64_t)(int64_t)c))
        llft_diverge(t, op, e, LLFT_EXIT_DIVERGED, "read clock %d where the primary read clock %lld", (int)c,
                     (long long)e->obj);
    if (e->ret == 0)
        note_offset(offset_slot(c), e->val, local_ns(c));
    else
        errno = e->err;
    return 0;
}

EXPORT int clock_gettime(clockid_t c, struct timespec *ts)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (UNLIKELY(role == LLFT_ROLE_BACKUP)) {
        llft_rec_t e;
        if (!replay_clock(t, LLFT_OP_CLOCK_GETTIME, c, &e)) {
            if (e.ret == 0) {
                ts->tv_sec = e.val / LLFT_NS;
                ts->tv_nsec = e.val % LLFT_NS;
            }
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (LIKELY(role == LLFT_ROLE_PRIMARY)) {
        int r = REAL(clock_gettime)(c, ts);
        int64_t v = 0;
        if (LIKELY(r == 0)) {
            int64_t local = llft_ts_ns(ts);
            v = to_group(offset_slot(c), local);
            if (UNLIKELY(v != local)) { /* only after a failover: divisions are dear */
                ts->tv_sec = v / LLFT_NS;
                ts->tv_nsec = v % LLFT_NS;
            }
        }
        llft_record(t, LLFT_OP_CLOCK_GETTIME, (uint64_t)(int64_t)c, 0, r, r ? errno : 0, v);
        return r;
    }
    return REAL(clock_gettime)(c, ts);
}

EXPORT int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (UNLIKELY(role == LLFT_ROLE_BACKUP)) {
        llft_rec_t e;
        if (!replay_clock(t, LLFT_OP_GETTIMEOFDAY, CLOCK_REALTIME, &e)) {
            if (e.ret == 0) {
                tv->tv_sec = e.val / LLFT_NS;
                tv->tv_usec = (e.val % LLFT_NS) / 1000;
            }
            if (tz) { /* obsolete and constant: the local answer is the primary's */
                struct timeval scratch;
                REAL(gettimeofday)(&scratch, tz);
            }
            return (int)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (LIKELY(role == LLFT_ROLE_PRIMARY)) {
        int r = REAL(gettimeofday)(tv, tz);
        int64_t v = 0;
        if (LIKELY(r == 0)) {
            int64_t local = (int64_t)tv->tv_sec * LLFT_NS + (int64_t)tv->tv_usec * 1000;
            v = to_group(CLOCK_REALTIME, local);
            if (UNLIKELY(v != local)) {
                tv->tv_sec = v / LLFT_NS;
                tv->tv_usec = (v % LLFT_NS) / 1000;
            }
        }
        llft_record(t, LLFT_OP_GETTIMEOFDAY, CLOCK_REALTIME, 0, r, r ? errno : 0, v);
        return r;
    }
    return REAL(gettimeofday)(tv, tz);
}

EXPORT time_t time(time_t *out)
{
    LLFT_CALL(t);
    int role = llft_call_mode(&t);
    if (UNLIKELY(role == LLFT_ROLE_BACKUP)) {
        llft_rec_t e;
        if (!replay_clock(t, LLFT_OP_TIME, CLOCK_REALTIME, &e)) {
            if (out)
                *out = (time_t)e.ret;
            return (time_t)e.ret;
        }
        role = LLFT_ROLE_PRIMARY;
    }
    if (LIKELY(role == LLFT_ROLE_PRIMARY)) {
        time_t r = REAL(time)(NULL);
        int64_t v = r == (time_t)-1 ? -1 : to_group(CLOCK_REALTIME, (int64_t)r * LLFT_NS);
        time_t s = v < 0 ? (time_t)-1 : (time_t)(v / LLFT_NS);
        llft_record(t, LLFT_OP_TIME, CLOCK_REALTIME, 0, s, s == (time_t)-1 ? errno : 0, v);
        if (out)
            *out = s;
        return s;
    }
    return REAL(time)(out);
}
