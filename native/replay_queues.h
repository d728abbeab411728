/* The backup's replay queues, shared by the files of the replay engine:
 * replay_queues.c (the queues and their chunk pool), replay.c (the
 * dispatcher, takeover, thread lifecycle), replay_end.c (the end of the
 * primary's stream), turnstile.c (turns on ordered objects) and
 * wait_order.c (event-loop waits after the calls recorded before them).
 * Internal to the preload library. */
#ifndef LLFT_REPLAY_QUEUES_H
#define LLFT_REPLAY_QUEUES_H

#include <string.h>

#include "atomics.h"
#include "shim.h"

#define CHUNK_RECS 255
struct qchunk {
    struct qchunk *next;
    uint32_t count;               /* records written (release-published) */
    uint32_t _pad[13];
    llft_rec_t recs[CHUNK_RECS];
};


/* ---- per-thread queues (replay_queues.c) ---- */
#define QSLOTS (1u << 16)         /* threads alive at once, at most */
#define QMASK (QSLOTS - 1)
enum { Q_FREE = 0, Q_LIVE = 1, Q_DEAD = 2 };

struct tqueue {
    struct qchunk *rd_chunk;      /* consumer (the owning thread) */
    uint32_t rd;
    uint32_t state;
    struct qchunk *wr_chunk;      /* producer (the dispatcher) */
    uint64_t pushed;              /* slots the dispatcher queued for this thread */
    uint64_t popped;              /* slots this thread has taken (calls it has started) */
    uint64_t to_finish;           /* of those, calls that must end before a takeover (must_finish) */
    uint64_t finished;            /* ...that this thread has ended (try_promote reads these) */
    uint32_t tid;                 /* whose queue this slot is (state != Q_FREE) */
    uint16_t gen;                 /* times the slot was taken: tells a later thread's from this one's */
    uint16_t _pad;
};

extern struct tqueue *llft_queues;
extern uint32_t *llft_live_slots;     /* slots of the live queues, in no order (dispatch lock) */
extern uint32_t llft_nlive_slots;
/* Held by the thread dispatching records into queues, and by whoever
 * changes the live slots or counts over them. */
extern uint32_t llft_dispatch_lock;

void *llft_map_anon(size_t bytes, const char *what);
void llft_queues_reserve(void);
void llft_queues_reset(void);           /* every slot free, the pool empty (no thread replaying) */
struct qchunk *llft_chunk_alloc(void);
void llft_chunk_free(struct qchunk *c);
/* A slot taken for tid, which has none (dispatch lock held). */
struct tqueue *llft_queue_new(uint32_t tid);

/* tid's queue (live or ended), or NULL (dispatch lock held).  Inline: the
 * dispatcher looks up the queue of every record it moves. */
static inline struct tqueue *llft_queue_find(uint32_t tid)
{
    for (uint32_t i = 0; i < QSLOTS; i++) {
        struct tqueue *q = &llft_queues[(tid + i) & QMASK];
        if (q->state == Q_FREE)
            return NULL;
        if (q->tid == tid)
            return q;
    }
    return NULL;
}

/* tid's queue, a free slot taken for it if it has none (dispatch lock held). */
static inline struct tqueue *llft_queue_for(uint32_t tid)
{
    struct tqueue *q = llft_queue_find(tid);
    return q != NULL ? q : llft_queue_new(tid);
}
/* The thread of q has ended: its slot says so, its chunks go back (dispatch lock held). */
void llft_queue_ended(struct tqueue *q);

/* The dispatcher's (dispatch lock held). */
static inline void q_push(struct tqueue *q, const void *rec)
{
    struct qchunk *c = q->wr_chunk;
    if (c->count == CHUNK_RECS) {
        struct qchunk *n = llft_chunk_alloc();
        STORE(&c->next, n, REL);
        q->wr_chunk = c = n;
    }
    memcpy(&c->recs[c->count], rec, LLFT_REC_SIZE);
    STORE(&c->count, c->count + 1, REL);
    q->pushed++;
}

/* A replayed call that must end before this replica takes over, or a
 * native call could contradict it: a turn (a native acquisition would
 * overtake it).  New fds and accepts take turns and end them once their
 * numbers are placed: a native socket() or accept() would otherwise take
 * the lowest free number, which the replaying thread is about to claim,
 * and the new primary would record that number twice, in an order its
 * backups cannot follow. */
static inline int must_finish(const llft_rec_t *r)
{
    return r->op != LLFT_OP_DATA && r->turn;
}

/* The owning thread's: its next record into out, taken (consume) or only
 * looked at; 0 if there is none yet. */
static inline int q_take(struct tqueue *q, llft_rec_t *out, int consume)
{
    struct qchunk *c = q->rd_chunk;
    if (q->rd == CHUNK_RECS) {
        struct qchunk *n = LOAD(&c->next, ACQ);
        if (!n)
            return 0;
        q->rd_chunk = n;
        q->rd = 0;
        llft_chunk_free(c);
        c = n;
    }
    if (q->rd >= LOAD(&c->count, ACQ))
        return 0;
    memcpy(out, &c->recs[q->rd], LLFT_REC_SIZE);
    if (!consume)
        return 1;
    q->rd++;
    /* Counted before the record counts as taken, so that try_promote never
     * sees every record taken and this call not pending.  Only this thread
     * writes these counts: the hot path shares no line. */
    if (must_finish(out))
        STORE(&q->to_finish, q->to_finish + 1, RLX);
    STORE(&q->popped, q->popped + 1, REL);
    return 1;
}

/* Every thread but except's (NULL: all) has replayed all it was queued. */
int llft_queues_replayed(const struct tqueue *except);
/* Records taken and calls ended by every thread so far: it never goes back. */
uint64_t llft_queues_progress(void);

/* Waits until the thread of queue slot|gen<<16 (slotgen) has taken upto slots. */
void llft_wait_taken(struct llft_thread *t, const llft_rec_t *e, uint32_t slotgen, uint64_t upto);

/* ---- replay_end.c ---- */
extern uint32_t llft_stream_ended;
void llft_end_reached(int64_t status);   /* the dispatcher met END (dispatch lock held) */
void llft_end_forget(void);              /* no thread is replaying (llft_replay_restart) */
void llft_end_thread_started(void);
void llft_end_thread_ended(void);
/* The primary's stream has ended and this replica has made no progress
 * for --end-grace (slow paths only: it takes the dispatch lock). */
int llft_end_grace_over(void);
__attribute__((noreturn)) void llft_stop_for_good(struct llft_thread *t, uint16_t op);

/* ---- turnstile.c ---- */
void llft_turnstiles_reserve(void);
void llft_annotate_turn(llft_rec_t *rec);
void llft_adopt_objects(void);
void llft_turnstiles_from_objects(void);

/* ---- wait_order.c ---- */
static inline int llft_event_wait_op(uint16_t op)
{
    return op == LLFT_OP_POLL || op == LLFT_OP_SELECT || op == LLFT_OP_EPOLL_WAIT;
}
void llft_wait_notes_reserve(void);
void llft_annotate_wait(llft_rec_t *rec, const struct tqueue *self);
void llft_wait_for_earlier_calls(struct llft_thread *t, const llft_rec_t *e);

#endif
