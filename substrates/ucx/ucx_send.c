/*
 * The UCX substrate's send() and send_control(), and the batches of small
 * messages sent as one (mr_batch.h) (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

/* ------------------------------------------------------------------------ */
/* Sending.                                                                 */

/*
 * The endpoint to `dest` if it can take a message (made now for the first
 * message to it), or the status saying why not.
 */
static mr_status_t peer_for_send(mr_substrate_t *s, int dest, ucx_peer_t **out)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    ucx_peer_t *p = &s->peers[dest];
    if (__builtin_expect(p->state != P_OK, 0)) {
        st = ucx__peer_endpoint(s, p);
        if (st != MR_OK) return st;
    }
    if (p->state == P_FAILED || mr__failq_queued(&s->failq, dest)) return MR_ERR_PEER_FAILED;
    if (p->state != P_OK || !s->connected || s->closed) return MR_ERR_INVALID_RANK;
    *out = p;
    return MR_OK;
}

/* Maps a failed ucp_am_send_nbx() to a status for the core. */
static mr_status_t send_error(mr_substrate_t *s, int dest, ucs_status_t us)
{
    if (ucx__is_peer_gone_status(us)) {
        ucx__peer_fail(s, dest, us);
        return MR_ERR_PEER_FAILED;
    }
    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: sending to rank %d failed: %s.", dest,
            ucs_status_string(us));
    return MR_ERR_TRANSPORT;
}

/*
 * Sends the batch being filled for `dest` as one eager message (mr_batch.h).
 * MR_AGAIN when no send state is free: it stays open.
 */
static mr_status_t batch_send(mr_substrate_t *s, ucx_peer_t *p)
{
    mr__batch_t *b = s->batcher.open[p->rank];
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r = sreq_pop(&s->free_sreqs);

    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->link.cookie = NULL;
    r->dest = p->rank;
    hdr_pack(s, r->hdr, UCX_WIRE_DATA_BATCH, 0);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.send = ucx__send_cb;
    param.flags = UCP_AM_SEND_FLAG_EAGER; /* The receiver copies frames out of UCX's buffer. */
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    sp = ucp_am_send_nbx(p->ep, UCX_AM_DATA, r->hdr, UCX_WIRE_HDR_LEN, b->data,
                         mr__batcher_used(&s->batcher, p->rank), &param);
    if (UCS_PTR_IS_ERR(sp)) {
        mr__sreq_push(&s->free_sreqs, &r->link);
        return send_error(s, p->rank, UCS_PTR_STATUS(sp));
    }
    mr__batcher_detach(&s->batcher, p->rank);
    if (sp == NULL) {
        /* UCX copied it out: the batch takes the next messages at once. */
        mr__sreq_push(&s->free_sreqs, &r->link);
        mr__batcher_release(&s->batcher, b);
    } else {
        r->batch = b;
        r->inflight = true;
    }
    return MR_OK;
}

/* batch_send() for mr__batcher_route(). */
static mr_status_t batch_send_to(void *ctx, int dest)
{
    mr_substrate_t *s = ctx;

    return batch_send(s, &s->peers[dest]);
}

/*
 * At the start of a progress call: sends every batch being filled that can
 * go; those to failed ranks complete unsent.
 */
void ucx__flush_batches(mr_substrate_t *s)
{
    /* Backwards: detaching moves the last open rank into the slot just visited. */
    for (unsigned i = s->batcher.nopen; i-- > 0;) {
        int dest = s->batcher.open_ranks[i];
        ucx_peer_t *p = NULL;
        if (peer_for_send(s, dest, &p) == MR_OK) {
            batch_send(s, p); /* Refused: it waits for the next call. */
        } else {
            batch_done_push(s, mr__batcher_detach(&s->batcher, dest));
        }
    }
}

