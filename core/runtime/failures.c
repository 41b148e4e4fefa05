/*
 * Peer failures: what the core does when a rank dies, and how every rank
 * learns of it although connections are made only on first send.
 *
 * A substrate reports the failure of a rank it is connected to. A rank that
 * never talked to the dead one would not know, and would wait for it in the
 * next quiescence wave or in finalize. So the ranks form a ring: each asks
 * the substrate to watch its two neighbours (ops->watch), which costs one or
 * two connections per rank, and a rank that learns of a failure, from its
 * substrate or from a notice, passes a notice on to the next live rank of the
 * ring, once. The notice is a control message whose immediate has
 * RT_CTRL_NOTICE set (credits never reach that bit); it goes around the ring
 * in at most `size` hops. docs/core.md, "Failures", has the details.
 */
#include "datapath.h"

#include <stdlib.h>

/* A control immediate with this bit set is a failure notice for the rank in the low bits. */
#define RT_CTRL_NOTICE 0x80000000u

bool rt_is_notice(uint32_t imm)
{
    return (imm & RT_CTRL_NOTICE) != 0;
}

/* The next rank after `from` on the ring that is not known to have failed, or -1. */
static int rt_ring_next_live(int from)
{
    for (int k = 1; k < rt.size; k++) {
        int r = (from + k) % rt.size;
        if (r == rt.rank) return -1;
        if (rt.peer[r] == PEER_OK) return r;
    }
    return -1;
}

void rt_peer_down(int rank, mr_status_t why, int reporter)
{
    if (rt.closing || rank < 0 || rank >= rt.size || rank == rt.rank || rt.peer[rank] != PEER_OK) {
        return;
    }
    rt.peer[rank] = PEER_FAILED_UNREPORTED;
    rt.failures_unreported++;
    rt.any_failure = true;
    rt_datapath_report_soon();
    if (reporter < 0) {
        mr_error("Rank %d failed (%s); messages to it are dropped.", rank, mr_status_string(why));
    } else {
        mr_error("Rank %d failed (reported by rank %d); messages to it are dropped.", rank,
                 reporter);
    }
    /* Deferred messages to a dead rank can never go: give their slots back. */
    rt_datapath_drop_deferred(rank);
    /*
     * And those the substrate took, when this rank's own clock named it: they come
     * back as completions. Not on another rank's notice: a dead rank's connections
     * to this one end by themselves, and the substrate reports them.
     */
    if (reporter < 0 && why == MR_ERR_TIMEOUT && rt.substrate->abandon != NULL) {
        rt.substrate->abandon(rt.sub, rank);
    }
    /* Pass the news on around the ring (rt_notices_forward, at the next progress call). */
    if (rt.notice_q != NULL) rt.notice_q[rt.notice_count++] = rank;
}

void rt_notice_arrived(int source, uint32_t imm)
{
    int rank = (int)(imm & ~RT_CTRL_NOTICE);

    if (rank < 0 || rank >= rt.size) {
        mr_warn("Rank %d sent a failure notice for rank %d, which is not in the job; ignored.",
                source, rank);
        return;
    }
    rt_peer_down(rank, MR_ERR_PEER_FAILED, source);
}

int rt_notices_forward(void)
{
    int sent = 0;

    while (rt.notice_sent < rt.notice_count) {
        int dest = rt_ring_next_live(rt.rank);
        uint32_t imm;
        mr_status_t status;

        /*
         * A new successor (the last one failed, perhaps after taking notices into a
         * socket it never read) hears every notice again; known failures are ignored.
         */
        if (dest != rt.notice_dest) {
            rt.notice_dest = dest;
            rt.notice_sent = 0;
        }
        if (dest < 0 || rt.closing) {
            rt.notice_sent = rt.notice_count; /* Nobody left to tell. */
            break;
        }
        imm = RT_CTRL_NOTICE | (uint32_t)rt.notice_q[rt.notice_sent];
        status = rt.substrate->send_control(rt.sub, dest, imm);
        if (status == MR_AGAIN) break;
        /* Sent, or the next rank failed too: its failure is reported, try the one after. */
        if (status == MR_OK) {
            rt.notice_sent++;
            sent++;
        } else if (rt.peer[dest] == PEER_OK) {
            rt_peer_down(dest, status, -1);
        }
    }
    return sent;
}

mr_status_t rt_watch_neighbours(void)
{
    int next = (rt.rank + 1) % rt.size, prev = (rt.rank + rt.size - 1) % rt.size;
    mr_status_t status = MR_OK;

    rt.notice_dest = -1;
    rt.notice_q = calloc((size_t)rt.size, sizeof(*rt.notice_q));
    if (rt.notice_q == NULL) {
        mr_error("Cannot allocate the failure notices of %d ranks.", rt.size);
        return MR_ERR_NO_MEMORY;
    }
    if (rt.size < 2 || rt.substrate->watch == NULL) {
        return MR_OK;
    }
    status = rt.substrate->watch(rt.sub, next);
    if (status == MR_OK && prev != next) status = rt.substrate->watch(rt.sub, prev);
    return status;
}
