/*
 * The datapath's state and slots: its life, receive slots and the message
 * handles consumers hold, send slots, and the substrate's upcalls (what
 * arrives). datapath_send.c sends, datapath_receive.c hands messages to the
 * application; datapath_state.h is what the three share.
 */
#include "datapath_state.h"

#include <stdlib.h>
#include <string.h>

rt_datapath_t dp;

/* ---- Life ---------------------------------------------------------------------------- */

void rt_datapath_fini(void)
{
    free(dp.sends);
    free(dp.recvs);
    free(dp.refused_epoch);
    mr__ptrmap_fini(&dp.foreign);
    mr__deferq_fini(&dp.deferq);
    mr__pool_fini(&dp.recv_pool);
    mr__pool_fini(&dp.send_pool);
    memset(&dp, 0, sizeof(dp));
}

mr_status_t rt_datapath_init(void)
{
    mr_status_t status;

    memset(&dp, 0, sizeof(dp));
    status = mr__pool_init(&dp.send_pool, rt.cfg.send_slots, rt.cfg.datagram_size, rt.cfg.numa);
    if (status == MR_OK) {
        status = mr__pool_init(&dp.recv_pool, rt.cfg.recv_slots, rt.cfg.datagram_size,
                              rt.cfg.numa);
    }
    if (status == MR_OK) status = mr__deferq_init(&dp.deferq, rt.size, rt.cfg.send_slots);
    if (status == MR_OK) status = mr__ptrmap_init(&dp.foreign, rt.cfg.recv_slots);
    if (status == MR_OK) {
        dp.sends = calloc(rt.cfg.send_slots, sizeof(*dp.sends));
        dp.recvs = calloc(rt.cfg.recv_slots, sizeof(*dp.recvs));
        dp.refused_epoch = calloc((size_t)rt.size, sizeof(*dp.refused_epoch));
        if (!dp.sends || !dp.recvs || !dp.refused_epoch) {
            mr_error("Cannot allocate the slot tables.");
            status = MR_ERR_NO_MEMORY;
        }
    }
    if (status != MR_OK) {
        rt_datapath_fini();
        return status;
    }
    dp.arrivals = RT_MSGQ_INIT;
    dp.progress_epoch = 1; /* refused_epoch starts at 0: nobody has refused yet. */
    return MR_OK;
}

void rt_datapath_attach(uint64_t recv_bound, uint64_t (*held)(mr_substrate_t *s))
{
    dp.recv_bound = recv_bound;
    dp.sub_held = held;
}

void rt_datapath_consume(unsigned kind, const rt_consumer_t *consumer)
{
    if (kind != MR_KIND_DATA && kind < sizeof(dp.consumers) / sizeof(dp.consumers[0])) {
        dp.consumers[kind] = consumer;
    }
}

bool rt_datapath_sends_pending(void)
{
    return dp.deferq.depth > 0 || dp.inflight > 0;
}

void rt_datapath_drop_deferred(int rank)
{
    for (uint32_t idx; (idx = mr__deferq_pop(&dp.deferq, rank)) != MR_NIL;) rt_send_free(idx);
}

void rt_datapath_stats(mr_stats_t *snapshot)
{
    snapshot->peak_deferred_depth = dp.deferq.peak_depth;
    snapshot->deferred_now = dp.deferq.depth;
    snapshot->recv_slots_in_use = mr__pool_in_use(&dp.recv_pool);
    snapshot->recv_granted = dp.recv_bound != 0 ? dp.recv_bound : rt.cfg.recv_slots;
    snapshot->recv_inflight = snapshot->recv_slots_in_use + dp.held;
}

/* ---- Receive slots and the arrival queue --------------------------------------------- */

