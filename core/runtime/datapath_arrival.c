/*
 * Arrival: the receive slots, batches as they arrive, and the substrate's
 * upcalls (a datagram delivered into a slot or copied into one, a handler's
 * message taken at once, a send completed, a credit return, a peer failure).
 * Flow control hears of each arrival here; datapath_receive.c hands the
 * arrivals to the application and takes them back.
 */
#include "datapath_state.h"

#include <string.h>

/* ---- Receive slots and the arrival queue --------------------------------------------- */

static void dp_foreign_forget(uint32_t idx, const void *foreign)
{
    uint32_t b = dp_region_index(foreign);

    if (b == MR_NIL) {
        mr__ptrmap_del_if(&dp.foreign, foreign, idx);
    } else if (dp.region_slot[b] == idx) {
        dp.region_slot[b] = MR_NIL;
    }
}

uint32_t rt_recv_take(void)
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
        dp_foreign_forget(idx, dp.recvs[idx].foreign);
        dp.recvs[idx].foreign = NULL;
    }
    dp.recvs[idx].state = RECV_FILLING;
    dp.recvs[idx].data = mr__pool_slot(&dp.recv_pool, idx);
    dp.recvs[idx].handle = NULL;
    return idx;
}

void rt_recv_free(uint32_t idx)
{
    dp.recvs[idx].state = RECV_FREE;
    mr__pool_put(&dp.recv_pool, idx);
}

void dp_recv_release(uint32_t idx)
{
    rt_recv_t *r = &dp.recvs[idx];

    if (r->handle != NULL) {
        rt.substrate->release_recv(rt.sub, r->handle);
        r->handle = NULL;
    }
    rt_recv_free(idx);
    dp_fc_release(r->source);
}

/* ---- Batches of data frames (MR_KIND_BATCH) ------------------------------------------ */

/*
 * A batch arrived in receive slot `idx` (rt_arrived() charged one credit):
 * checks that its frames are data and add up, charges a credit for each of
 * the others, and queues it for mr_receive(), which hands out its frames.
 */
static void dp_batch_arrived(uint32_t idx, int source)
{
    rt_recv_t *r = &dp.recvs[idx];
    const uint8_t *p = r->data;
    size_t off = 0, length = r->length;
    uint32_t n = 0;

    while (r->handle == NULL && off < length && n < UINT16_MAX) {
        uint32_t hdr = 0;
        size_t size = mr_frame_read(p + off, length - off, &hdr);
        /* Data frames only, no mark in the second word, and the padding in the batch. */
        if (size == 0 || (hdr & MR_FRAME_KIND_BITS) != 0) break;
        off += size;
        n++;
    }
    if (off != length || n == 0) {
        mr_error("Rank %d sent a malformed batch of %zu bytes; it is dropped.", source, length);
        dp_recv_release(idx);
        return;
    }
    if (dp.on_arrival != NULL) {
        for (uint32_t i = 1; i < n; i++) dp.on_arrival(dp.fc, source, 0);
    }
    r->state = RECV_BATCH;
    r->frames_left = (uint16_t)n;
    r->frames_held = 0;
    r->cursor = 0;
    /* Each frame is a message in flight: the slot counts one, the others count here. */
    dp.batch_frames += n - 1;
    dp_recvq_push(&dp.arrivals, idx);
}

uint32_t dp_batch_drop(uint32_t idx)
{
    rt_recv_t *r = &dp.recvs[idx];
    uint32_t left = r->frames_left;

    for (uint32_t i = left + r->frames_held; i-- > 0;) dp_fc_release(r->source);
    if (left + r->frames_held > 0) dp.batch_frames -= left + r->frames_held - 1u;
    r->frames_left = 0;
    r->frames_held = 0;
    rt_recv_free(idx);
    return left;
}

/*
 * Counts what arrived since `before` messages were in flight to this rank:
 * a new peak, and arrivals beyond what flow control granted. Messages only
 * arrive in progress (and to oneself), so its end sees every peak.
 */
void rt_inflight_grew(uint64_t before)
{
    uint64_t now = dp_recv_messages();

    if (now <= before) return;
    if (now > rt.stats.peak_recv_inflight) rt.stats.peak_recv_inflight = now;
    if (dp.recv_bound != 0 && now > dp.recv_bound) {
        rt.stats.breach_beyond_grant += now - (before > dp.recv_bound ? before : dp.recv_bound);
    }
}

