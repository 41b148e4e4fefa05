/*
 * The datapath's life: its pools and slot tables allocated at init and freed
 * at finalize, what it is told once flow control and the substrate are open,
 * and what finalize and failures ask of it (datapath.h).
 */
#include "datapath_state.h"

#include <stdlib.h>
#include <string.h>

/* The datapath's one state, shared by its files (datapath_state.h). */
rt_datapath_t dp;

void rt_datapath_fini(void)
{
    free(dp.sends);
    free(dp.recvs);
    free(dp.refused_epoch);
    free(dp.defer_since);
    free(dp.heard);
    free(dp.defer_heard);
    free(dp.sweep_heard[0]);
    free(dp.sweep_heard[1]);
    for (uint32_t i = 0; i < dp.nparked_cap; i++) free(dp.parked[i]);
    free(dp.parked);
    free(dp.parked_next);
    free(dp.region_slot);
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
        dp.defer_since = calloc((size_t)rt.size, sizeof(*dp.defer_since));
        dp.heard = calloc((size_t)rt.size, sizeof(*dp.heard));
        dp.defer_heard = calloc((size_t)rt.size, sizeof(*dp.defer_heard));
        dp.sweep_heard[0] = calloc((size_t)rt.size, sizeof(*dp.sweep_heard[0]));
        dp.sweep_heard[1] = calloc((size_t)rt.size, sizeof(*dp.sweep_heard[1]));
        if (!dp.sends || !dp.recvs || !dp.refused_epoch || !dp.defer_since || !dp.heard ||
            !dp.defer_heard || !dp.sweep_heard[0] || !dp.sweep_heard[1]) {
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
    dp.receive_budget = 1;
    return MR_OK;
}

/*
 * Asks the substrate where the buffers it delivers zero copy lie (ABI 7), so
 * that mr_release() finds their slots by index. Without an answer, or when
 * the table cannot be had, the hash (dp.foreign) does it all.
 */
static void rt_datapath_attach_region(void)
{
    void *base = NULL;
    size_t stride = 0;
    uint32_t count = 0;

    if (rt.substrate->recv_region == NULL ||
        !rt.substrate->recv_region(rt.sub, &base, &stride, &count)) {
        return;
    }
    if (base == NULL || stride == 0 || count == 0 || stride > SIZE_MAX / count) {
        mr_warn("Substrate %s gave an invalid receive region; released buffers are looked "
                "up by hash.", rt.substrate->name);
        return;
    }
    dp.region_slot = malloc((size_t)count * sizeof(*dp.region_slot));
    if (dp.region_slot == NULL) return;
    for (uint32_t i = 0; i < count; i++) dp.region_slot[i] = MR_NIL;
    dp.region_base = (uintptr_t)base;
    dp.region_stride = stride;
    dp.region_bytes = (size_t)count * stride;
    dp.region_shift = (stride & (stride - 1)) == 0 ? __builtin_ctzll(stride) : -1;
}

void rt_datapath_attach(uint64_t recv_bound, uint64_t (*held)(mr_substrate_t *s))
{
    dp.recv_bound = recv_bound;
    dp.sub_held = held;
    if (!rt.flowctl->unconstrained) {
        dp.acquire = rt.flowctl->acquire;
        dp.acquire_n = rt.flowctl->acquire_n;
        dp.on_arrival = rt.flowctl->on_arrival;
        dp.on_release = rt.flowctl->on_release;
    }
    dp.fc = rt.fc;
    dp.send = rt.substrate->send;
    dp.sub = rt.sub;
    if (rt.substrate->append_windows) {
        dp.win = rt.substrate->append_windows(rt.sub, &dp.win_max);
    }
    dp.send_bytes = rt.cfg.send_bytes != 0 ? rt.cfg.send_bytes : UINT64_MAX;
    rt_datapath_attach_region();
}

bool rt_datapath_sends_pending(void)
{
    return dp.deferq.depth > 0 || dp.inflight > 0;
}

void rt_datapath_drop_deferred(int rank)
{
    for (uint32_t idx; (idx = mr__deferq_pop(&dp.deferq, rank)) != MR_NIL;) rt_send_free(idx);
}

void rt_datapath_report_soon(void)
{
    dp.receive_budget = 1;
}

void rt_datapath_stats(mr_stats_t *snapshot)
{
    snapshot->peak_deferred_depth = dp.deferq.peak_depth;
    snapshot->deferred_now = dp.deferq.depth;
    snapshot->recv_slots_in_use = mr__pool_in_use(&dp.recv_pool);
    snapshot->recv_granted = dp.recv_bound != 0 ? dp.recv_bound : rt.cfg.recv_slots;
    snapshot->recv_inflight = dp_recv_messages();
}

uint64_t rt_datapath_drop_arrivals(void)
{
    uint64_t dropped = 0;

    for (rt_msg_t msg; (msg = dp_recvq_pop(&dp.arrivals)) != MR_NIL;) {
        if (dp.recvs[msg].state == RECV_BATCH) {
            dropped += dp_batch_drop(msg);
        } else {
            dp_recv_release(msg);
            dropped++;
        }
    }
    return dropped;
}

/*
 * A batch with frames not handed out yet is still in the arrival queue:
 * rt_datapath_drop_arrivals() gives it back, with its held frames. Given
 * back here as well, it was freed twice (a write past the pool's free stack).
 */
void rt_datapath_release_held(void)
{
    for (size_t i = 0; i < rt.cfg.recv_slots; i++) {
        const rt_recv_t *r = &dp.recvs[i];

        if (r->state == RECV_HELD) dp_recv_release((uint32_t)i);
        if (r->state == RECV_BATCH && r->frames_left == 0) dp_batch_drop((uint32_t)i);
    }
}