uint32_t dp_recv_take(void)
{
    uint32_t idx = mr__pool_get(&dp.recv_pool);
    size_t in_use;

    if (idx == MR_NIL) {
        dp.slot_refused = true; /* The substrate may hold the message now (rt_progress). */
        return MR_NIL;
    }
    in_use = mr__pool_in_use(&dp.recv_pool);
    if (in_use > rt.stats.peak_recv_slots_in_use) rt.stats.peak_recv_slots_in_use = in_use;
    if (dp.recvs[idx].foreign != NULL) {
        /* The slot stands for something else now: forget its old buffer. */
        if (mr__ptrmap_get(&dp.foreign, dp.recvs[idx].foreign) == idx) {
            mr__ptrmap_del(&dp.foreign, dp.recvs[idx].foreign);
        }
        dp.recvs[idx].foreign = NULL;
    }
    dp.recvs[idx].state = RECV_FILLING;
    dp.recvs[idx].data = mr__pool_slot(&dp.recv_pool, idx);
    dp.recvs[idx].handle = NULL;
    return idx;
}

static void rt_recv_free(uint32_t idx)
{
    dp.recvs[idx].state = RECV_FREE;
    mr__pool_put(&dp.recv_pool, idx);
}

void rt_msgq_push(rt_msgq_t *q, rt_msg_t msg)
{
    dp_msgq_push(q, msg);
}

rt_msg_t rt_msgq_pop(rt_msgq_t *q)
{
    return dp_msgq_pop(q);
}

void dp_recv_release(uint32_t idx)
{
    rt_recv_t *r = &dp.recvs[idx];

    if (r->handle != NULL) {
        rt.substrate->release_recv(rt.sub, r->handle);
        r->handle = NULL;
    }
    rt_recv_free(idx);
    rt.flowctl->on_release(rt.fc, r->source);
}

const uint8_t *rt_msg_data(rt_msg_t msg)
{
    return msg & RT_MSG_LOCAL ? mr__pool_slot(&dp.send_pool, msg & ~RT_MSG_LOCAL)
                              : dp.recvs[msg].data;
}

size_t rt_msg_length(rt_msg_t msg)
{
    return msg & RT_MSG_LOCAL ? dp.sends[msg & ~RT_MSG_LOCAL].length : dp.recvs[msg].length;
}

int rt_msg_source(rt_msg_t msg)
{
    return msg & RT_MSG_LOCAL ? rt.rank : dp.recvs[msg].source;
}

void rt_msg_drop(rt_msg_t msg)
{
    if (msg & RT_MSG_LOCAL) rt_send_free(msg & ~RT_MSG_LOCAL);
    else dp_recv_release(msg);
}

void rt_msg_consumed(rt_msg_t msg)
{
    rt.stats.messages_received++;
    rt.stats.bytes_received += rt_msg_length(msg);
    rt_msg_drop(msg);
}

uint64_t rt_datapath_drop_arrivals(void)
{
    uint64_t dropped = 0;

    for (rt_msg_t msg; (msg = dp_msgq_pop(&dp.arrivals)) != MR_NIL; dropped++) dp_recv_release(msg);
    return dropped;
}

void rt_datapath_release_held(void)
{
    for (size_t i = 0; i < rt.cfg.recv_slots; i++) {
        if (dp.recvs[i].state == RECV_HELD) dp_recv_release((uint32_t)i);
    }
}

/* ---- Upcalls from the substrate ------------------------------------------------------- */

static void *up_recv_slot_acquire(void *core)
{
    (void)core;
    uint32_t idx = dp_recv_take();
    return idx == MR_NIL ? NULL : dp.recvs[idx].data;
}

static void up_recv_slot_abandon(void *core, void *slot)
{
    (void)core;
    uint32_t idx = mr__pool_index(&dp.recv_pool, slot);
    if (idx != MR_NIL && dp.recvs[idx].state == RECV_FILLING) {
        rt_recv_free(idx);
        return;
    }
    rt.stats.breach_unacquired++;
    mr_error("internal: substrate %s gave back a receive slot it did not acquire.",
             rt.substrate->name);
}