/* ---- Upcalls from the substrate ------------------------------------------------------- */

static void *up_recv_slot_acquire(void *core)
{
    (void)core;
    uint32_t idx = rt_recv_take();
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

/* rt_arrived() of anything but a single data message, out of line. */
static __attribute__((noinline)) mr_status_t rt_arrived_other(uint32_t idx, int source,
                                                              unsigned kind, uint32_t imm,
                                                              size_t length)
{
    rt_recv_t *r = &dp.recvs[idx];

    /* The credit was spent whatever the datagram holds. */
    dp_fc_arrival(source, imm);
    if (kind == MR_KIND_BATCH) {
        dp_batch_arrived(idx, source);
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

/* A datagram in receive slot `idx` arrived: charge its credit, queue it or hand it over. */
static inline mr_status_t rt_arrived(uint32_t idx, int source, unsigned kind, uint32_t imm,
                                     size_t length)
{
    rt_recv_t *r = &dp.recvs[idx];

    r->source = source;
    r->length = (uint32_t)length;
    dp.heard[source]++;
    if (__builtin_expect(kind != MR_KIND_DATA, 0)) {
        return rt_arrived_other(idx, source, kind, imm, length);
    }
    r->state = RECV_QUEUED;
    dp_recvq_push(&dp.arrivals, idx);
    /* Last, with nothing kept across the call: its credit was spent. */
    dp_fc_arrival(source, imm);
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
        idx = rt_recv_take();
        if (idx == MR_NIL) return MR_AGAIN;
        dp.recvs[idx].data = data;
        dp.recvs[idx].handle = handle;
        dp.recvs[idx].foreign = data;
        uint32_t b = dp_region_index(data);
        if (b != MR_NIL) {
            dp.region_slot[b] = idx;
        } else {
            mr__ptrmap_put(&dp.foreign, data, idx);
        }
    }
    return rt_arrived(idx, source, kind, imm, length);
}

/* A handler's message that its consumer may take at once, without a slot. */
static mr_status_t up_deliver_handler_now(void *core, int source, uint32_t imm, unsigned id,
                                          const void *data, size_t length)
{
    const rt_consumer_t *c = dp.consumers[MR_KIND_HANDLER];

    (void)core;
    if (c == NULL || c->now == NULL || c->now(id, data, length, source) != MR_OK) {
        return MR_AGAIN;
    }
    /* Its credit was spent and comes back at once, as if a slot had been taken and freed. */
    dp.heard[source]++;
    dp_fc_arrival(source, imm);
    dp_fc_release(source);
    return MR_OK;
}

/* deliver_handler_now() of a batch's handler frames, as many as go. */
static unsigned up_deliver_now_frames(void *core, int source, const void *frames, size_t length,
                                      size_t *consumed)
{
    const rt_consumer_t *c = dp.consumers[MR_KIND_HANDLER];
    unsigned n;

    (void)core;
    *consumed = 0;
    if (c == NULL || c->now_frames == NULL) return 0;
    n = c->now_frames(frames, length, source, consumed);
    dp.heard[source] += n;
    /* Each spent a credit, which comes back at once (up_deliver_handler_now()). */
    for (unsigned i = 0; dp.on_arrival != NULL && i < n; i++) {
        dp.on_arrival(dp.fc, source, 0);
        dp.on_release(dp.fc, source);
    }
    return n;
}

static mr_status_t up_deliver_copy(void *core, int source, unsigned kind, uint32_t imm,
                                   const void *data, size_t length)
{
    uint32_t idx = rt_recv_take();

    (void)core;
    if (idx == MR_NIL) return MR_AGAIN;
    if (length > 0) memcpy(dp.recvs[idx].data, data, length);
    return rt_arrived(idx, source, kind, imm, length);
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
    dp.heard[source]++;
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
    .deliver_now_frames = up_deliver_now_frames,
    .deliver_handler_now = up_deliver_handler_now,
};

mr_status_t rt_send_control(void *core, int dest, uint32_t imm)
{
    (void)core;
    mr_status_t status = rt.substrate->send_control(rt.sub, dest, imm);
    if (status == MR_OK) rt.stats.credit_returns_sent++;
    return status;
}

uint32_t rt_deferred_to(void *core, int dest)
{
    (void)core;
    return dp.deferq.queued[dest];
}
