/*
 * The UCX substrate's endpoints: made on first use, from the address table
 * that connect() checks and keeps, so that a rank holds an endpoint (and, for
 * a peer on this host, a pidfd) only for the peers it sends to, watches or
 * connects to ahead (preconnect(), for mr_connect()). UCX wires an endpoint
 * up while both ranks progress; a message sent before that waits inside UCX.
 * Receiving needs no endpoint: every message names its sender. closing()
 * flushes every endpoint, so that close() can release them without a flush
 * once all ranks are past finalize's last barrier (ucx_substrate.h lists the
 * other files).
 */
#include "ucx_substrate.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

/* Whether a UCX request handle is done (freeing it when it is). */
bool ucx__req_done(void **req, ucs_status_t *status)
{
    ucs_status_t st;

    if (*req == NULL) return true;
    st = ucp_request_check_status(*req);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(*req);
    *req = NULL;
    if (status != NULL && st != UCS_OK) *status = st;
    return true;
}

/* The checked address of rank `r` in the table kept by connect(). */
static void peer_address(const mr_substrate_t *s, int r, ucx_wire_addr_t *w)
{
    /* connect() decoded every entry once: this cannot fail. */
    (void)mr__ucx_wire_addr_decode(s->addrs + (size_t)r * s->addrs_len, s->addrs_len, w, NULL);
}

/* Creates the endpoint to peer `p` from its address, with the error mode it calls for. */
static mr_status_t peer_create_endpoint(mr_substrate_t *s, ucx_peer_t *p, const ucx_wire_addr_t *w)
{
    ucp_ep_params_t ep;
    ucs_status_t us;

    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)w->worker;
    if (s->cfg.error_mode == ERRMODE_PEER ||
        (s->cfg.error_mode == ERRMODE_AUTO && !p->same_host)) {
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        p->err_peer = true;
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = ucx__ep_err_cb;
        ep.err_handler.arg = p;
    } else {
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    }
    us = ucp_ep_create(s->worker, &ep, &p->ep);
    if (us != UCS_OK) {
        p->ep = NULL;
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot create an endpoint to rank %d: %s.",
                p->rank, ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    p->state = P_OK;
    s->nendpoints++;
    return MR_OK;
}

mr_status_t ucx__peer_endpoint(mr_substrate_t *s, ucx_peer_t *p)
{
    ucx_wire_addr_t w;
    mr_status_t st;

    if (p->state != P_NONE) return MR_OK;
    if (!s->connected || s->closed) return MR_ERR_INVALID_RANK;
    peer_address(s, p->rank, &w);
    p->same_host = w.boot_hash != 0 && w.boot_hash == s->boot_hash;
    st = peer_create_endpoint(s, p, &w);
    if (st == MR_OK) ucx__peer_watch_process(s, p, w.pidns);
    return st;
}

mr_status_t ucx__connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    if (s == NULL || s->connect_started) return MR_ERR_INVALID_PARAM;
    s->connect_started = true;
    if (s->base.size == 1) {
        s->connected = true;
        return MR_OK;
    }
    if (addrs == NULL || addr_len < UCX_WIRE_ADDR_HDR_LEN) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the address table holds %zu-byte entries, fewer "
                "than the %d-byte header of a UCX address.", addr_len, UCX_WIRE_ADDR_HDR_LEN);
        return MR_ERR_PROTOCOL;
    }
    for (int r = 0; r < s->base.size; r++) {
        const uint8_t *blob = (const uint8_t *)addrs + (size_t)r * addr_len;
        ucx_wire_addr_t w;

        if (mr__ucx_wire_addr_decode(blob, addr_len, &w, NULL) != MR_OK) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the address of rank %d is not a valid UCX "
                    "substrate address (wrong magic, version or length).", r);
            return MR_ERR_PROTOCOL;
        }
        s->peers[r].pid = w.pid;
    }
    /* The core keeps the table until close(). */
    s->addrs = addrs;
    s->addrs_len = addr_len;
    s->connected = true;
    return MR_OK;
}

mr_status_t ucx__watch(mr_substrate_t *s, int rank)
{
    mr_status_t st = mr__send_target_check(s, rank);

    if (st != MR_OK) return st;
    return ucx__peer_endpoint(s, &s->peers[rank]);
}

