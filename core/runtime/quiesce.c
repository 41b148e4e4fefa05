/*
 * mr_quiesce(): global quiescence by waves of sums of messages sent and
 * received.
 */
#include "datapath.h"

mr_status_t mr_quiesce(void)
{
    mr_status_t status;
    int events;

    RT_CHECK_READY("mr_quiesce()");
    events = rt_progress(0);
    if (events < 0) return (mr_status_t)events;
    if (rt.any_failure) {
        mr_error("mr_quiesce(): a peer has failed; quiescence cannot be reached.");
        return MR_ERR_PEER_FAILED;
    }
    /* mr_connect()'s reduction, left pending for the timeout, completes before a wave starts. */
    if (rt.connect_pending) {
        status = rt_connect_settle();
        if (status != MR_OK) return status;
    }
    if (!rt.wave_pending) {
        /* Each wave sums messages sent and received over all ranks. */
        rt_reduce_in[0] = rt.stats.messages_sent;
        rt_reduce_in[1] = rt.stats.messages_received;
        status = rt.bootstrap->iallreduce_sum(rt.bs, rt_reduce_in, rt_reduce_out, 2);
        if (status != MR_OK) return status;
        rt.wave_pending = true;
    }
    status = rt.bootstrap->test(rt.bs);
    if (status == MR_AGAIN) return MR_AGAIN;
    rt.wave_pending = false;
    if (status != MR_OK) return status;
    /*
     * Two consecutive waves with equal sums, sent == received, mean nothing
     * was in flight between them: every rank sees the same sums and stops in
     * the same round.
     */
    bool settled = rt.have_last_wave && rt.last_wave[0] == rt_reduce_out[0] &&
                   rt.last_wave[1] == rt_reduce_out[1];
    if (settled && rt_reduce_out[0] == rt_reduce_out[1]) {
        rt.have_last_wave = false;
        return MR_OK;
    }
    /*
     * Settled with more received than sent: every message received had been
     * counted as sent by the previous wave, so some arrived more than once
     * (a substrate duplicated them). The sums can never meet: say so rather
     * than wait forever. Every rank sees the same sums and fails in the same round.
     */
    if (settled && rt_reduce_out[1] > rt_reduce_out[0]) {
        rt.have_last_wave = false;
        mr_error("mr_quiesce(): the job received %llu messages but sent %llu: %llu arrived more "
                 "than once (a substrate delivered duplicates); quiescence cannot be reached.",
                 (unsigned long long)rt_reduce_out[1], (unsigned long long)rt_reduce_out[0],
                 (unsigned long long)(rt_reduce_out[1] - rt_reduce_out[0]));
        return MR_ERR_TRANSPORT;
    }
    rt.last_wave[0] = rt_reduce_out[0];
    rt.last_wave[1] = rt_reduce_out[1];
    rt.have_last_wave = true;
    return MR_AGAIN;
}
