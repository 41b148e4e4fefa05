/*
 * The UCX substrate's connect(): an endpoint to every peer, then the HELLO
 * and READY rounds over UCX itself; close() runs the BYE round
 * (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The HELLO, READY and BYE rounds.                                         */

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

static const char *round_name(unsigned kind)
{
    return kind == UCX_WIRE_CTRL_HELLO ? "HELLO" : kind == UCX_WIRE_CTRL_READY ? "READY" : "BYE";
}

/* Whether a peer takes part in a round: it has a working endpoint. */
bool ucx__round_peer(const mr_substrate_t *s, const ucx_peer_t *p)
{
    return p->rank != s->base.rank && p->ep != NULL && p->state == P_OK && !p->fail_queued;
}

/*
 * Sends HELLO, READY or BYE to every peer, followed by a flush of the
 * endpoint when asked: a flush completes the wire-up and makes sure that
 * everything sent before has left.
 */
mr_status_t ucx__round_start(mr_substrate_t *s, unsigned kind, bool flush)
{
    for (int r = 0; r < s->base.size; r++) {
        ucx_peer_t *p = &s->peers[r];
        ucp_request_param_t param;
        ucs_status_ptr_t sp;

        if (!ucx__round_peer(s, p)) continue;
        hdr_pack(s, p->conn_hdr, kind, s->hello_token);
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_EAGER;
        sp = ucp_am_send_nbx(p->ep, UCX_AM_CTRL, p->conn_hdr, UCX_WIRE_HDR_LEN, NULL, 0, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: cannot send %s to "
                    "rank %d: %s.", round_name(kind), r, ucs_status_string(UCS_PTR_STATUS(sp)));
            if (s->closed) continue;
            return MR_ERR_TRANSPORT;
        }
        p->conn_req[0] = sp;
        if (!flush) continue;
        memset(&param, 0, sizeof(param));
        sp = ucp_ep_flush_nbx(p->ep, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: cannot flush the "
                    "endpoint to rank %d: %s.", r, ucs_status_string(UCS_PTR_STATUS(sp)));
            if (s->closed) continue;
            return MR_ERR_TRANSPORT;
        }
        p->conn_req[1] = sp;
    }
    return MR_OK;
}

/*
 * Progresses until every peer's message of the round has arrived and ours
 * have left, or the deadline. While connecting, a failure fails the round;
 * in close(), a peer that failed or went away is simply done.
 */
mr_status_t ucx__round_wait(mr_substrate_t *s, unsigned kind, uint64_t deadline)
{
    for (;;) {
        int waiting = 0;

        while (ucp_worker_progress(s->worker) != 0) {
        }
        for (int r = 0; r < s->base.size; r++) {
            ucx_peer_t *p = &s->peers[r];
            ucs_status_t err = UCS_OK;
            bool sent;

            if (r == s->base.rank || (s->closed && !ucx__round_peer(s, p))) continue;
            if (p->fail_queued || p->state != P_OK) {
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: rank %d failed while connecting (%s).", r,
                        p->exited ? "its process exited" : ucs_status_string(p->fail_status));
                return MR_ERR_TRANSPORT;
            }
            sent = ucx__req_done(&p->conn_req[0], &err);
            sent = ucx__req_done(&p->conn_req[1], &err) && sent;
            if (err != UCS_OK) {
                if (s->closed) continue;
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: connecting to rank %d failed: %s.", r,
                        ucs_status_string(err));
                return MR_ERR_TRANSPORT;
            }
            if (!sent || !p->got[kind]) waiting++;
        }
        if (waiting == 0) return MR_OK;
        if (mr__now_ns() >= deadline) {
            char list[512];
            size_t used = 0;
            int listed = 0;
            list[0] = '\0';
            for (int r = 0; r < s->base.size && listed < 16; r++) {
                ucx_peer_t *p = &s->peers[r];
                if (!ucx__round_peer(s, p) ||
                    (p->got[kind] && !p->conn_req[0] && !p->conn_req[1])) {
                    continue;
                }
                int n = snprintf(list + used, sizeof(list) - used, "%s%d (%s%s%s)",
                                 listed ? ", " : "", r, p->got[kind] ? "" : "nothing received; ",
                                 p->conn_req[0] ? "own message not sent; " : "",
                                 p->conn_req[1] ? "endpoint not flushed" : "");
                if (n > 0) used += (size_t)n;
                if (used >= sizeof(list)) used = sizeof(list) - 1;
                listed++;
            }
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: rank %d timed out "
                    "after %u s in the %s round, with %d of its %d peers missing: %s%s.",
                    s->base.rank, s->closed ? UCX_CLOSE_FLUSH_S : s->base.timeout_s,
                    round_name(kind), waiting, s->base.size - 1, list,
                    waiting > listed ? ", ..." : "");
            return MR_ERR_TIMEOUT;
        }
        /* Nothing moved: sleep a little (or until UCX or a watched process has news). */
        if (s->efd >= 0 && ucp_worker_arm(s->worker) == UCS_OK) {
            ucx__check_events(s, UCX_CONNECT_POLL_MS);
        } else {
            ucx__check_events(s, 0);
            sched_yield();
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Endpoints, and connect().                                                */

/* Creates the endpoint to peer `p` from its address, with the error mode it calls for. */
static mr_status_t peer_create_endpoint(mr_substrate_t *s, ucx_peer_t *p, const ucx_wire_addr_t *w)
{
    ucp_ep_params_t ep;
    ucs_status_t us;

    p->same_host = w->boot_hash != 0 && w->boot_hash == s->boot_hash;
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
    return MR_OK;
}

mr_status_t ucx__connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    uint64_t start = mr__now_ns(), deadline;
    mr_status_t st;

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
        ucx_peer_t *p = &s->peers[r];
        ucx_wire_addr_t w;

        if (mr__ucx_wire_addr_decode(blob, addr_len, &w, NULL) != MR_OK) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the address of rank %d is not a valid UCX "
                    "substrate address (wrong magic, version or length).", r);
            return MR_ERR_PROTOCOL;
        }
        p->pid = w.pid;
        if (r == s->base.rank) continue;
        st = peer_create_endpoint(s, p, &w);
        if (st != MR_OK) return st;
        ucx__peer_watch_process(s, p, w.pidns);
    }
    /* Two rounds over UCX itself; see docs/architecture.md. */
    deadline = start + (uint64_t)(s->base.timeout_s ? s->base.timeout_s : 60) * MR_NS_PER_S;
    st = ucx__round_start(s, UCX_WIRE_CTRL_HELLO, true);
    if (st == MR_OK) st = ucx__round_wait(s, UCX_WIRE_CTRL_HELLO, deadline);
    if (st == MR_OK) st = ucx__round_start(s, UCX_WIRE_CTRL_READY, false);
    if (st == MR_OK) st = ucx__round_wait(s, UCX_WIRE_CTRL_READY, deadline);
    if (st != MR_OK) return st;
    s->connected = true;
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d connected to its %d peers in %.3f s "
                "(%zu watched through pidfds).", s->base.rank, s->base.size - 1,
                (double)(mr__now_ns() - start) / 1e9, s->npidfds);
    }
    return MR_OK;
}
