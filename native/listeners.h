/* The program's listening ports in the control block (listeners.c): the
 * shim's threads publish and close them, the controller reads them. */
#ifndef LLFT_LISTENERS_H
#define LLFT_LISTENERS_H

#include "llft_abi.h"

/* 0, or -1 when every slot is taken. */
int llft_listener_publish(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t type, const uint8_t *addr);
void llft_listener_close(llft_ctl_t *c, uint16_t port, uint16_t family, uint32_t socktype);
/* A consistent copy of the listening slots of one type (SOCK_STREAM, or
 * SOCK_DGRAM with or without LLFT_LISTENER_ANY_PORT); returns how many. */
int llft_listeners_read(const llft_ctl_t *c, uint32_t type, llft_listener_t *out, int max);

#endif
