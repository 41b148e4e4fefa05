/*
 * The hot path, in one file so that the compiler sees all of it: receive
 * and send slots, the substrate's upcalls, sending through flow control and
 * the deferred queue, progress, and the public data path (mr_reserve,
 * mr_send, mr_receive, mr_wait, mr_release). datapath_life.c allocates and
 * frees its state, datapath_consumers.c serves the layers that consume a
 * message kind (the item layer); datapath_state.h is what the three share.
 */
#include "datapath_state.h"
#include "mr_time.h"

#include <endian.h>
#include <sched.h>
#include <string.h>

rt_datapath_t dp;

/*
 * The second word of a batch's frame header (zero on the wire) once
 * mr_receive() handed the frame out, and once it was released: high bits
 * that no offset has, and the frame's offset in its slot, so that
 * mr_release() knows a frame it handed out from any other pointer.
 */
#define DP_FRAME_HELD UINT32_C(0xE0000000)
#define DP_FRAME_RELEASED UINT32_C(0xD0000000)
#define DP_FRAME_OFFSET UINT32_C(0x0FFFFFFF)

static inline uint32_t dp_le32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}

static inline void dp_set_le32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

/* Flow control hears of an arrival, and of a slot the application gave back. */
static inline void dp_fc_arrival(int source, uint32_t imm)
{
    if (dp.on_arrival != NULL) dp.on_arrival(dp.fc, source, imm);
}

static inline void dp_fc_release(int source)
{
    if (dp.on_release != NULL) dp.on_release(dp.fc, source);
}

/* ---- Receive slots and the arrival queue --------------------------------------------- */

/* The index of the buffer at `p` in the substrate's receive region, or MR_NIL. */
static inline uint32_t dp_region_index(const void *p)
{
    uintptr_t off = (uintptr_t)p - dp.region_base;

    if (off >= dp.region_bytes) return MR_NIL;
    /* A power of two (the usual datagram size) spares a division. */
    uintptr_t b = dp.region_shift >= 0 ? off >> dp.region_shift : off / dp.region_stride;
    return b * dp.region_stride == off ? (uint32_t)b : MR_NIL;
}

/* Forgets that receive slot `idx` stands for the substrate's buffer `foreign`. */
static void dp_foreign_forget(uint32_t idx, const void *foreign)
{
    uint32_t b = dp_region_index(foreign);

    if (b == MR_NIL) {
        mr__ptrmap_del_if(&dp.foreign, foreign, idx);
    } else if (dp.region_slot[b] == idx) {
        dp.region_slot[b] = MR_NIL;
    }
}

static uint32_t rt_recv_take(void)
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

static void rt_recv_free(uint32_t idx)
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
    dp_recvq_push(&dp.arrivals, idx);
}

uint32_t dp_batch_drop(uint32_t idx)
{
    rt_recv_t *r = &dp.recvs[idx];
    uint32_t left = r->frames_left;

    for (uint32_t i = left + r->frames_held; i-- > 0;) dp_fc_release(r->source);
    r->frames_left = 0;
    r->frames_held = 0;
    rt_recv_free(idx);
    return left;
}

/* Why mr_release() refuses a pointer `at` bytes into receive slot `idx` (dp_frame_release()). */
static __attribute__((noinline)) mr_status_t dp_frame_refused(void *buffer, size_t idx, size_t at)
{
    uint32_t mark = (uint32_t)(at - MR_FRAME_HDR) & DP_FRAME_OFFSET;

    if (idx < dp.recv_pool.count && at >= MR_FRAME_HDR && at % MR_FRAME_ALIGN == 0 &&
        dp_le32((uint8_t *)buffer - 4) == (DP_FRAME_RELEASED | mark)) {
        mr_error("mr_release(): receive buffer %p is not held by the application "
                 "(double release?).", buffer);
        return MR_ERR_BUFFER_STATE;
    }
    mr_error("mr_release(): %p was not handed out by MailRail.", buffer);
    return MR_ERR_INVALID_BUFFER;
}

