/*
 * The datapath's receive side, as the application sees it: mr_receive(),
 * mr_wait(), mr_release(), and idling.
 */
#include "datapath_state.h"

#include <sched.h>

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

mr_status_t mr_receive(mr_message_t *message)
{
    uint32_t idx;
    int events;

    RT_CHECK_READY("mr_receive()");
    if (message == NULL) {
        mr_error("mr_receive(): the message pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    /* Progress on every call while idle, and regularly while messages are queued. */
    if (dp.arrivals.head == MR_NIL || (++dp.receive_calls & 15) == 0) {
        events = rt_progress(0);
        if (events < 0) return (mr_status_t)events;
    }
    if (rt_report_failure()) return MR_ERR_PEER_FAILED;
    idx = dp_msgq_pop(&dp.arrivals);
    if (idx == MR_NIL) {
        rt_idle();
        return MR_AGAIN;
    }
    dp.idle_polls = 0;
    dp.recvs[idx].state = RECV_HELD;
    message->data = dp.recvs[idx].data;
    message->length = dp.recvs[idx].length;
    message->source = dp.recvs[idx].source;
    rt.stats.messages_received++;
    rt.stats.bytes_received += dp.recvs[idx].length;
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
        (rt.cfg.send_bytes == 0 || dp.pending_bytes < rt.cfg.send_bytes)) {
        dp.reserve_blocked = false;
        return MR_OK;
    }
    /* Deferred sends that found credit count as news: do not sleep on them. */
    int moved = dp.deferq.depth > 0 ? dp_drain(true) : 0;
    /*
     * Sends that wait for credits another process may put in shared memory:
     * ask flow control to be woken, then look once more (they may have come
     * just before).
     */
    bool marked = moved == 0 && timeout_ms > 0 && dp.deferq.depth > 0 && rt.wake_registered &&
                  rt.flowctl->sleep(rt.fc, true);
    if (marked) moved = dp_drain(true);
    events = rt_progress(moved > 0 ? 0 : timeout_ms);
    if (marked) rt.flowctl->sleep(rt.fc, false);
    if (events < 0) return (mr_status_t)events;
    bool news = events + moved > 0 || dp.arrivals.head != MR_NIL || rt.failures_unreported > 0;
    return news ? MR_OK : MR_AGAIN;
}

mr_status_t mr_release(void *buffer)
{
    uint32_t idx;

    RT_CHECK_READY("mr_release()");
    idx = mr__pool_index(&dp.recv_pool, buffer);
    if (idx != MR_NIL) {
        if (dp.recvs[idx].state != RECV_HELD) {
            mr_error("mr_release(): receive buffer %p is not held by the application "
                     "(double release?).", buffer);
            return MR_ERR_BUFFER_STATE;
        }
        dp_recv_release(idx);
        return MR_OK;
    }
    if (mr__pool_contains(&dp.send_pool, buffer)) {
        mr_status_t status = dp_reserved_slot("mr_release()", buffer, &idx);
        if (status != MR_OK) return status;
        rt_send_free(idx);
        return MR_OK;
    }
    /* A buffer the substrate owns (zero-copy receive). */
    idx = mr__pool_contains(&dp.recv_pool, buffer) ? MR_NIL : mr__ptrmap_get(&dp.foreign, buffer);
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
