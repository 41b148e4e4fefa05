/*
 * The datapath's send side: transmitting through flow control, the deferred
 * queue and its drain, progress, and mr_reserve() and mr_send().
 */
#include "datapath_state.h"

#include <string.h>

/*
 * Counts what arrived since `before` messages were in flight to this rank:
 * a new peak, and arrivals beyond what flow control granted. Messages only
 * arrive in progress (and to oneself), so its end sees every peak.
 */
static void rt_inflight_grew(uint64_t before)
{
    uint64_t now = mr__pool_in_use(&dp.recv_pool) + dp.held;

    if (now <= before) return;
    if (now > rt.stats.peak_recv_inflight) rt.stats.peak_recv_inflight = now;
    if (dp.recv_bound != 0 && now > dp.recv_bound) {
        rt.stats.breach_beyond_grant += now - (before > dp.recv_bound ? before : dp.recv_bound);
    }
}

/* Copies a message to oneself into a receive slot. */
static mr_status_t rt_deliver_self(uint32_t idx)
{
    uint64_t before = mr__pool_in_use(&dp.recv_pool) + dp.held;
    uint32_t r = dp_recv_take();

    if (r == MR_NIL) return MR_AGAIN;
    rt_inflight_grew(before);
    memcpy(dp.recvs[r].data, mr__pool_slot(&dp.send_pool, idx), dp.sends[idx].length);
    dp.recvs[r].state = RECV_QUEUED;
    dp.recvs[r].source = rt.rank;
    dp.recvs[r].length = dp.sends[idx].length;
    dp_msgq_push(&dp.arrivals, r);
    rt_send_free(idx);
    return MR_OK;
}

/*
 * Hands a message to the substrate, or to oneself, if flow control grants a
 * credit. Messages to oneself take a credit too, since they take a receive
 * slot that flow control may have promised to a peer. Inlined: it is most
 * of every send.
 */
__attribute__((always_inline)) static inline mr_status_t rt_transmit(uint32_t idx)
{
    rt_send_t *s = &dp.sends[idx];
    int dest = s->dest;
    uint32_t imm;
    mr_status_t status;

    /* The substrate refused this rank since the last progress call: it would again. */
    if (dp.refused_epoch[dest] == dp.progress_epoch) return MR_AGAIN;
    if (!rt.flowctl->acquire(rt.fc, dest, &imm)) return MR_AGAIN;
    if (dest == rt.rank) {
        status = rt_deliver_self(idx);
    } else {
        status = rt.substrate->send(rt.sub, dest, s->kind, imm,
                                    mr__pool_slot(&dp.send_pool, idx), s->length, s);
        if (status == MR_OK) {
            if (s->state != SEND_DEFERRED) dp.pending_bytes += s->length;
            s->state = SEND_INFLIGHT;
            dp.inflight++;
        } else if (status == MR_SUBSTRATE_SENT) {
            /* Already copied out: the slot is free again, warm for the next reserve. */
            rt_send_free(idx);
            status = MR_OK;
        }
    }
    if (status != MR_OK) {
        rt.flowctl->unacquire(rt.fc, dest, imm);
        if (status == MR_AGAIN && dest != rt.rank) dp.refused_epoch[dest] = dp.progress_epoch;
    }
    return status;
}

/*
 * Visits every destination with deferred messages once, sending the oldest
 * message of each that can take one, as the paper's deferred queue does on
 * every send. With `until_stuck`, repeats while that moved something.
 * Returns the number of messages that left the queue.
 */
int dp_drain(bool until_stuck)
{
    int moved = 0, pass;

    do {
        int count = dp.deferq.ring_count;
        int dest = mr__deferq_first(&dp.deferq);
        bool all_refused = true;

        pass = 0;
        for (int i = 0; i < count && dest >= 0; i++) {
            int next = mr__deferq_next(&dp.deferq, dest);
            uint32_t idx = mr__deferq_peek(&dp.deferq, dest);
            mr_status_t status = rt_transmit(idx);

            if (status == MR_OK) {
                mr__deferq_pop(&dp.deferq, dest);
                pass++;
            } else if (status < 0) {
                /* The substrate refused for good (peer failure): drop the message. */
                mr__deferq_pop(&dp.deferq, dest);
                rt_send_free(idx);
            } else if (dp.refused_epoch[dest] != dp.progress_epoch) {
                all_refused = false; /* Waiting for credit, which may come any time. */
            }
            dest = next;
        }
        moved += pass;
        /* Only progress can change the substrate's mind: no use trying before it. */
        if (pass == 0 && all_refused) dp.drain_stuck_epoch = dp.progress_epoch;
    } while (until_stuck && pass > 0 && dp.deferq.depth > 0);
    return moved;
}