/* send() of a message that no open batch takes at once (ucx__send()). */
static __attribute__((noinline)) mr_status_t send_slow(mr_substrate_t *s, int dest, unsigned kind,
                                                       uint32_t imm, const void *data,
                                                       size_t length, void *cookie)
{
    ucx_peer_t *p = NULL;
    mr_status_t st;
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r;
    bool packed;

    st = peer_for_send(s, dest, &p);
    if (st != MR_OK) return st;
    if (length > s->base.datagram_size) return MR_ERR_MESSAGE_TOO_LONG;
    if (kind < MR_KIND_DATA || kind > MR_KIND_HANDLER || (data == NULL && length > 0)) {
        return MR_ERR_INVALID_PARAM;
    }
    /* A small message after another to the same rank joins a batch (mr_batch.h). */
    st = mr__batcher_route(&s->batcher, dest, kind, imm, data, length, batch_send_to, s, &packed);
    if (st != MR_OK) return st;
    if (packed) return MR_SUBSTRATE_SENT;
    r = sreq_pop(&s->free_sreqs);
    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->link.cookie = cookie;
    r->dest = dest;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.send = ucx__send_cb;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    if (s->bare && imm == 0 && s->failures_seen == 0) {
        /* Nothing to say but who sent it and what it is: the AM id says both. */
        unsigned id = UCX_AM_BARE + UCX_BARE_KINDS * (unsigned)s->base.rank;
        if (kind == MR_KIND_HANDLER && length > UCX_WIRE_HFRONT_MIN &&
            length <= UCX_WIRE_HFRONT_MAX) {
            /* The handler's id goes in front (ucx_wire.h), eager: never received into a slot as is. */
            mr__ucx_wire_hfront_encode(r->hdr, ((const uint8_t *)data)[length - 1]);
            r->iov[0].buffer = r->hdr;
            r->iov[0].length = UCX_WIRE_HFRONT_LEN;
            r->iov[1].buffer = (void *)data;
            r->iov[1].length = length - 1;
            param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
            param.datatype = ucp_dt_make_iov();
            param.flags = UCP_AM_SEND_FLAG_EAGER;
            sp = ucp_am_send_nbx(p->ep, id + UCX_BARE_HFRONT, NULL, 0, r->iov, 2, &param);
        } else {
            sp = ucp_am_send_nbx(p->ep, id + kind - MR_KIND_DATA, NULL, 0, data, length, &param);
        }
    } else {
        hdr_pack(s, r->hdr, kind, imm);
        sp = ucp_am_send_nbx(p->ep, UCX_AM_DATA, r->hdr, UCX_WIRE_HDR_LEN, data, length, &param);
    }
    if (UCS_PTR_IS_ERR(sp)) {
        mr__sreq_push(&s->free_sreqs, &r->link);
        return send_error(s, dest, UCS_PTR_STATUS(sp));
    }
    if (sp == NULL) {
        /* UCX copied it out already: the core may reuse the buffer now. */
        mr__sreq_push(&s->free_sreqs, &r->link);
        return MR_SUBSTRATE_SENT;
    }
    r->inflight = true;
    return MR_OK;
}

mr_status_t ucx__send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                      const void *data, size_t length, void *cookie)
{
    /* The stream's common case: the open batch of `dest` takes it, copied. */
    if (imm == 0 && data != NULL && mr__batcher_append(&s->batcher, dest, kind, data, length)) {
        return MR_SUBSTRATE_SENT;
    }
    return send_slow(s, dest, kind, imm, data, length, cookie);
}

mr_status_t ucx__send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    ucx_peer_t *p = NULL;
    mr_status_t st = peer_for_send(s, dest, &p);
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r;

    if (st != MR_OK) return st;
    r = sreq_pop(&s->free_ctrl);
    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->dest = dest;
    hdr_pack(s, r->hdr, UCX_WIRE_CTRL_CREDIT, imm);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.request = r;
    param.cb.send = ucx__send_cb;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    sp = ucp_am_send_nbx(p->ep, UCX_AM_CTRL, r->hdr, UCX_WIRE_HDR_LEN, NULL, 0, &param);
    if (UCS_PTR_IS_ERR(sp)) {
        ctrl_free(s, r);
        return send_error(s, dest, UCS_PTR_STATUS(sp));
    }
    if (sp == NULL) ctrl_free(s, r);
    else r->inflight = true;
    return MR_OK;
}
