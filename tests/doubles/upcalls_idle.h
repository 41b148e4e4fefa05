/*
 * Upcalls for tests that drive a substrate without the core and expect no
 * data: every message is taken and dropped, a handler's message is sent the
 * usual way, no slot is ever handed out. A test defines the upcalls it
 * checks (send_complete, control, peer_failed) and takes the rest from here.
 */
#ifndef MR_TEST_UPCALLS_IDLE_H
#define MR_TEST_UPCALLS_IDLE_H

#include "mr_substrate.h"

static inline void *idle_slot_acquire(void *core)
{
    (void)core;
    return NULL;
}

static inline void idle_slot_abandon(void *core, void *slot)
{
    (void)core, (void)slot;
}

static inline mr_status_t idle_deliver(void *core, int source, unsigned kind, uint32_t imm,
                                       void *data, size_t length, void *handle)
{
    (void)core, (void)source, (void)kind, (void)imm, (void)data, (void)length, (void)handle;
    return MR_OK;
}

static inline mr_status_t idle_deliver_copy(void *core, int source, unsigned kind, uint32_t imm,
                                            const void *data, size_t length)
{
    (void)core, (void)source, (void)kind, (void)imm, (void)data, (void)length;
    return MR_OK;
}

static inline mr_status_t idle_handler_now(void *core, int source, uint32_t imm, unsigned id,
                                           const void *data, size_t length)
{
    (void)core, (void)source, (void)imm, (void)id, (void)data, (void)length;
    return MR_AGAIN;
}

static inline unsigned idle_now_frames(void *core, int source, const void *frames, size_t length,
                                       size_t *consumed)
{
    (void)core, (void)source, (void)frames, (void)length;
    *consumed = 0;
    return 0;
}

#endif /* MR_TEST_UPCALLS_IDLE_H */
