/*
 * The UCX substrate's peer failures: queued when found (send completions,
 * UCX's error handler, pidfds), reported by progress(), then the peer's
 * endpoint closed by force or its sends given up (ucx_substrate.h lists the
 * other files).
 */
#include "ucx_substrate.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Finding a failure: queued for the next progress call.                    */

bool ucx__is_peer_gone_status(ucs_status_t st)
{
    return st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
           st == UCS_ERR_UNREACHABLE || st == UCS_ERR_REJECTED || st == UCS_ERR_CANCELED ||
           st == UCS_ERR_IO_ERROR || st == UCS_ERR_NOT_CONNECTED;
}

/* Queues the failure of `rank` for the next progress call. Idempotent. */
void ucx__peer_fail(mr_substrate_t *s, int rank, ucs_status_t why)
{
    ucx_peer_t *p;

    if (rank < 0 || rank >= s->base.size || rank == s->base.rank) return;
    p = &s->peers[rank];
    if (p->state != P_OK || !mr__failq_push(&s->failq, rank, MR_ERR_PEER_FAILED)) return;
    p->fail_status = why;
    if (s->failures_seen < UINT8_MAX) s->failures_seen++;
}

/* The core gave up on `rank`: failed as if UCX had said so (peer_fail_end() closes it). */
void ucx__abandon(mr_substrate_t *s, int rank)
{
    ucx__peer_fail(s, rank, UCS_ERR_ENDPOINT_TIMEOUT);
}

void ucx__ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *p = arg;

    (void)ep;
    ucx__peer_fail(p->s, p->rank, status);
}

/* ------------------------------------------------------------------------ */
/* Upcall drains (progress() only).                                         */

static void peer_force_close(mr_substrate_t *s, ucx_peer_t *p)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;

    if (p->ep == NULL) return;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    sp = ucp_ep_close_nbx(p->ep, &param);
    p->ep = NULL;
    if (UCS_PTR_IS_PTR(sp)) p->close_req = sp;
    (void)s;
}

/*
 * Gives the core back the buffers of the sends in flight to `rank`, which
 * died, when its endpoint has no error handling (shared memory): UCX then
 * neither completes them nor lets the endpoint be closed by force, and they
 * would hold the send pool forever. Their request memory stays UCX's until
 * the worker is destroyed, so a new block replaces it. UCX only reads a send
 * buffer, and only towards the dead rank, so reusing one is safe.
 */
static int peer_retire_sends(mr_substrate_t *s, int rank)
{
    size_t ndata = 0, nctrl = 0, nblocks = s->nsreq_blocks;

    for (size_t b = 0; b < nblocks; b++) {
        for (size_t i = 0; i < s->sreq_blocks[b].n; i++) {
            ucx_sreq_t *r = ucx__sreq_at(s, &s->sreq_blocks[b], i);
            if (!r->inflight || r->dest != rank) continue;
            r->inflight = false;
            r->retired = true;
            if (r->ctrl) {
                nctrl++;
            } else if (r->batch != NULL) {
                ndata++;
                batch_done_push(s, r->batch); /* Freed just below. */
                r->batch = NULL;
            } else {
                ndata++;
                s->base.up.send_complete(s->base.core, r->link.cookie);
            }
        }
    }
    ucx__batches_complete(s);
    if (ndata + nctrl == 0) return 0;
    MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %zu sends and %zu credit returns to rank %d given up.",
            ndata, nctrl, rank);
    if (ucx__sreq_block_add(s, ndata, nctrl) != MR_OK) {
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: no memory to replace %zu send states given up on "
                "rank %d; fewer sends can be in flight from now on.", ndata + nctrl, rank);
    }
    return (int)ndata;
}

/* Marks the peer failed and logs why; the core hears of it unless all are finishing. */
static mr__fail_verdict_t peer_fail_begin(mr_substrate_t *s, int rank, mr_status_t why)
{
    ucx_peer_t *p = &s->peers[rank];

    (void)why;
    if (p->state != P_OK) return MR__FAIL_SKIP;
    p->state = P_FAILED;
    s->nendpoints--;
    if (s->base.closing) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d went away while finalizing (%s).",
                rank, p->exited ? "its process exited" : ucs_status_string(p->fail_status));
        return MR__FAIL_QUIET;
    }
    if (p->exited) {
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: the process of rank %d (pid %u) exited.",
                rank, (unsigned)p->pid);
    } else {
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: rank %d failed (UCX: %s).", rank,
                ucs_status_string(p->fail_status));
    }
    return MR__FAIL_REPORT;
}

/* Closes the endpoint by force, or gives its sends up when UCX cannot. */
static int peer_fail_end(mr_substrate_t *s, int rank)
{
    ucx_peer_t *p = &s->peers[rank];

    if (p->err_peer) {
        /* Its sends complete (canceled) and come back as completions. */
        peer_force_close(s, p);
        return 0;
    }
    return peer_retire_sends(s, rank);
}

static const mr__fail_ops_t ucx_fail_ops = {
    .begin = peer_fail_begin,
    .end = peer_fail_end,
};

int ucx__drain_failed(mr_substrate_t *s)
{
    return mr__failq_drain(s, &s->failq, &ucx_fail_ops);
}
