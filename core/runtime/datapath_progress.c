/*
 * Progress: the substrate's progress, then flow control's, the notices of
 * failures, the deferred queue's drain (each destination's messages, oldest
 * first, their credits taken together), and the consumers'.
 */
#include "datapath_state.h"
#include "mr_time.h"

#include <string.h>

/*
 * After a drain left messages to `dest` deferred: when none has left for
 * MAILRAIL_TIMEOUT (no credit came from it, or its substrate took nothing)
 * and nothing at all came from `dest` meanwhile, it is stopped, stuck
 * outside MailRail or lost; a live peer keeps returning credits and taking
 * data as it receives, and a live peer that sends is heard (dp.heard).
 * It has failed, as a peer that never answers a dial has: its messages are
 * dropped and every rank hears of it. The clock starts at the first drain
 * that leaves messages behind, so that deferring costs no clock read.
 */
static __attribute__((noinline)) void rt_deferred_overdue(int dest)
{
    uint64_t now = mr__now_ns(), since = dp.defer_since[dest];

    if (rt.cfg.timeout_s == 0) return;
    if (since == 0 || dp.heard[dest] != dp.defer_heard[dest]) {
        /* The clock starts, or starts again: `dest` was heard from, so it is alive. */
        dp.defer_since[dest] = now;
        dp.defer_heard[dest] = dp.heard[dest];
        return;
    }
    if (now - since < rt.cfg.timeout_s * MR_NS_PER_S) return;
    mr_error("Rank %d took none of the %u messages waiting for it, and sent nothing, for %u s "
             "(MAILRAIL_TIMEOUT): it is stalled or lost.",
             dest, (unsigned)dp.deferq.queued[dest], (unsigned)rt.cfg.timeout_s);
    dp.defer_since[dest] = 0;
    rt_peer_down(dest, MR_ERR_TIMEOUT, -1);
}

/*
 * Sends the substrate took and never completes. A substrate may queue sends
 * itself (UCX does while a receiver's shared-memory FIFO is full, TCP once
 * the socket's buffers are full), so that nothing waits in the deferred
 * queue for the rule above to see, and the application may go on with other
 * ranks meanwhile. Every half MAILRAIL_TIMEOUT while sends are in flight, a
 * sweep stamps each send in flight that it sees for the first time with its
 * number. A send that two sweeps later is still in flight has been so for at
 * least the timeout; when nothing at all came from its destination since
 * the sweep before last (the timeout, too), that rank has failed, as above,
 * and the substrate gives its sends' buffers back (abandon()). Called by
 * progress (once in 256 calls) and by mr_wait() before it sleeps: neither
 * reads the clock for it otherwise.
 */
void rt_inflight_sweep(uint64_t now)
{
    uint32_t *before;
    uint16_t no;

    if (rt.cfg.timeout_s == 0 || now < dp.sweep_at) return;
    dp.sweep_at = now + (uint64_t)rt.cfg.timeout_s * MR_NS_PER_S / 2;
    no = ++dp.sweep_no;
    if (no == 0) no = ++dp.sweep_no; /* 0 marks a send no sweep saw. */
    before = dp.sweep_heard[no & 1]; /* The counts of the sweep before last. */
    for (uint32_t i = 0; i < rt.cfg.send_slots; i++) {
        rt_send_t *s = &dp.sends[i];
        int dest = s->dest;
        uint32_t n = 0;

        if (s->state != SEND_INFLIGHT) continue;
        if (s->swept == 0) {
            s->swept = no;
            continue;
        }
        if ((uint16_t)(no - s->swept) < 2 || rt.peer[dest] != PEER_OK ||
            dp.heard[dest] != before[dest]) {
            continue;
        }
        /* `i` is the first of its sends: count them all from here. */
        for (uint32_t j = i; j < rt.cfg.send_slots; j++) {
            n += dp.sends[j].state == SEND_INFLIGHT && dp.sends[j].dest == dest;
        }
        mr_error("Rank %d completed none of the %u sends in flight to it for %u s, and sent "
                 "nothing (MAILRAIL_TIMEOUT): it is stalled or lost.",
                 dest, (unsigned)n, (unsigned)rt.cfg.timeout_s);
        rt_peer_down(dest, MR_ERR_TIMEOUT, -1);
    }
    memcpy(before, dp.heard, (size_t)rt.size * sizeof(*dp.heard));
}

