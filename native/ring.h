/* The OrderInfo ring: many producers, one consumer, in shared memory.
 * Used by the preload library (primary: threads append; backup: the
 * dispatcher consumes) and by the controller through cffi. */
#ifndef LLFT_RING_H
#define LLFT_RING_H

#include "llft_abi.h"

/* Results of llft_rec_validate / negative returns of llft_ring_read. */
#define LLFT_REC_OK        0
#define LLFT_REC_PENDING   1   /* not yet committed */
#define LLFT_REC_CORRUPT  (-1) /* check mismatch or impossible seq */
#define LLFT_REC_BADFIELD (-2) /* unknown op, bad slot count or length */

uint32_t llft_rec_check(const void *slot);
void     llft_rec_seal(void *slot);
int      llft_rec_validate(const void *slot, uint64_t expected_seq);
int      llft_rec_check_fields(const void *slot);
long     llft_count_groups(const void *slots, long n);
/* The connection ids of the successful accepts among whole record groups:
 * up to max into ids; returns how many (llft/serving/routes.py). */
long     llft_scan_accepts(const void *slots, long n, uint64_t *ids, long max);
int      llft_op_valid(int op);
const char *llft_op_name(int op);
uint32_t llft_data_slots(uint64_t nbytes);

int      llft_shm_format(void *base, uint64_t mapped, uint64_t slots, uint32_t role, uint32_t replica);
int      llft_shm_check(const void *base, uint64_t mapped);
llft_ctl_t  *llft_shm_ctl(void *base);
llft_ring_t *llft_shm_ring(void *base);

static inline void *llft_ring_slot(llft_ring_t *r, uint64_t pos)
{
    return (char *)r + LLFT_RING_HDR + (pos & (r->capacity - 1)) * LLFT_REC_SIZE;
}

/* Producer side. */
uint64_t llft_ring_reserve(llft_ring_t *r, uint32_t n, uint64_t *cached_tail);
int      llft_ring_wait_space(llft_ring_t *r, uint64_t pos, uint32_t n, uint64_t *cached_tail, int timeout_ms);
void     llft_ring_commit(void *slot, uint64_t pos);
void     llft_ring_doorbell(llft_ring_t *r);
long     llft_ring_write(llft_ring_t *r, const void *slots, long n, int timeout_ms);
int      llft_ring_write_end(llft_ring_t *r, int status, int timeout_ms);
int      llft_ring_write_control(llft_ring_t *r, int op, int ret, int timeout_ms);

/* Consumer side. */
long     llft_ring_read(llft_ring_t *r, void *out, long max_slots);
int      llft_ring_wait_data(llft_ring_t *r, int timeout_ms);
void     llft_ring_wake(llft_ring_t *r);
void     llft_ring_release(llft_ring_t *r, uint64_t new_tail);
uint64_t llft_ring_head(const llft_ring_t *r);
uint64_t llft_ring_tail(const llft_ring_t *r);
uint64_t llft_ring_error_pos(const llft_ring_t *r);

/* Futex helpers (shared, not private: both sides may be other processes). */
int      llft_futex_wait(uint32_t *addr, uint32_t expected, int timeout_ms);
void     llft_futex_wake(uint32_t *addr);
/* The same, with a bitset: a wake reaches only the waiters whose bits it shares. */
int      llft_futex_wait_bits(uint32_t *addr, uint32_t expected, int timeout_ms, uint32_t bits);
void     llft_futex_wake_bits(uint32_t *addr, int count, uint32_t bits);

#endif
