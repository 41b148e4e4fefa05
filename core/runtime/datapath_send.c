/*
 * Sending: the send slots, mr_reserve() and mr_send(), a message's way
 * through flow control into the substrate's append window or its send(), to
 * oneself, or into the deferred queue behind others (datapath_progress.c
 * drains it), and the copying sends of handlers and items. The common send
 * is one inlined path with no call but the copy.
 */
#include "datapath_state.h"

#include <string.h>

/* ---- Send slots ---------------------------------------------------------------------- */

uint8_t *rt_send_buffer(uint32_t slot)
{
    return mr__pool_slot(&dp.send_pool, slot);
}

uint32_t rt_send_slot(const uint8_t *buffer)
{
    return mr__pool_index(&dp.send_pool, buffer);
}

uint32_t rt_send_take(void)
{
    uint32_t idx = dp.pending_bytes >= dp.send_bytes ? MR_NIL : mr__pool_get(&dp.send_pool);

    dp.reserve_blocked = idx == MR_NIL;
    if (idx == MR_NIL) rt.stats.reserve_failures++;
    else dp.sends[idx].state = SEND_RESERVED;
    return idx;
}

void rt_send_free(uint32_t idx)
{
    if (dp.sends[idx].state == SEND_INFLIGHT || dp.sends[idx].state == SEND_DEFERRED) {
        dp.pending_bytes -= dp.sends[idx].length;
    }
    dp.sends[idx].state = SEND_FREE;
    mr__pool_put(&dp.send_pool, idx);
}

/* Copies a message to oneself into a receive slot. */
mr_status_t rt_deliver_self(uint32_t idx)
{
    uint64_t before = dp_recv_messages();
    uint32_t r = rt_recv_take();

    if (r == MR_NIL) return MR_AGAIN;
    rt_inflight_grew(before);
    rt_send_t *s = &dp.sends[idx];
    rt_recv_t *m = &dp.recvs[r];
    memcpy(m->data, mr__pool_slot(&dp.send_pool, idx), s->length);
    m->source = rt.rank;
    m->length = s->length;
    if (s->kind == MR_KIND_DATA) {
        m->state = RECV_QUEUED;
        dp_recvq_push(&dp.arrivals, r);
    } else {
        /* A handler's message to oneself (items to oneself take rt_submit_local()). */
        m->state = RECV_CONSUMER;
        dp.consumers[s->kind]->arrived(r, m->data, m->length, rt.rank);
    }
    rt_send_free(idx);
    return MR_OK;
}

/* ---- To the substrate ---------------------------------------------------------------- */

/*
 * No credit for `dest`: when flow control says none can come before the next
 * progress call, the core asks no more until then, as after a refusal.
 */
__attribute__((noinline)) mr_status_t rt_no_credit(int dest)
{
    if (rt.flowctl->waits_for_progress != NULL && rt.flowctl->waits_for_progress(rt.fc, dest)) {
        dp.refused_epoch[dest] = dp.progress_epoch;
    }
    return MR_AGAIN;
}

/*
 * The rest of rt_transmit(), out of line: a message in flight (the substrate
 * completes it later), or one not taken, whose credit goes back.
 */
__attribute__((noinline)) mr_status_t rt_transmit_rest(uint32_t idx, uint32_t imm,
                                                       mr_status_t status)
{
    rt_send_t *s = &dp.sends[idx];

    if (status == MR_OK) {
        /* Accepted, in flight until send_complete(). */
        if (s->state != SEND_DEFERRED) dp.pending_bytes += s->length;
        s->state = SEND_INFLIGHT;
        s->swept = 0;
        dp.inflight++;
        return MR_OK;
    }
    rt.flowctl->unacquire(rt.fc, s->dest, imm);
    if (status == MR_AGAIN && s->dest != rt.rank) dp.refused_epoch[s->dest] = dp.progress_epoch;
    return status;
}

/*
 * Hands the message in send slot `idx` on (rt_transmit_credited()) if flow
 * control grants a credit. Messages to oneself take a credit too, since they
 * take a receive slot that flow control may have promised to a peer.
 */