/*
 * Sends the messages deferred to `dest`, oldest first, while they go, their
 * credits taken together when flow control can (acquire_n). Returns how many
 * were sent; clears *all_refused when the first that stays waits for credit
 * that may come any time, not for the next progress call.
 */
static int rt_drain_dest(int dest, bool *all_refused)
{
    int sent = 0;

    while (mr__deferq_peek(&dp.deferq, dest) != MR_NIL) {
        uint32_t imm = 0, n = 1;

        /* The substrate refused this rank since the last progress call: it would again. */
        if (dp.refused_epoch[dest] == dp.progress_epoch) return sent;
        if (dp.acquire_n != NULL) {
            n = dp.acquire_n(dp.fc, dest, dp.deferq.queued[dest], &imm);
        } else if (dp.acquire != NULL) {
            n = dp.acquire(dp.fc, dest, &imm) ? 1 : 0;
        }
        if (n == 0) {
            rt_no_credit(dest);
            if (dp.refused_epoch[dest] != dp.progress_epoch) *all_refused = false;
            return sent;
        }
        /* Each message its credit, `imm` on the first: n <= the messages queued. */
        for (; n > 0; n--, imm = 0) {
            uint32_t idx = mr__deferq_peek(&dp.deferq, dest);
            if (__builtin_expect(idx == MR_NIL, 0)) {
                /* Emptied meanwhile (nothing does that today): the credits go back. */
                for (; n > 0; n--, imm = 0) rt.flowctl->unacquire(rt.fc, dest, imm);
                return sent;
            }
            mr_status_t status = rt_transmit_credited(idx, imm);

            if (status == MR_OK) {
                mr__deferq_pop(&dp.deferq, dest);
                dp.defer_since[dest] = 0;
                sent++;
            } else if (status < 0) {
                /* The substrate refused for good (peer failure): drop the message. */
                mr__deferq_pop(&dp.deferq, dest);
                rt_send_free(idx);
            } else {
                /* Refused (its credit went back, and so do the others'): until progress. */
                while (--n > 0) rt.flowctl->unacquire(rt.fc, dest, 0);
                if (dp.refused_epoch[dest] != dp.progress_epoch) *all_refused = false;
                return sent;
            }
        }
    }
    return sent;
}

/*
 * Visits every destination with deferred messages, sending its messages,
 * oldest first, while it takes them, and repeats while that moved something
 * (the paper's deferred queue tries on every send; this empties what can go).
 * Returns the number of messages that left the queue.
 */
int rt_drain(void)
{
    int moved = 0, pass;

    do {
        int count = dp.deferq.ring_count;
        int dest = mr__deferq_first(&dp.deferq);
        bool all_refused = true;

        pass = 0;
        for (int i = 0; i < count && dest >= 0; i++) {
            int next = mr__deferq_next(&dp.deferq, dest);

            pass += rt_drain_dest(dest, &all_refused);
            if (mr__deferq_peek(&dp.deferq, dest) != MR_NIL) rt_deferred_overdue(dest);
            dest = next;
        }
        moved += pass;
        /* Only progress can change the substrate's mind: no use trying before it. */
        if (pass == 0 && all_refused) dp.drain_stuck_epoch = dp.progress_epoch;
    } while (pass > 0 && dp.deferq.depth > 0);
    return moved;
}

int rt_progress(int timeout_ms)
{
    uint64_t before = dp_recv_messages();
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
    if (dp.deferq.depth > 0) events += rt_drain();
    if (dp.inflight > 0 && (dp.progress_epoch & 255) == 0) rt_inflight_sweep(mr__now_ns());
    for (int k = 0; k < dp.nconsumer_progress; k++) events += dp.consumer_progress[k]();
    return events;
}
