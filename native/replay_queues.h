/* The backup's replay queues, shared by the files of the replay engine:
 * replay.c (the queues, the dispatcher, takeover, thread lifecycle),
 * turnstile.c (turns on ordered objects) and wait_order.c (event-loop
 * waits after the calls recorded before them).  Internal to the preload
 * library. */
#ifndef LLFT_REPLAY_QUEUES_H
#define LLFT_REPLAY_QUEUES_H

#include "shim.h"

#define CHUNK_RECS 255
struct qchunk {
    struct qchunk *next;
    uint32_t count;               /* records written (release-published) */
    uint32_t _pad[13];
    llft_rec_t recs[CHUNK_RECS];
};


/* ---- per-thread queues (replay.c) ---- */
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
extern uint32_t llft_stream_ended;

void *llft_map_anon(size_t bytes, const char *what);
struct tqueue *llft_queue_find(uint32_t tid);
/* Waits until the thread of queue slot|gen<<16 (slotgen) has taken upto slots. */
void llft_wait_taken(struct llft_thread *t, const llft_rec_t *e, uint32_t slotgen, uint64_t upto);

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
