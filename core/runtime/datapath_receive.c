/*
 * Receiving: mr_receive() hands out the arrival queue's datagrams and the
 * frames of its batches, mr_poll() and mr_wait() make progress or sleep,
 * and mr_release() takes back anything MailRail handed out, refusing with a
 * clear error what it did not hand out or was released already.
 */
#include "datapath_state.h"
#include "mr_time.h"

#include <endian.h>
#include <sched.h>
#include <string.h>
#include <time.h>

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
    else dp.batch_frames--; /* The slot still holds other frames: this one leaves the count. */
    /* Last, with nothing kept across the call: the slot is free before its credit goes. */
    dp_fc_release(source);
    return MR_OK;
}

void rt_busy(void)
{
    dp.idle_polls = 0;
    dp.nap_ns = 0;
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

/* mr_wait()'s naps (MAILRAIL_WAIT_NAP): from the first, a quarter longer each, up to the last. */
#define DP_NAP_FIRST_NS 20000u
#define DP_NAP_LAST_NS 200000u

/*
 * Whether anything is ready for the caller after `events` from progress and
 * `moved` deferred sends: a message, a failure to report, or progress made.
 */
static bool dp_news(int events, int moved)
{
    return events + moved > 0 || dp.arrivals.head != MR_NIL || rt.failures_unreported > 0;
}

/* Sleeps `ns` (below a second), then polls: progress's events or a negative status. */
static int dp_nap_once(uint64_t ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};

    nanosleep(&ts, NULL);
    return rt_progress(0);
}

/*
 * Naps and polls, while this rank saw news less than about 1 ms ago: a busy
 * rank that outnumbers the cores is then woken once per nap, with what came
 * meanwhile, instead of once per message (a wake-up is several system calls
 * and a context switch). Returns more than 0 when a poll found news, 0 when
 * the naps ran out or `deadline` passed, or a negative status.
 */
static int dp_nap(uint64_t deadline)
{
    while (dp.nap_ns < DP_NAP_LAST_NS) {
        uint64_t now = mr__now_ns();
        if (now >= deadline) return 0;
        dp.nap_ns = dp.nap_ns == 0 ? DP_NAP_FIRST_NS : dp.nap_ns + dp.nap_ns / 4;
        int events = dp_nap_once(dp.nap_ns < deadline - now ? dp.nap_ns : deadline - now);
        if (events < 0) return events;
        if (dp_news(events, 0)) return events > 0 ? events : 1;
    }
    return 0;
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
    uint64_t deadline = mr__now_ns() + (uint64_t)timeout_ms * MR_NS_PER_MS;
    if (moved == 0 && timeout_ms > 0 && rt.wait_naps) {
        events = dp_nap(deadline);
        if (events < 0) return (mr_status_t)events;
        if (events > 0) {
            dp.nap_ns = 0;
            return MR_OK;
        }
    }
    for (;;) {
        uint64_t now = mr__now_ns();
        bool short_of_sweep = false;
        if (moved == 0 && timeout_ms > 0) {
            if (now >= deadline) return MR_AGAIN;
            /* The rest of the time asleep until news, in whole milliseconds. */
            timeout_ms = (int)((deadline - now + MR_NS_PER_MS - 1) / MR_NS_PER_MS);
            /* Sends in flight: awake for the sweep that may find their receiver lost. */
            if (dp.inflight > 0 && rt.cfg.timeout_s > 0) {
                rt_inflight_sweep(now);
                if (rt.failures_unreported > 0) break;
                uint64_t to_sweep = (dp.sweep_at - now + MR_NS_PER_MS - 1) / MR_NS_PER_MS;
                if (to_sweep < (uint64_t)timeout_ms) {
                    timeout_ms = (int)to_sweep;
                    short_of_sweep = true;
                }
            }
        }
        /*
         * Sends that wait for credits another process may put in shared memory:
         * ask flow control to be woken, then look once more (they may have come
         * just before).
         */
        bool marked = moved == 0 && timeout_ms > 0 && dp.deferq.depth > 0 &&
                      rt.wake_registered && rt.flowctl->sleep(rt.fc, true);
        if (marked) moved = rt_drain();
        events = rt_progress(moved > 0 ? 0 : timeout_ms);
        if (marked) rt.flowctl->sleep(rt.fc, false);
        if (events < 0) return (mr_status_t)events;
        if (dp_news(events, moved)) break;
        if (short_of_sweep) continue;
        /*
         * Back early without news: the substrate could not sleep (UCX had
         * work of its own pending, or arrivals wait for slots the
         * application holds). A rank that naps waits out the rest in its
         * longest naps, polling after each, instead of asking again at once
         * (each ask is several system calls, and a rank that outnumbers the
         * cores would ask thousands of times a second).
         */
        if (!rt.wait_naps || timeout_ms == 0) return MR_AGAIN;
        now = mr__now_ns();
        if (now >= deadline) return MR_AGAIN;
        events = dp_nap_once(deadline - now < DP_NAP_LAST_NS ? deadline - now : DP_NAP_LAST_NS);
        if (events < 0) return (mr_status_t)events;
        moved = dp.deferq.depth > 0 ? rt_drain() : 0;
        if (dp_news(events, moved)) break;
    }
    dp.nap_ns = 0;
    return MR_OK;
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
