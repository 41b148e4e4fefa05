/*
 * The UCX substrate's progress(), release_recv(), close() and stats(), and
 * its ops table, which the plugin's one exported function returns
 * (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <sched.h>
#include <sys/epoll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Operations.                                                              */

static int ucx_progress(mr_substrate_t *s, int timeout_ms)
{
    int events = 0;
    uint64_t now;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    s->upcalls_ok = true;
    s->cb_events = 0;
    if (!mr__failq_empty(&s->failq)) events += ucx__drain_failed(s);
    /* Batches leave now, and the next message to each rank leaves alone again. */
    mr__batcher_next_epoch(&s->batcher);
    if (s->batcher.nopen > 0) ucx__flush_batches(s);
    if (s->batches_done != NULL) events += ucx__batches_complete(s);
    if (!mr__done_empty(&s->done)) events += mr__done_drain(s, &s->done, &s->free_sreqs);
    if (s->ctrlq_count > 0) events += ucx__drain_ctrlq(s);
    if (s->rxq_count > 0) events += ucx__rx_drain(s);

    for (int round = 0; round < 2; round++) {
        /*
         * Receiver backpressure: while arrivals wait for slots that only the
         * application can free, take nothing more from UCX.
         */
        if (rx_paused(s)) s->paused_calls++;
        for (int i = 0; i < UCX_PROGRESS_BURST && !rx_paused(s); i++) {
            if (ucp_worker_progress(s->worker) == 0) break;
        }
        /*
         * Reading the clock on every poll is a small delay that spares the
         * shared FIFO's cache lines: reading it on every 64th poll only made
         * a 512-byte stream under `none` 25% slower (docs/notes/performance-notebook.md).
         */
        if (s->npidfds > 0 && (now = mr__coarse_now_ns()) >= s->next_pidfd_check) {
            s->next_pidfd_check = now + UCX_PIDFD_CHECK_MS * MR_NS_PER_MS;
            ucx__check_events(s, 0);
        }
        events += s->cb_events;
        s->cb_events = 0;
        if (s->woken) {
            s->woken = false;
            events++;
        }
        if (!mr__failq_empty(&s->failq)) events += ucx__drain_failed(s);
        if (s->batches_done != NULL) events += ucx__batches_complete(s);
        if (!mr__done_empty(&s->done)) events += mr__done_drain(s, &s->done, &s->free_sreqs);
        if (s->rxq_count > 0) events += ucx__rx_drain(s);
        if (events > 0 || timeout_ms == 0 || round == 1) break;
        /* Idle with time to wait: sleep until UCX or a watched process has news. */
        if (rx_paused(s)) {
            sched_yield();
            break;
        }
        if (s->efd >= 0) {
            ucs_status_t us = ucp_worker_arm(s->worker);
            if (us == UCS_OK) {
                ucx__check_events(s, timeout_ms);
                s->next_pidfd_check = mr__coarse_now_ns() + UCX_PIDFD_CHECK_MS * MR_NS_PER_MS;
            } else if (us != UCS_ERR_BUSY) {
                sched_yield();
            }
        } else {
            sched_yield();
        }
    }
    s->upcalls_ok = false;
    return events;
}

static mr_status_t ucx_wake_fd(mr_substrate_t *s, int fd)
{
    /* Edge-triggered: a wake-up its owner has not read yet wakes once, not forever. */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = UCX_TAG_WAKE};

    if (s->epfd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: cannot watch wake-up descriptor %d.", fd);
        return MR_ERR_SYSTEM;
    }
    return MR_OK;
}

static void ucx_release_recv(mr_substrate_t *s, void *handle)
{
    if (s == NULL || handle == NULL || s->worker == NULL) return;
    ucp_am_data_release(s->worker, handle);
}