int rt_progress(int timeout_ms)
{
    uint64_t before = mr__pool_in_use(&dp.recv_pool) + dp.held;
    int events = rt.substrate->progress(rt.sub, timeout_ms);

    /* A substrate holds messages only once it found no slot: ask it only then, or while it holds. */
    if (dp.sub_held != NULL && (dp.slot_refused || dp.held != 0)) {
        dp.slot_refused = false;
        dp.held = dp.sub_held(rt.sub);
    }
    rt_inflight_grew(before);
    dp.progress_epoch++;
    if (events < 0) return events;
    events += rt.flowctl->progress(rt.fc);
    if (rt.notice_sent < rt.notice_count) events += rt_notices_forward();
    if (dp.deferq.depth > 0) events += dp_drain(true);
    return events;
}

mr_status_t mr_reserve(void **buffer)
{
    uint32_t idx;

    RT_CHECK_READY("mr_reserve()");
    if (buffer == NULL) {
        mr_error("mr_reserve(): the output pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    idx = rt_send_take();
    if (idx == MR_NIL) return MR_AGAIN;
    *buffer = mr__pool_slot(&dp.send_pool, idx);
    return MR_OK;
}

/* Finds the send slot of a buffer the application passes in, logging misuse. */
mr_status_t dp_reserved_slot(const char *fn, const void *buffer, uint32_t *out)
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

mr_status_t mr_send(void *buffer, size_t length, int dest)
{
    uint32_t idx;
    mr_status_t status;

    RT_CHECK_READY("mr_send()");
    if (dest < 0 || dest >= rt.size) {
        mr_error("mr_send(): destination %d is not in [0, %d).", dest, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    if (length > rt.cfg.datagram_size) {
        mr_error("mr_send(): length %zu exceeds the datagram size %zu (MAILRAIL_DATAGRAM_SIZE).",
                 length, (size_t)rt.cfg.datagram_size);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    status = dp_reserved_slot("mr_send()", buffer, &idx);
    if (status != MR_OK) return status;
    if (rt.peer[dest] != PEER_OK) {
        /* The failure itself was logged once, when it was detected. */
        return MR_ERR_PEER_FAILED;
    }
    return rt_submit(idx, length, dest, MR_KIND_DATA);
}

mr_status_t rt_submit(uint32_t idx, size_t length, int dest, unsigned kind)
{
    rt_send_t *s = &dp.sends[idx];
    mr_status_t status;

    s->dest = dest;
    s->length = (uint32_t)length;
    s->kind = (uint8_t)kind;

    /* Older deferred messages go first; a new one never overtakes them. */
    if (dp.deferq.depth > 0 && dp.drain_stuck_epoch != dp.progress_epoch) dp_drain(false);
    if (mr__deferq_peek(&dp.deferq, dest) == MR_NIL) {
        status = rt_transmit(idx);
        if (status < 0) {
            s->state = SEND_RESERVED;
            return status;
        }
    } else {
        status = MR_AGAIN;
    }
    if (status == MR_AGAIN) {
        /* Deferred for want of credit: the next send must look at the queue again. */
        if (dp.refused_epoch[dest] != dp.progress_epoch) dp.drain_stuck_epoch = 0;
        s->state = SEND_DEFERRED;
        dp.pending_bytes += length;
        mr__deferq_push(&dp.deferq, dest, idx);
        rt.stats.deferred_sends++;
    }
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length;
    return MR_OK;
}

void rt_submit_local(uint32_t slot, size_t length, unsigned kind)
{
    rt_send_t *s = &dp.sends[slot];

    s->state = SEND_LOCAL;
    s->kind = (uint8_t)kind;
    s->dest = rt.rank;
    s->length = (uint32_t)length;
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length;
    dp.consumers[kind]->arrived(slot | RT_MSG_LOCAL, mr__pool_slot(&dp.send_pool, slot), length,
                                rt.rank);
}