/*
 * Creates the endpoint to `rank` as its first send would, and wires it up: a
 * flush of an endpoint completes only once UCX has connected its lanes (its
 * wire-up protocol runs while both ranks progress; shared memory needs none),
 * so that the first message pays for nothing. MR_OK once the flush completed,
 * MR_AGAIN while it runs.
 */
mr_status_t ucx__preconnect(mr_substrate_t *s, int rank)
{
    mr_status_t st = mr__send_target_check(s, rank);
    ucs_status_t us = UCS_OK;
    ucx_peer_t *p;

    if (st != MR_OK) return st;
    p = &s->peers[rank];
    if (p->state == P_FAILED || p->state == P_CLOSED || mr__failq_queued(&s->failq, rank)) {
        return MR_ERR_PEER_FAILED;
    }
    st = ucx__peer_endpoint(s, p);
    if (st != MR_OK) return st;
    if (p->wired) return MR_OK;
    if (p->flush_req == NULL) {
        ucp_request_param_t param;
        ucs_status_ptr_t sp;

        memset(&param, 0, sizeof(param));
        sp = ucp_ep_flush_nbx(p->ep, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot wire up the endpoint to rank %d: %s.",
                    rank, ucs_status_string(UCS_PTR_STATUS(sp)));
            return ucx__is_peer_gone_status(UCS_PTR_STATUS(sp)) ? MR_ERR_PEER_FAILED
                                                                : MR_ERR_TRANSPORT;
        }
        p->flush_req = sp;
    }
    if (!ucx__req_done(&p->flush_req, &us)) return MR_AGAIN;
    if (us != UCS_OK) {
        /* The endpoint's error handler, or a dead process's pidfd, reports the failure too. */
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: wiring up the endpoint to rank %d failed: %s.",
                rank, ucs_status_string(us));
        return MR_ERR_PEER_FAILED;
    }
    p->wired = true;
    return MR_OK;
}

void ucx__closing(mr_substrate_t *s)
{
    unsigned flush_s = s->base.timeout_s < UCX_CLOSE_FLUSH_S ? s->base.timeout_s
                                                             : UCX_CLOSE_FLUSH_S;
    uint64_t deadline = mr__now_ns() + (uint64_t)(flush_s ? flush_s : 1) * MR_NS_PER_S;
    int left = 0;

    mr__substrate_closing(s);
    if (!s->connected) return;
    /*
     * Every rank finished sending: a flush of each endpoint makes sure that
     * what it sent has arrived. The peers progress meanwhile (they are in
     * the same finalize, or in this flush), and none of them leaves before
     * every rank is done here, so close() may then release every endpoint
     * without a flush: a flush towards a peer that already destroyed its
     * worker fails, and UCX logs an error for it.
     */
    for (int r = 0; r < s->base.size; r++) {
        ucx_peer_t *p = &s->peers[r];
        ucp_request_param_t param;
        ucs_status_ptr_t sp;

        if (p->ep == NULL || p->state != P_OK || mr__failq_queued(&s->failq, p->rank)) continue;
        if (p->flush_req != NULL) {
            /* preconnect()'s flush still runs (mr_connect() timed out): it will do. */
            left++;
            continue;
        }
        memset(&param, 0, sizeof(param));
        sp = ucp_ep_flush_nbx(p->ep, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: cannot flush the endpoint to rank %d: %s.",
                    r, ucs_status_string(UCS_PTR_STATUS(sp)));
            continue;
        }
        p->flush_req = sp;
        if (sp != NULL) left++;
    }
    /* Outside progress(): what arrives meanwhile waits in the queues (upcalls_ok is false). */
    while (left > 0) {
        while (ucp_worker_progress(s->worker) != 0) {
        }
        left = 0;
        for (int r = 0; r < s->base.size; r++) {
            if (!ucx__req_done(&s->peers[r].flush_req, NULL)) left++;
        }
        if (left == 0) break;
        if (mr__now_ns() >= deadline) {
            MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %d endpoints were not flushed within %u s.",
                    left, flush_s);
            break;
        }
        if (s->efd >= 0 && ucp_worker_arm(s->worker) == UCS_OK) {
            ucx__check_events(s, UCX_CONNECT_POLL_MS);
        } else {
            sched_yield();
        }
    }
    s->flushed = left == 0;
}
