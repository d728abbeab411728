/* Backup: a replayed event-loop wait returns only once every other thread
 * has started each call the primary recorded before the wait returned
 * there. */
#include "replay_queues.h"

#include <sys/mman.h>

#include "atomics.h"

/* ---- waits follow the primary's order --------------------------------
 * An event loop's wait (poll, select, epoll_wait) returns at the primary
 * when something happened, often another thread's doing, and the loop
 * then reads what that thread left, with or without a lock: memcached's
 * main loop reads a flag a worker's signal handler set (its shutdown).
 * Replayed, the wait would return as soon as its record is here, maybe
 * before the backup's worker got that far: memcached's main loop read the
 * flag unset, went round once more and read the clock where the primary's
 * had closed its listener.  So a replayed wait returns only once every
 * other thread has started each call the primary recorded before the
 * wait returned there.  The dispatcher notes, for each thread with
 * records it has not taken yet, how many slots it had queued then; the
 * waiting thread waits until each has taken that many.  Those calls
 * happened at the primary before the wait returned, so nothing they need
 * waits on this one: no cycle. */
#define SNAPS (1u << 14)
#define SNAP_MASK (SNAPS - 1)
struct snap {
    uint64_t at;                  /* index + 1 of the note written here (0 while being written) */
    uint64_t upto;                /* slots its thread had queued */
    uint32_t slotgen;             /* slot | gen << 16 of that thread's queue */
    uint32_t _pad;
};
static struct snap *snaps;
static uint64_t snap_head;        /* notes written (dispatch lock) */

/* Dispatcher: the wait's copy in the queue carries its first note + 1 in
 * seq and how many in check (no turn: llft_annotate_turn has none of these). */
void llft_annotate_wait(llft_rec_t *rec, const struct tqueue *self)
{
    uint64_t first = snap_head;
    for (uint32_t i = 0; i < llft_nlive_slots; i++) {
        const struct tqueue *q = &llft_queues[llft_live_slots[i]];
        if (q == self || LOAD(&q->popped, ACQ) >= q->pushed)
            continue;
        struct snap *s = &snaps[snap_head & SNAP_MASK];
        STORE(&s->at, 0, RLX);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        STORE(&s->upto, q->pushed, RLX);
        STORE(&s->slotgen, llft_live_slots[i] | (uint32_t)q->gen << 16, RLX);
        STORE(&s->at, snap_head + 1, REL);
        snap_head++;
    }
    rec->seq = snap_head != first ? first + 1 : 0;
    rec->check = (uint32_t)(snap_head - first);
}

void llft_wait_for_earlier_calls(struct llft_thread *t, const llft_rec_t *e)
{
    for (uint64_t k = e->seq - 1, end = k + e->check; k < end; k++) {
        const struct snap *s = &snaps[k & SNAP_MASK];
        if (LOAD(&s->at, ACQ) != k + 1)
            continue; /* written over: that far behind, its threads have long moved on */
        uint64_t upto = LOAD(&s->upto, RLX);
        uint32_t slotgen = LOAD(&s->slotgen, RLX);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(&s->at, RLX) == k + 1)
            llft_wait_taken(t, e, slotgen, upto);
    }
}

void llft_wait_notes_reserve(void)
{
    snaps = llft_map_anon(sizeof(struct snap) * SNAPS, "wait notes");
}

void llft_wait_notes_forget_all(void)
{
    madvise(snaps, sizeof(struct snap) * SNAPS, MADV_DONTNEED);
    snap_head = 0;
}
