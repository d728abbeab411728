/* Backup: the end of the primary's stream.  When the primary exits, its
 * stream ends with END and the program's status; each thread here then
 * replays what it has left and stops where the primary's thread was when
 * it exited (in a call it never finished, or before its next one).  Once
 * every thread has stopped so, with every record replayed, the replica
 * exits with the primary's status.  A backup still catching up finishes;
 * one that makes no progress for --end-grace is cut off, its stream called
 * incomplete.  The dispatcher (replay.c) says when END is reached. */
#include "replay_queues.h"

uint32_t llft_stream_ended;
static uint64_t stream_ended_ms;
static int64_t primary_status = -1; /* END's: the primary program's exit status, -1 if unknown */
static uint32_t live_threads;       /* threads replaying here: started and not ended */
static uint32_t stopped;            /* of those, stopped for good (llft_stop_for_good) */
static uint32_t stopped_futex;      /* bumped when either count changes */
static uint64_t grace_progress, grace_progress_ms; /* the replica's progress last seen, and when */
#define CENSUS_MS 10
static uint64_t census_ms;          /* when the last census of the queues was taken */

void llft_end_reached(int64_t status)
{
    primary_status = status;
    stream_ended_ms = llft_now_ms();
    STORE(&llft_stream_ended, 1, REL);
}

void llft_end_forget(void)
{
    STORE(&llft_stream_ended, 0, SEQ);
    stream_ended_ms = 0;
    grace_progress = grace_progress_ms = census_ms = 0;
    primary_status = -1;
    STORE(&live_threads, 0, SEQ);
    STORE(&stopped, 0, SEQ);
}

static void wake_stopped(void)
{
    __atomic_fetch_add(&stopped_futex, 1, SEQ);
    llft_futex_wake(&stopped_futex);
}

void llft_end_thread_started(void)
{
    __atomic_fetch_add(&live_threads, 1, SEQ);
}

void llft_end_thread_ended(void)
{
    __atomic_fetch_sub(&live_threads, 1, SEQ);
    wake_stopped();
}

/* Once the primary's stream has ended: whether this replica has made no
 * progress for --end-grace, counted from the end or from its last
 * progress, whichever came later.  A backup that lags (npm's startup
 * takes a million turns, and a loaded machine replays them behind the
 * primary) finishes what it has; one that is stuck is cut off.  Threads
 * waiting call this now and then, thousands of them at times: one census
 * of the queues each CENSUS_MS serves them all.  A race among them only
 * moves the moment of the last progress seen, never before the end. */
int llft_end_grace_over(void)
{
    uint64_t now = llft_now_ms(), last = LOAD(&census_ms, RLX);
    if (now >= last + CENSUS_MS && __atomic_compare_exchange_n(&census_ms, &last, now, 0, RLX, RLX)) {
        uint64_t progress = llft_queues_progress();
        now = llft_now_ms();   /* (after the census, whose lock may have kept it waiting) */
        if (progress != LOAD(&grace_progress, RLX)) {
            STORE(&grace_progress, progress, RLX);
            STORE(&grace_progress_ms, now, RLX);
            return 0;
        }
    }
    /* (another thread may have stored a moment later than this one's now) */
    uint64_t since = LOAD(&grace_progress_ms, RLX);
    if (since < stream_ended_ms)
        since = stream_ended_ms;
    return LOAD(&llft_stream_ended, ACQ) && now > since && now - since > llft_ctl->end_grace_ms;
}

/* This thread does nothing more, as at the primary: either the primary's
 * stream has ended without this call (when the primary exited, its thread
 * was blocked in this call, or had not reached it yet), or the primary's
 * thread ended where this one makes another call.  No thread is left to
 * run the program's exit path, so stdio buffers are not flushed.  A stream
 * whose end gives no status (a saved or cut one) makes it incomplete. */
__attribute__((noreturn)) void llft_stop_for_good(struct llft_thread *t, uint16_t op)
{
    __atomic_fetch_add(&stopped, 1, SEQ);
    wake_stopped();
    for (;;) {
        uint32_t seen = LOAD(&stopped_futex, SEQ);
        if (LOAD(&llft_stream_ended, ACQ)) {
            int replayed = llft_queues_replayed(NULL);
            int all = replayed && LOAD(&stopped, SEQ) == LOAD(&live_threads, SEQ);
            /* A forked process's stream ends without a status (the
             * controller is not its parent): its parent's wait replays
             * the primary's, and this process's own is nobody's. */
            if (all && primary_status < 0 && llft_ctl->stream_id)
                primary_status = 0;
            if (all && primary_status >= 0) {
                llft_log("llft: replica %u replayed the primary's whole stream; its %u threads stopped where "
                         "the primary's were when it exited (in a call it never finished, or before their "
                         "next one): exiting with the primary's status %lld",
                         llft_ctl->replica, LOAD(&live_threads, SEQ), (long long)primary_status);
                STORE(&llft_ctl->stopped_for_good, 1, SEQ);
                llft_exit_now((int)primary_status);
            }
            if (all || ((primary_status < 0 || !replayed) && llft_end_grace_over()))
                llft_diverge(t, op, NULL, LLFT_EXIT_NOSTREAM, "the primary's record stream ended without this call");
        }
        llft_futex_wait(&stopped_futex, seen, 50);
    }
}