__attribute__((always_inline)) static inline mr_status_t rt_transmit(uint32_t idx)
{
    int dest = dp.sends[idx].dest;
    uint32_t imm = 0;

    /* The substrate refused this rank since the last progress call: it would again. */
    if (dp.refused_epoch[dest] == dp.progress_epoch) return MR_AGAIN;
    if (dp.acquire != NULL && !dp.acquire(dp.fc, dest, &imm)) return rt_no_credit(dest);
    return rt_transmit_credited(idx, imm);
}

/* ---- The public send path ------------------------------------------------------------ */

mr_status_t mr_reserve(void **buffer)
{
    uint32_t idx;

    RT_CHECK_SEND("mr_reserve()");
    if (buffer == NULL) {
        mr_error("mr_reserve(): the output pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    idx = rt_send_take();
    if (idx == MR_NIL) return MR_AGAIN;
    *buffer = mr__pool_slot(&dp.send_pool, idx);
    return MR_OK;
}

/*
 * Queues the message in send slot `idx` (its dest, kind and length set)
 * behind the others for `dest`, for want of credit or of the substrate's room.
 */
__attribute__((always_inline)) static inline mr_status_t rt_defer(uint32_t idx, int dest)
{
    rt_send_t *s = &dp.sends[idx];

    /* Unless the substrate refused `dest`, the next send must look at the queue again. */
    if (dp.refused_epoch[dest] != dp.progress_epoch) dp.drain_stuck_epoch = 0;
    s->state = SEND_DEFERRED;
    dp.pending_bytes += s->length;
    rt.stats.deferred_sends++;
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += s->length;
    mr__deferq_push(&dp.deferq, dest, idx); /* Last: its rare call is the function's end. */
    return MR_OK;
}

/*
 * rt_submit() when the message cannot leave at once: it waits behind others,
 * or for credit. Inline in its two callers, both out of line.
 */
__attribute__((always_inline)) static inline mr_status_t rt_submit_slow(uint32_t idx, int dest,
                                                                        mr_status_t status)
{
    rt_send_t *s = &dp.sends[idx];

    if (status == MR_AGAIN && dp.deferq.depth > 0) {
        /*
         * Older deferred messages go first; a new one never overtakes them.
         * All that can go now go, so that a queue does not outlive the
         * shortage that made it (a message behind it would queue too).
         */
        if (dp.drain_stuck_epoch != dp.progress_epoch) rt_drain();
        if (mr__deferq_peek(&dp.deferq, dest) == MR_NIL) status = rt_transmit(idx);
    }
    if (status < 0) {
        s->state = SEND_RESERVED;
        return status;
    }
    if (status == MR_AGAIN) return rt_defer(idx, dest);
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += s->length;
    return MR_OK;
}

/*
 * The rest of a send that did not go into a window at once, out of line: a
 * message that has its credit, with `imm`, or has none (!credited: it waits
 * behind others, or for credit).
 */
static __attribute__((noinline)) mr_status_t rt_submit_held(uint32_t idx, size_t length,
                                                            int dest, unsigned kind,
                                                            bool credited, uint32_t imm)
{
    rt_send_t *s = &dp.sends[idx];
    mr_status_t status = MR_AGAIN;

    s->dest = dest;
    s->length = (uint32_t)length;
    s->kind = (uint8_t)kind;
    if (credited) status = rt_transmit_credited(idx, imm);
    if (status == MR_OK) {
        rt.stats.messages_sent++;
        rt.stats.bytes_sent += length;
        return MR_OK;
    }
    return rt_submit_slow(idx, dest, status);
}

/*
 * Packs the message in send slot `idx` at `data`, which has its credit
 * without one to piggyback, into the batch the substrate fills for `dest`
 * when that takes it (ABI 6): the slot is free again at once. False when not.
 */
__attribute__((always_inline)) static inline bool rt_pack(uint32_t idx, const void *data,
                                                          size_t length, int dest, unsigned kind)
{
    uint8_t *payload;

    if (__builtin_expect(length > dp.win_max || dp.win == NULL, 0) ||
        (payload = mr_append_window_take(&dp.win[dest], kind, length)) == NULL) {
        return false;
    }
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length;
    rt_packed(idx, payload, data, length);
    return true;
}

/* Whether a message to `dest` must wait its turn: others are deferred, or the substrate refused. */
static inline bool rt_must_wait(int dest)
{
    return dp.deferq.depth != 0 || dp.refused_epoch[dest] == dp.progress_epoch;
}

/*
 * rt_submit() of the message in send slot `idx` at `data` when flow control
 * is unconstrained and nothing waits before it: no call on the common path
 * but the copy (rt_pack()), so inline in mr_send().
 */
__attribute__((always_inline)) static inline mr_status_t rt_submit_free(uint32_t idx, void *data,
                                                                        size_t length, int dest,
                                                                        unsigned kind)
{
    if (__builtin_expect(rt_pack(idx, data, length, dest, kind), 1)) return MR_OK;
    return rt_submit_held(idx, length, dest, kind, true, 0);
}

/*
 * rt_submit() of the message in send slot `idx` when it must wait its turn
 * (rt_must_wait()). A stream that outruns its credits waits on most
 * messages: when the last pass over the deferred queue found only refusals
 * and `dest` has messages queued, nothing can move before the next progress
 * call, and the message is queued at once, with no call.
 */
static __attribute__((noinline)) mr_status_t rt_submit_wait(uint32_t idx, size_t length,
                                                            int dest, unsigned kind)
{
    if (dp.drain_stuck_epoch == dp.progress_epoch &&
        mr__deferq_peek(&dp.deferq, dest) != MR_NIL) {
        rt_send_t *s = &dp.sends[idx];
        s->dest = dest;
        s->length = (uint32_t)length;
        s->kind = (uint8_t)kind;
        return rt_defer(idx, dest);
    }
    return rt_submit_held(idx, length, dest, kind, false, 0);
}

/* rt_submit() of the message in send slot `idx` at `data`, with a credit to take. */
static __attribute__((noinline)) mr_status_t rt_submit_credit(uint32_t idx, void *data,
                                                              size_t length, int dest,
                                                              unsigned kind)
{
    uint32_t imm = 0;

    if (!dp.acquire(dp.fc, dest, &imm)) {
        rt_no_credit(dest);
        return rt_submit_held(idx, length, dest, kind, false, 0);
    }
    if (__builtin_expect(imm == 0, 1) && rt_pack(idx, data, length, dest, kind)) return MR_OK;
    return rt_submit_held(idx, length, dest, kind, true, imm);
}

/* Finds the send slot of a buffer the application passes in, logging misuse. */
mr_status_t rt_reserved_slot(const char *fn, const void *buffer, uint32_t *out)
{
    uint32_t idx = mr__pool_index(&dp.send_pool, buffer);

    if (idx == MR_NIL) {
        mr_error("%s: %p is not a buffer from mr_reserve().", fn, buffer);
        return MR_ERR_INVALID_BUFFER;
    }
    if (dp.sends[idx].state != SEND_RESERVED) {
        mr_error("%s: send buffer %p is not reserved (already sent or released).", fn, buffer);
        return MR_ERR_BUFFER_STATE;
    }
    *out = idx;
    return MR_OK;
}

/*
 * What mr_send() and mr_send_handler() share: the checks, then the message
 * goes, with the handler's id as a last byte when `trailer` is not -1.
 * Inlined into both, so that mr_send() pays for no trailer.
 */
__attribute__((always_inline)) static inline mr_status_t
rt_send_checked(const char *fn, void *buffer, size_t length, int dest, unsigned kind, int trailer)
{
    uint32_t idx;
    mr_status_t status;

    if (dest < 0 || dest >= rt.size) {
        mr_error("%s: destination %d is not in [0, %d).", fn, dest, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    if (length > rt.cfg.datagram_size) {
        mr_error("%s: length %zu exceeds the datagram size %zu (MAILRAIL_DATAGRAM_SIZE).", fn,
                 length, (size_t)rt.cfg.datagram_size);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    status = rt_reserved_slot(fn, buffer, &idx);
    if (status != MR_OK) return status;
    if (rt.peer[dest] != PEER_OK) {
        /* The failure itself was logged once, when it was detected. */
        return MR_ERR_PEER_FAILED;
    }
    if (trailer >= 0) ((uint8_t *)buffer)[length++] = (uint8_t)trailer;
    if (__builtin_expect(rt_must_wait(dest), 0)) return rt_submit_wait(idx, length, dest, kind);
    if (dp.acquire == NULL) return rt_submit_free(idx, buffer, length, dest, kind);
    return rt_submit_credit(idx, buffer, length, dest, kind);
}

mr_status_t mr_send(void *buffer, size_t length, int dest)
{
    RT_CHECK_SEND("mr_send()");
    return rt_send_checked("mr_send()", buffer, length, dest, MR_KIND_DATA, -1);
}

mr_status_t rt_send_kind(const char *fn, void *buffer, size_t length, int dest, unsigned kind,
                         uint8_t trailer)
{
    return rt_send_checked(fn, buffer, length, dest, kind, trailer);
}

mr_status_t rt_submit(uint32_t idx, size_t length, int dest, unsigned kind)
{
    rt_send_t *s = &dp.sends[idx];
    mr_status_t status;

    s->dest = dest;
    s->length = (uint32_t)length;
    s->kind = (uint8_t)kind;
    if (__builtin_expect(dp.deferq.depth == 0, 1)) {
        status = rt_transmit(idx);
        if (__builtin_expect(status == MR_OK, 1)) {
            rt.stats.messages_sent++;
            rt.stats.bytes_sent += length;
            return MR_OK;
        }
    } else {
        status = MR_AGAIN; /* rt_submit_slow() looks at the queue. */
    }
    return rt_submit_slow(idx, dest, status);
}

/* rt_send_copy() into a send slot: the message goes as one sent from it would. */
static __attribute__((noinline)) mr_status_t rt_send_copy_slot(const void *data, size_t length,
                                                               int dest, unsigned kind,
                                                               uint8_t trailer, bool credited,
                                                               uint32_t imm)
{
    uint32_t idx = rt_send_take();

    if (idx == MR_NIL) {
        if (credited && dp.acquire != NULL) rt.flowctl->unacquire(rt.fc, dest, imm);
        return MR_AGAIN;
    }
    uint8_t *buffer = mr__pool_slot(&dp.send_pool, idx);
    if (length > 0) memcpy(buffer, data, length);
    buffer[length] = trailer;
    return rt_submit_held(idx, length + 1, dest, kind, credited, imm);
}

/*
 * rt_send_copy()'s common case: the batch the substrate fills for `dest`
 * takes the copy, `trailer` last (a credit with nothing to piggyback taken).
 */
__attribute__((always_inline)) static inline bool rt_pack_copy(const void *data, size_t length,
                                                               int dest, unsigned kind,
                                                               uint8_t trailer)
{
    uint8_t *payload;

    if (__builtin_expect(length + 1 > dp.win_max || dp.win == NULL, 0) ||
        (payload = mr_append_window_take(&dp.win[dest], kind, length + 1)) == NULL) {
        return false;
    }
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length + 1;
    payload[length] = trailer;
    if (length > 0) memcpy(payload, data, length); /* Last: nothing is kept across it. */
    return true;
}

/* rt_send_copy() with a credit to take, out of line. */
static __attribute__((noinline)) mr_status_t rt_send_copy_credit(const void *data, size_t length,
                                                                 int dest, unsigned kind,
                                                                 uint8_t trailer)
{
    uint32_t imm = 0;

    if (__builtin_expect(rt_must_wait(dest), 0)) {
        return rt_send_copy_slot(data, length, dest, kind, trailer, false, 0);
    }
    if (!dp.acquire(dp.fc, dest, &imm)) {
        rt_no_credit(dest);
        return rt_send_copy_slot(data, length, dest, kind, trailer, false, 0);
    }
    if (__builtin_expect(imm == 0, 1) && rt_pack_copy(data, length, dest, kind, trailer)) {
        return MR_OK;
    }
    return rt_send_copy_slot(data, length, dest, kind, trailer, true, imm);
}

mr_status_t rt_send_copy(const void *data, size_t length, int dest, unsigned kind,
                         uint8_t trailer)
{
    if (rt.peer[dest] != PEER_OK) return MR_ERR_PEER_FAILED; /* Logged when detected. */
    if (dp.acquire != NULL) return rt_send_copy_credit(data, length, dest, kind, trailer);
    /* Unconstrained: no call on the common path but the copy. */
    if (__builtin_expect(!rt_must_wait(dest), 1) &&
        rt_pack_copy(data, length, dest, kind, trailer)) {
        return MR_OK;
    }
    return rt_send_copy_slot(data, length, dest, kind, trailer, !rt_must_wait(dest), 0);
}