/* A datagram in receive slot `idx` arrived: charge its credit, queue it or hand it over. */
static mr_status_t rt_arrived(uint32_t idx, int source, unsigned kind, uint32_t imm,
                              size_t length)
{
    rt_recv_t *r = &dp.recvs[idx];

    /* The credit was spent whatever the datagram holds. */
    r->source = source;
    r->length = (uint32_t)length;
    rt.flowctl->on_arrival(rt.fc, source, imm);
    if (kind == MR_KIND_DATA) {
        r->state = RECV_QUEUED;
        dp_msgq_push(&dp.arrivals, idx);
    } else if (kind < sizeof(dp.consumers) / sizeof(dp.consumers[0]) &&
               dp.consumers[kind] != NULL) {
        r->state = RECV_CONSUMER;
        dp.consumers[kind]->arrived(idx, r->data, length, source);
    } else {
        mr_error("Rank %d sent a message of unknown kind %u; it is dropped.", source, kind);
        dp_recv_release(idx);
    }
    return MR_OK;
}

static mr_status_t up_deliver(void *core, int source, unsigned kind, uint32_t imm, void *data,
                              size_t length, void *handle)
{
    uint32_t idx;

    (void)core;
    if (handle == NULL) {
        idx = mr__pool_index(&dp.recv_pool, data);
        if (idx == MR_NIL || dp.recvs[idx].state != RECV_FILLING) {
            rt.stats.breach_unacquired++;
            mr_error("internal: substrate %s delivered a buffer it did not acquire.",
                     rt.substrate->name);
            return MR_ERR_INVALID_BUFFER;
        }
    } else {
        idx = dp_recv_take();
        if (idx == MR_NIL) return MR_AGAIN;
        dp.recvs[idx].data = data;
        dp.recvs[idx].handle = handle;
        dp.recvs[idx].foreign = data;
        mr__ptrmap_put(&dp.foreign, data, idx);
    }
    return rt_arrived(idx, source, kind, imm, length);
}

static mr_status_t up_deliver_copy(void *core, int source, unsigned kind, uint32_t imm,
                                   const void *data, size_t length)
{
    uint32_t idx = dp_recv_take();

    (void)core;
    if (idx == MR_NIL) return MR_AGAIN;
    if (length > 0) memcpy(dp.recvs[idx].data, data, length);
    return rt_arrived(idx, source, kind, imm, length);
}

uint8_t *rt_send_buffer(uint32_t slot)
{
    return mr__pool_slot(&dp.send_pool, slot);
}

uint32_t rt_send_take(void)
{
    bool full = rt.cfg.send_bytes != 0 && dp.pending_bytes >= rt.cfg.send_bytes;
    uint32_t idx = full ? MR_NIL : mr__pool_get(&dp.send_pool);

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

static void up_send_complete(void *core, void *cookie)
{
    (void)core;
    dp.inflight--;
    rt_send_free((uint32_t)((rt_send_t *)cookie - dp.sends));
}

static void up_control(void *core, int source, uint32_t imm)
{
    (void)core;
    if (rt_is_notice(imm)) {
        rt_notice_arrived(source, imm);
        return;
    }
    rt.stats.credit_returns_received++;
    rt.flowctl->on_control(rt.fc, source, imm);
}

static void up_peer_failed(void *core, int rank, mr_status_t why)
{
    (void)core;
    rt_peer_down(rank, why, -1);
}

const mr_substrate_upcalls_t rt_upcalls = {
    .recv_slot_acquire = up_recv_slot_acquire,
    .recv_slot_abandon = up_recv_slot_abandon,
    .deliver = up_deliver,
    .deliver_copy = up_deliver_copy,
    .send_complete = up_send_complete,
    .control = up_control,
    .peer_failed = up_peer_failed,
};

mr_status_t rt_send_control(void *core, int dest, uint32_t imm)
{
    (void)core;
    mr_status_t status = rt.substrate->send_control(rt.sub, dest, imm);
    if (status == MR_OK) rt.stats.credit_returns_sent++;
    return status;
}