/* mr_release() of a pointer `at` bytes (> 0) into receive slot `idx`: a frame of a batch? */
static inline mr_status_t dp_frame_release(void *buffer, size_t idx, size_t at)
{
    uint8_t *hdr = (uint8_t *)buffer - 4; /* The frame header's second word. */
    uint32_t mark = (uint32_t)(at - MR_FRAME_HDR) & DP_FRAME_OFFSET;
    rt_recv_t *r = &dp.recvs[idx];

    if (idx >= dp.recv_pool.count || at < MR_FRAME_HDR || at % MR_FRAME_ALIGN != 0 ||
        r->state != RECV_BATCH || dp_le32(hdr) != (DP_FRAME_HELD | mark)) {
        return dp_frame_refused(buffer, idx, at);
    }
    dp_set_le32(hdr, DP_FRAME_RELEASED | mark);
    int source = r->source;
    if (--r->frames_held == 0 && r->frames_left == 0) rt_recv_free((uint32_t)idx);
    /* Last, with nothing kept across the call: the slot is free before its credit goes. */
    dp_fc_release(source);
    return MR_OK;
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

/* A handler's message, its id apart, that its consumer may take at once, without a slot (ABI 8). */
static mr_status_t up_deliver_handler_now(void *core, int source, uint32_t imm, unsigned id,
                                          const void *data, size_t length)
{
    const rt_consumer_t *c = dp.consumers[MR_KIND_HANDLER];

    (void)core;
    if (c == NULL || c->now == NULL || c->now(id, data, length, source) != MR_OK) {
        return MR_AGAIN;
    }
    /* Its credit was spent and comes back at once, as if a slot had been taken and freed. */
    dp_fc_arrival(source, imm);
    dp_fc_release(source);
    return MR_OK;
}

/* The same with the id as the message's last byte (ABI 4); without one, the usual way refuses it. */
static mr_status_t up_deliver_now(void *core, int source, uint32_t imm, const void *data,
                                  size_t length)
{
    if (length == 0) return MR_AGAIN;
    return up_deliver_handler_now(core, source, imm, ((const uint8_t *)data)[length - 1], data,
                                  length - 1);
}

/* deliver_now() of a batch's handler frames, as many as go (ABI 6). */
static unsigned up_deliver_now_frames(void *core, int source, const void *frames, size_t length,
                                      size_t *consumed)
{
    const rt_consumer_t *c = dp.consumers[MR_KIND_HANDLER];
    unsigned n;

    (void)core;
    *consumed = 0;
    if (c == NULL || c->now_frames == NULL) return 0;
    n = c->now_frames(frames, length, source, consumed);
    /* Each spent a credit, which comes back at once (up_deliver_now()). */
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
    .deliver_now = up_deliver_now,
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

/* ---- Sending ------------------------------------------------------------------------- */

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

/*
 * No credit for `dest`: when flow control says none can come before the next
 * progress call, the core asks no more until then, as after a refusal.
 */
static __attribute__((noinline)) mr_status_t rt_no_credit(int dest)
{
    if (rt.flowctl->waits_for_progress != NULL && rt.flowctl->waits_for_progress(rt.fc, dest)) {
        dp.refused_epoch[dest] = dp.progress_epoch;
    }
    return MR_AGAIN;
}

/*
 * After a drain left messages to `dest` deferred: when none has left for
 * MAILRAIL_TIMEOUT (no credit came from it, or its substrate took nothing),
 * `dest` took nothing for that long, stopped, stuck outside MailRail or
 * lost; a live peer keeps returning credits and taking data as it receives.
 * It has failed, as a peer that never answers a dial has: its messages are
 * dropped and every rank hears of it. The clock starts at the first drain
 * that leaves messages behind, so that deferring costs no clock read.
 */
static __attribute__((noinline)) void rt_deferred_overdue(int dest)
{
    uint64_t now = mr__now_ns(), since = dp.defer_since[dest];

    if (rt.cfg.timeout_s == 0) return;
    if (since == 0) {
        dp.defer_since[dest] = now;
        return;
    }
    if (now - since < rt.cfg.timeout_s * MR_NS_PER_S) return;
    mr_error("Rank %d took none of the %u messages waiting for it for %u s (MAILRAIL_TIMEOUT): "
             "no credit came from it, or its substrate took nothing; it is stalled or lost.",
             dest, (unsigned)dp.deferq.queued[dest], (unsigned)rt.cfg.timeout_s);
    dp.defer_since[dest] = 0;
    rt_peer_down(dest, MR_ERR_TIMEOUT, -1);
}

/*
 * The rest of rt_transmit(), out of line: a message in flight (the substrate
 * completes it later), or one not taken, whose credit goes back.
 */
static __attribute__((noinline)) mr_status_t rt_transmit_rest(uint32_t idx, uint32_t imm,
                                                              mr_status_t status)
{
    rt_send_t *s = &dp.sends[idx];

    if (status == MR_OK) {
        /* Accepted, in flight until send_complete(). */
        if (s->state != SEND_DEFERRED) dp.pending_bytes += s->length;
        s->state = SEND_INFLIGHT;
        dp.inflight++;
        return MR_OK;
    }
    rt.flowctl->unacquire(rt.fc, s->dest, imm);
    if (status == MR_AGAIN && s->dest != rt.rank) dp.refused_epoch[s->dest] = dp.progress_epoch;
    return status;
}

/*
 * The message in send slot `idx` was packed into a batch: the slot is free
 * again, and its `length` bytes at `data` are copied to `payload`, last, so
 * that nothing is kept across the copy.
 */
__attribute__((always_inline)) static inline void rt_packed(uint32_t idx, uint8_t *payload,
                                                            const void *data, size_t length)
{
    rt_send_t *s = &dp.sends[idx];

    if (s->state == SEND_DEFERRED) dp.pending_bytes -= length;
    s->state = SEND_FREE;
    mr__pool_put(&dp.send_pool, idx);
    if (length > 0) memcpy(payload, data, length);
}

/*
 * Hands the message in send slot `idx`, whose credit flow control granted
 * (with `imm`), to the substrate, or to oneself. Inlined: it is most of every
 * send. The common case, a message the substrate is done with at once
 * (packed into a batch through its window, say), frees its slot here; the
 * slot's dest, kind and length must be set before.
 */
__attribute__((always_inline)) static inline mr_status_t rt_transmit_credited(uint32_t idx,
                                                                              uint32_t imm)
{
    rt_send_t *s = &dp.sends[idx];
    int dest = s->dest;
    mr_status_t status;

    if (__builtin_expect(dest == rt.rank, 0)) {
        status = rt_deliver_self(idx);
        if (status == MR_OK) return MR_OK;
    } else {
        void *data = mr__pool_slot(&dp.send_pool, idx);
        uint8_t *payload;
        /* The batch the substrate fills for `dest` takes it without a call (ABI 6). */
        if (__builtin_expect(imm == 0 && dp.win != NULL && s->length <= dp.win_max, 1) &&
            (payload = mr_append_window_take(&dp.win[dest], s->kind, s->length)) != NULL) {
            rt_packed(idx, payload, data, s->length);
            return MR_OK;
        }
        status = dp.send(dp.sub, dest, s->kind, imm, data, s->length, s);
        if (__builtin_expect(status == MR_SUBSTRATE_SENT, 1)) {
            /* Already copied out: the slot is free again, warm for the next reserve. */
            if (s->state == SEND_DEFERRED) dp.pending_bytes -= s->length;
            s->state = SEND_FREE;
            mr__pool_put(&dp.send_pool, idx);
            return MR_OK;
        }
    }
    return rt_transmit_rest(idx, imm, status);
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
static int rt_drain(void)
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
    if (dp.deferq.depth > 0) events += rt_drain();
    for (int k = 0; k < dp.nconsumer_progress; k++) events += dp.consumer_progress[k]();
    return events;
}

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
static mr_status_t rt_reserved_slot(const char *fn, const void *buffer, uint32_t *out)
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

/* ---- Receiving ----------------------------------------------------------------------- */

void rt_busy(void)
{
    dp.idle_polls = 0;
}

void rt_idle(void)
{
    /* When ranks outnumber cores, an idle poll loop must let the others run. */
    if (rt.idle_yield && ++dp.idle_polls >= 64) {
        dp.idle_polls = 0;
        sched_yield();
    }
}

bool rt_report_failure(void)
{
    if (rt.failures_unreported == 0) return false;
    for (int r = 0; r < rt.size; r++) {
        if (rt.peer[r] == PEER_FAILED_UNREPORTED) {
            rt.peer[r] = PEER_FAILED_REPORTED;
            rt.failures_unreported--;
            return true;
        }
    }
    return false;
}

/* Hands out the message at the head of the arrival queue, which is not empty. */
static inline void dp_take(mr_message_t *message)
{
    uint32_t idx = dp.arrivals.head;
    rt_recv_t *r = &dp.recvs[idx];

    dp.idle_polls = 0;
    if (r->state == RECV_BATCH) {
        /* The next frame of a batch: its header is marked as handed out (dp_frame_release()). */
        uint8_t *frame = (uint8_t *)r->data + r->cursor;
        uint32_t length = dp_le32(frame);
        dp_set_le32(frame + 4, DP_FRAME_HELD | (r->cursor & DP_FRAME_OFFSET));
        r->cursor += (uint32_t)mr_frame_size(length);
        r->frames_held++;
        if (--r->frames_left == 0) dp_recvq_pop(&dp.arrivals);
        message->data = frame + MR_FRAME_HDR;
        message->length = length;
    } else {
        dp_recvq_pop(&dp.arrivals);
        r->state = RECV_HELD;
        message->data = r->data;
        message->length = r->length;
    }
    message->source = r->source;
    rt.stats.messages_received++;
    rt.stats.bytes_received += message->length;
}

/* mr_receive() when it makes progress first: idle, every 64th call, or a failure to report. */
static __attribute__((noinline)) mr_status_t rt_receive_slow(mr_message_t *message)
{
    int events;

    dp.receive_budget = 64;
    if (message == NULL) {
        mr_error("mr_receive(): the message pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    events = rt_progress(0);
    if (events < 0) return (mr_status_t)events;
    if (rt_report_failure()) return MR_ERR_PEER_FAILED;
    if (dp.arrivals.head == MR_NIL) {
        rt_idle();
        return MR_AGAIN;
    }
    dp_take(message);
    return MR_OK;
}

mr_status_t mr_receive(mr_message_t *message)
{
    RT_CHECK_READY("mr_receive()");
    /* Progress on every call while idle, and regularly while messages are queued. */
    if (__builtin_expect(dp.arrivals.head == MR_NIL || --dp.receive_budget == 0 ||
                             message == NULL,
                         0)) {
        return rt_receive_slow(message);
    }
    dp_take(message);
    return MR_OK;
}

/* Whether a consumer holds arrivals the application has not taken. */
static bool rt_consumers_waiting(void)
{
    for (size_t k = 0; k < sizeof(dp.consumers) / sizeof(dp.consumers[0]); k++) {
        if (dp.consumers[k] != NULL && dp.consumers[k]->waiting()) return true;
    }
    return false;
}

mr_status_t mr_poll(void)
{
    int events;

    RT_CHECK_READY("mr_poll()");
    events = rt_progress(0);
    if (events < 0) return (mr_status_t)events;
    if (rt_report_failure()) return MR_ERR_PEER_FAILED;
    if (events == 0) {
        rt_idle();
        return MR_AGAIN;
    }
    rt_busy();
    return MR_OK;
}

mr_status_t mr_wait(int timeout_ms)
{
    int events;

    RT_CHECK_READY("mr_wait()");
    if (timeout_ms < 0 || timeout_ms > 60000) {
        mr_error("mr_wait(): the timeout is %d ms; give 0 to 60000.", timeout_ms);
        return MR_ERR_INVALID_PARAM;
    }
    if (dp.arrivals.head != MR_NIL || rt.failures_unreported > 0 || rt_consumers_waiting()) {
        return MR_OK;
    }
    /* A send buffer freed since mr_reserve() failed (by mr_receive()'s progress, say): once. */
    if (dp.reserve_blocked && mr__pool_in_use(&dp.send_pool) < rt.cfg.send_slots &&
        dp.pending_bytes < dp.send_bytes) {
        dp.reserve_blocked = false;
        return MR_OK;
    }
    /* Deferred sends that found credit count as news: do not sleep on them. */
    int moved = dp.deferq.depth > 0 ? rt_drain() : 0;
    /*
     * Sends that wait for credits another process may put in shared memory:
     * ask flow control to be woken, then look once more (they may have come
     * just before).
     */
    bool marked = moved == 0 && timeout_ms > 0 && dp.deferq.depth > 0 && rt.wake_registered &&
                  rt.flowctl->sleep(rt.fc, true);
    if (marked) moved = rt_drain();
    events = rt_progress(moved > 0 ? 0 : timeout_ms);
    if (marked) rt.flowctl->sleep(rt.fc, false);
    if (events < 0) return (mr_status_t)events;
    bool news = events + moved > 0 || dp.arrivals.head != MR_NIL || rt.failures_unreported > 0;
    return news ? MR_OK : MR_AGAIN;
}

mr_status_t mr_release(void *buffer)
{
    uint32_t idx;

    RT_CHECK_SEND("mr_release()");
    uintptr_t off = (uintptr_t)buffer - (uintptr_t)dp.recv_pool.base;
    if (off < dp.recv_pool.mapped_bytes) {
        /* A receive slot, or a frame of a batch inside one. */
        size_t slot = mr__pool_slot_at(&dp.recv_pool, off);
        size_t at = off - slot * dp.recv_pool.stride;
        if (at != 0) return dp_frame_release(buffer, slot, at);
        if (slot >= dp.recv_pool.count || dp.recvs[slot].state == RECV_BATCH) {
            mr_error("mr_release(): %p was not handed out by MailRail.", buffer);
            return MR_ERR_INVALID_BUFFER;
        }
        if (dp.recvs[slot].state != RECV_HELD) {
            mr_error("mr_release(): receive buffer %p is not held by the application "
                     "(double release?).", buffer);
            return MR_ERR_BUFFER_STATE;
        }
        dp_recv_release((uint32_t)slot);
        return MR_OK;
    }
    if (mr__pool_contains(&dp.send_pool, buffer)) {
        mr_status_t status = rt_reserved_slot("mr_release()", buffer, &idx);
        if (status != MR_OK) return status;
        rt_send_free(idx);
        return MR_OK;
    }
    /* A buffer the substrate owns (zero-copy receive): in its region, or by hash. */
    idx = dp_region_index(buffer);
    idx = idx != MR_NIL ? dp.region_slot[idx] : mr__ptrmap_get(&dp.foreign, buffer);
    if (idx != MR_NIL) {
        if (dp.recvs[idx].state != RECV_HELD || dp.recvs[idx].data != buffer) {
            mr_error("mr_release(): receive buffer %p is not held by the application "
                     "(double release?).", buffer);
            return MR_ERR_BUFFER_STATE;
        }
        dp_recv_release(idx);
        return MR_OK;
    }
    mr_error("mr_release(): %p was not handed out by MailRail.", buffer);
    return MR_ERR_INVALID_BUFFER;
}