void ucx__close(mr_substrate_t *s)
{
    if (s == NULL) return;
    s->closed = true;
    s->upcalls_ok = false;
    if (s->worker != NULL) {
        uint64_t deadline;

        /* UCX buffers still held: queued arrivals nobody will receive. */
        for (size_t i = 0; i < s->rxq_count; i++) {
            ucx_rx_t *e = rxq_at(s, i);
            if (e->state == RX_HELD || e->state == RX_RNDV_WAIT) {
                ucp_am_data_release(s->worker, e->data);
                e->data = NULL;
            } else if (e->state == RX_SPILL && e->heap) {
                free(e->data);
                e->data = NULL;
            }
        }
        /*
         * A normal finalize: closing() flushed every endpoint and every rank
         * is past it, so nothing is in flight either way and the endpoints
         * go without a flush. Otherwise (a failure, or init giving up) each
         * flushes what can still go.
         */
        for (int r = 0; r < s->base.size; r++) {
            ucx_peer_t *p = &s->peers[r];
            ucp_request_param_t param;
            ucs_status_ptr_t sp;

            if (p->flush_req != NULL) ucp_request_free(p->flush_req);
            p->flush_req = NULL;
            if (p->ep == NULL) continue;
            memset(&param, 0, sizeof(param));
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = !s->flushed && p->state == P_OK && !mr__failq_queued(&s->failq, p->rank)
                              ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
            sp = ucp_ep_close_nbx(p->ep, &param);
            p->ep = NULL;
            p->state = P_CLOSED;
            if (UCS_PTR_IS_PTR(sp)) p->close_req = sp;
        }
        /* Short: after a failure the other ranks may be anywhere, not waiting for us. */
        deadline = mr__now_ns() + UCX_CLOSE_EP_MS * MR_NS_PER_MS;
        for (;;) {
            int left = 0;
            while (ucp_worker_progress(s->worker) != 0) {
            }
            for (int r = 0; r < s->base.size; r++) {
                if (!ucx__req_done(&s->peers[r].close_req, NULL)) left++;
            }
            if (left == 0 && !ucx__rx_any_receiving(s)) break;
            if (mr__now_ns() >= deadline) {
                /* Destroying the worker releases them by force. */
                MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %d endpoints did not close within %d ms.",
                        left, UCX_CLOSE_EP_MS);
                for (int r = 0; r < s->base.size; r++) {
                    if (s->peers[r].close_req != NULL) ucp_request_free(s->peers[r].close_req);
                    s->peers[r].close_req = NULL;
                }
                break;
            }
            sched_yield();
        }
        /* After this UCX holds no reference to our request memory. */
        ucp_worker_destroy(s->worker);
        s->worker = NULL;
    }
    if (s->context != NULL) ucp_cleanup(s->context);
    s->context = NULL;
    if (s->peers != NULL) {
        for (int r = 0; r < s->base.size; r++) {
            if (s->peers[r].pidfd >= 0) close(s->peers[r].pidfd);
        }
    }
    if (s->epfd >= 0) close(s->epfd);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %llu messages arrived without a header (%llu "
                "handlers' messages with the id in front rewritten to wait), %llu "
                "delivered in place, %llu received "
                "by rendezvous, %llu held and %llu spilled (%llu to the heap) while waiting for a "
                "receive slot, %llu progress calls paused for want of one.",
                (unsigned long long)s->bare_received, (unsigned long long)s->hfront_rewritten,
                (unsigned long long)s->zcopy_delivered, (unsigned long long)s->rndv_received,
                (unsigned long long)s->held, (unsigned long long)s->spilled,
                (unsigned long long)s->spilled_heap, (unsigned long long)s->paused_calls);
    }
    for (size_t b = 0; b < s->nsreq_blocks; b++) free(s->sreq_blocks[b].mem);
    free(s->sreq_blocks);
    mr__batcher_fini(&s->batcher); /* After the worker: UCX no longer reads any batch. */
    free(s->rreq_mem);
    free(s->peers);
    mr__failq_fini(&s->failq);
    free(s->rxq);
    free(s->ctrlq);
    free(s->spill);
    free(s->hfront_scratch);
    free(s);
}

static void ucx_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    mr__batcher_stats(&s->batcher, stats);
    mr__stats_add_peers(stats, s->nendpoints);
}

/*
 * The messages in the queue without a receive slot: arrivals held by UCX,
 * spilled, or rendezvous not started, a data batch counted by its frames
 * (each a message with a credit of its own) and a rendezvous batch not
 * started as one. Kept as a running count (ucx__rx_wait()), so it costs the
 * same however long the queue.
 */
static uint64_t ucx_held(mr_substrate_t *s)
{
    return s->rxq_waiting;
}

/* The batches being filled, open to the core (mr_append_window_t). */
static mr_append_window_t *ucx_append_windows(mr_substrate_t *s, size_t *max_frame)
{
    return mr__batcher_windows(&s->batcher, max_frame);
}

static const mr_substrate_ops_t ucx_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "ucx",
    .wait_is_costly = true,
    .description = "UCX active messages, one UCP worker per rank; MAILRAIL_UCX_<NAME> sets "
                   "UCX's <NAME> for MailRail alone (over UCX_<NAME>)",
    .config_table = ucx__config_table,
    .config_size = sizeof(ucx_config_t),
    .open = ucx__open,
    .get_address = ucx__get_address,
    .connect = ucx__connect,
    .send = ucx__send,
    .send_control = ucx__send_control,
    .progress = ucx_progress,
    .release_recv = ucx_release_recv,
    .format_address = ucx__format_address,
    .closing = ucx__closing,
    .stats = ucx_stats,
    .close = ucx__close,
    .settings_passthrough_prefix = UCX_OWN_PREFIX,
    .job_wide_settings = ucx__job_wide_settings,
    .watch = ucx__watch,
    .wake_fd = ucx_wake_fd,
    .held = ucx_held,
    .append_windows = ucx_append_windows,
    .preconnect = ucx__preconnect,
    .abandon = ucx__abandon,
};

MR__SUBSTRATE_ENTRY(ucx_ops)
