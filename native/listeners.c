/* The program's listening ports in the control block: published and closed
 * by the shim's threads, read by the controller.
 *
 * Several threads bind at once (each lookup of a resolver binds a UDP
 * socket of its own), so a writer claims a slot (state 3) before it
 * writes it: two threads once wrote one free slot together and the
 * controller saw one port under the other's name, the other not at all.
 * The controller reads while threads write, so a reader keeps a copy only
 * if the slot was listening, with the same gen, before and after. */
#include "listeners.h"
#include "atomics.h"

#include <string.h>

_Static_assert(sizeof(llft_ctl_t) <= LLFT_CTL_BYTES, "the control block fits its page");

enum { FREE = 0, LISTENING = 1, CLOSED = 2, WRITING = 3 };

int llft_listener_publish(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t type, const uint8_t *addr)
{
    for (uint32_t i = 0; i < LLFT_MAX_LISTENERS; i++) {
        llft_listener_t *l = &c->listeners[i];
        uint32_t st = LOAD(&l->state, ACQ);
        if ((st != FREE && st != CLOSED) ||
            !__atomic_compare_exchange_n(&l->state, &st, WRITING, 0, ACQ, RLX))
            continue;
        STORE(&l->gen, LOAD(&l->gen, RLX) + 1, RLX);
        __atomic_thread_fence(REL); /* a reader that sees the old gen after the fields sees the new one */
        l->port = port;
        l->family = family;
        l->type = type;
        memcpy(l->addr, addr, sizeof l->addr);
        STORE(&l->state, LISTENING, REL);
        uint32_t n = LOAD(&c->nlisteners, RLX);
        while (n < i + 1 && !__atomic_compare_exchange_n(&c->nlisteners, &n, i + 1, 1, REL, RLX))
            ;
        return 0;
    }
    return -1;
}

void llft_listener_close(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t socktype)
{
    for (uint32_t i = 0; i < LLFT_MAX_LISTENERS; i++) {
        llft_listener_t *l = &c->listeners[i];
        uint32_t st = LISTENING;
        if (LOAD(&l->state, ACQ) == LISTENING && l->port == port && l->family == family &&
            (l->type & 0xff) == socktype)
            __atomic_compare_exchange_n(&l->state, &st, CLOSED, 0, REL, RLX);
    }
}

int llft_listeners_read(const llft_ctl_t *c, uint32_t type, llft_listener_t *out, int max)
{
    int n = 0;
    uint32_t slots = LOAD(&c->nlisteners, ACQ);
    for (uint32_t i = 0; i < slots && i < LLFT_MAX_LISTENERS && n < max; i++) {
        const llft_listener_t *l = &c->listeners[i];
        if (LOAD(&l->state, ACQ) != LISTENING)
            continue;
        uint32_t gen = LOAD(&l->gen, ACQ);
        llft_listener_t copy;
        memcpy(&copy, l, sizeof copy);
        __atomic_thread_fence(ACQ);
        if (LOAD(&l->state, RLX) != LISTENING || LOAD(&l->gen, RLX) != gen || copy.type != type)
            continue; /* rewritten meanwhile: the next look sees it whole */
        out[n++] = copy;
    }
    return n;
}
