/*
 * The UCX substrate's active-message handlers: headers checked, data
 * delivered at once or queued (ucx_rxq.c), control messages passed on or
 * kept for progress() (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Active-message handlers (inside ucp_worker_progress()).                   */

/* Logs a malformed message, the first few at error level, then only at debug level. */
static void proto_error(mr_substrate_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void proto_error(mr_substrate_t *s, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    mr_log_level_t level;

    s->proto_errors++;
    level = s->proto_errors <= UCX_PROTO_LOG_BURST ? MR_LOG_ERROR : MR_LOG_DEBUG;
    if (s->base.log == NULL || !mr__log_enabled(&s->base, level)) return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    s->base.log(level, "UCX substrate: dropped a malformed message (%s)%s.", what,
                s->proto_errors == UCX_PROTO_LOG_BURST
                    ? "; further ones are logged at debug level"
                    : "");
}

/* Checks a header; fills kind, imm and source, or logs and returns false. */
static bool hdr_parse(mr_substrate_t *s, const char *what, const void *header, size_t header_len,
                      uint8_t *kind, uint32_t *imm, int *source)
{
    ucx_wire_hdr_t h;
    ucx_wire_error_t err;

    if (mr__ucx_wire_hdr_decode(header, header_len, s->base.rank, s->base.size, &h, &err) !=
        MR_OK) {
        if (err.fault == UCX_WIRE_BAD_HDR_LEN) {
            proto_error(s, "%s header of %zu bytes instead of %d", what, header_len,
                        UCX_WIRE_HDR_LEN);
        } else {
            proto_error(s, "%s from rank %d, which is not a peer in a job of %d", what,
                        (int)err.value, s->base.size);
        }
        return false;
    }
    *kind = h.kind;
    *imm = h.imm;
    *source = h.source;
    /*
     * The sender knows of more failed peers than we do: look at the pidfds
     * now, so that a failure is reported no later than a message sent after
     * its discovery (rate-limited for failures a pidfd cannot show).
     */
    if (h.failures_seen > s->failures_seen && s->npidfds > 0) {
        uint64_t now = mr__now_ns();
        if (now >= s->next_hinted_check) {
            s->next_hinted_check = now + UCX_HINTED_CHECK_US * 1000;
            ucx__check_events(s, 0);
        }
    }
    return true;
}

/* A new arrival at the tail of the queue, or NULL (logged: it is lost) when out of memory. */
static ucx_rx_t *rx_enqueue(mr_substrate_t *s, int source, unsigned kind, uint32_t imm,
                            size_t length)
{
    ucx_rx_t *e = ucx__rxq_push(s);

    if (e == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for the arrival queue; a %zu-byte "
                "message from rank %d is lost.", length, source);
        return NULL;
    }
    e->kind = (uint8_t)kind;
    e->imm = imm;
    e->source = source;
    e->length = length;
    return e;
}

/* Copies the tail arrival `e` into the spill area; out of memory, it is dropped and logged. */
static void rx_spill(mr_substrate_t *s, ucx_rx_t *e, const void *data)
{
    if (ucx__spill_store(s, e, data, e->length)) {
        ucx__rx_wait(s, e);
        return;
    }
    s->rxq_count--; /* Undo the push. */
    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for a %zu-byte message from rank %d "
            "arriving while every receive slot is taken; it is lost.", e->length, (int)e->source);
}

/*
 * A batch of handler or item messages (mr_batch.h): each frame is copied into a
 * receive slot of its own, or, behind earlier arrivals or with no slot free,
 * into the spill area to wait in the arrival queue like any message.
 */
static ucs_status_t batch_recv(mr_substrate_t *s, int source, const uint8_t *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    bool direct = s->upcalls_ok && s->rxq_count == 0;
    size_t off = 0, plen;
    const uint8_t *payload;
    unsigned kind;
    int r;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        proto_error(s, "a batch from rank %d sent by rendezvous", source);
        return UCS_OK;
    }
    if (direct && s->base.up.deliver_now_frames != NULL) {
        /* Handlers' messages run here, in UCX's callback, as far as they go. */
        s->cb_events += s->base.up.deliver_now_frames(s->base.core, source, data, length, &off);
    }
    while ((r = mr__batch_frame_next(data, length, &off, &kind, &payload, &plen)) == 1) {
        if (direct && kind == MR_KIND_HANDLER &&
            mr__deliver_handler_trailer(&s->base, source, 0, payload, plen) == MR_OK) {
            s->cb_events++;
            continue;
        }
        if (direct &&
            s->base.up.deliver_copy(s->base.core, source, kind, 0, payload, plen) == MR_OK) {
            s->cb_events++;
            continue;
        }
        direct = false; /* The rest queue behind this one, in order. */
        ucx_rx_t *e = rx_enqueue(s, source, kind, 0, plen);
        if (e != NULL) rx_spill(s, e, payload);
    }
    if (r < 0) proto_error(s, "a batch from rank %d whose frames do not add up", source);
    return UCS_OK;
}

/*
 * One arriving data message, from either handler: delivered, queued or held.
 * `now_tried`: a handler's message the core already refused to run at once.
 */
static ucs_status_t data_recv(mr_substrate_t *s, unsigned kind, uint32_t imm, int source,
                             void *data, size_t length, const ucp_am_recv_param_t *param,
                             bool now_tried)
{
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool holdable = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    bool may_claim;
    ucx_rx_t *e;
    void *slot;

    if (length > s->base.datagram_size) {
        proto_error(s, "%zu-byte data from rank %d, more than the %zu-byte datagram", length,
                    source, s->base.datagram_size);
        return UCS_OK;
    }
    if (kind == UCX_WIRE_DATA_BATCH) {
        /* A batch holds one kind (mr_batch.h): data goes to the core whole, the rest frame by frame. */
        if (!mr__batch_is_data(data, length)) {
            return batch_recv(s, source, data, length, param);
        }
        kind = MR_KIND_BATCH;
    }
    /* A slot may be taken now only when no earlier arrival still waits for one. */
    may_claim = s->upcalls_ok && s->rxq_claimed == s->rxq_count;

    if (may_claim && s->rxq_count == 0) {
        /* Fast path: nothing queued, deliver at once. */
        if (!rndv) {
            /* A handler's message is consumed here, in UCX's callback, without a slot. */
            if (kind == MR_KIND_HANDLER && !now_tried &&
                mr__deliver_handler_trailer(&s->base, source, imm, data, length) == MR_OK) {
                s->cb_events++;
                return UCS_OK;
            }
            if (holdable && kind != MR_KIND_BATCH && zcopy_ok(s, length)) {
                mr_status_t st = s->base.up.deliver(s->base.core, source, kind, imm, data,
                                                    length, data);
                if (st == MR_OK) {
                    s->zcopy_delivered++;
                    s->cb_events++;
                    return UCS_INPROGRESS;
                }
                if (st != MR_AGAIN) {
                    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank "
                            "%d (status %d).", source, (int)st);
                    return UCS_OK;
                }
            } else if (s->base.up.deliver_copy(s->base.core, source, kind, imm, data, length) ==
                       MR_OK) {
                s->cb_events++;
                return UCS_OK;
            }
            may_claim = false; /* No slot: the message waits. */
        }
    }

    e = rx_enqueue(s, source, kind, imm, length);
    if (e == NULL) return UCS_OK;
    if (rndv) {
        e->state = RX_RNDV_WAIT;
        e->data = data;
        ucx__rx_wait(s, e);
        if (may_claim && ucx__rx_start_rndv(s, e, data)) {
            s->rxq_claimed++;
            /* Completed at once with nothing ahead: deliver now. */
            if (e->state == RX_READY && s->rxq_count == 1) s->cb_events += ucx__rx_drain(s);
        }
        return UCS_INPROGRESS; /* UCX keeps the descriptor, or the receive owns it. */
    }
    if (may_claim && (slot = s->base.up.recv_slot_acquire(s->base.core)) != NULL) {
        /* Behind a rendezvous in flight: copy now, deliver in turn. */
        if (length > 0) memcpy(slot, data, length);
        e->state = RX_READY;
        e->data = slot;
        s->rxq_claimed++;
        return UCS_OK;
    }
    if (holdable) {
        e->state = RX_HELD;
        e->data = data;
        ucx__rx_wait(s, e);
        s->held++;
        return UCS_INPROGRESS;
    }
    rx_spill(s, e, data);
    return UCS_OK;
}

static ucs_status_t data_am_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    mr_substrate_t *s = arg;
    uint8_t kind;
    uint32_t imm;
    int source;

    if (s->closed) return UCS_OK; /* Finalizing: nobody receives any more. */
    if (!hdr_parse(s, "data", header, header_length, &kind, &imm, &source)) return UCS_OK;
    return data_recv(s, kind, imm, source, data, length, param, false);
}

/* Header-less data (UCX_AM_BARE): the handler's argument is the sender's peer entry. */
static ucs_status_t bare_recv(ucx_peer_t *p, unsigned kind, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param, bool now_tried)
{
    mr_substrate_t *s = p->s;

    if (s->closed) return UCS_OK;
    if (header_length != 0) {
        proto_error(s, "header-less data from rank %d with a %zu-byte header", p->rank,
                    header_length);
        return UCS_OK;
    }
    s->bare_received++;
    return data_recv(s, kind, 0, p->rank, data, length, param, now_tried);
}

static ucs_status_t bare_data_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    return bare_recv(arg, MR_KIND_DATA, header_length, data, length, param, false);
}

static ucs_status_t bare_items_am_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    return bare_recv(arg, MR_KIND_ITEMS, header_length, data, length, param, false);
}

static ucs_status_t bare_handler_am_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ucx_peer_t *p = arg;
    mr_substrate_t *s = p->s;
    bool now_tried = false;

    (void)header;
    /* data_recv()'s common case first: nothing waits, so the handler runs here and now. */
    if (__builtin_expect(header_length == 0 && s->upcalls_ok && s->rxq_count == 0 && !s->closed &&
                             (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 &&
                             length <= s->base.datagram_size,
                         1)) {
        if (mr__deliver_handler_trailer(&s->base, p->rank, 0, data, length) == MR_OK) {
            s->bare_received++;
            s->cb_events++;
            return UCS_OK;
        }
        now_tried = true; /* Not twice: the handler may have run and asked to be called again. */
    }
    return bare_recv(p, MR_KIND_HANDLER, header_length, data, length, param, now_tried);
}

/* A handler's message with its id in front, rewritten with the id last and received as any other. */
static __attribute__((noinline)) ucs_status_t hfront_recv_slow(mr_substrate_t *s, int source,
                                                               uint8_t id, const uint8_t *payload,
                                                               size_t length, bool now_tried)
{
    ucp_am_recv_param_t copied = {.recv_attr = 0}; /* Neither rendezvous nor to be held. */

    s->hfront_rewritten++;
    if (length > 0) memcpy(s->hfront_scratch, payload, length);
    s->hfront_scratch[length] = id;
    return data_recv(s, MR_KIND_HANDLER, 0, source, s->hfront_scratch, length + 1, &copied,
                     now_tried);
}

/*
 * A header-less handler's message with its id in front (UCX_BARE_HFRONT,
 * ucx_wire.h): its handler runs here when nothing waits; otherwise it is
 * received as any other, in the core's layout.
 */
static ucs_status_t bare_hfront_am_cb(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ucx_peer_t *p = arg;
    mr_substrate_t *s = p->s;
    ucx_wire_error_t err;
    const uint8_t *payload;
    uint8_t id;

    (void)header;
    if (s->closed) return UCS_OK;
    if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        mr__ucx_wire_hfront_decode(data, length, &id, &err) != MR_OK ||
        length - UCX_WIRE_HFRONT_LEN >= s->hfront_cap) {
        proto_error(s, "a handler's message of %zu bytes from rank %d with a %zu-byte header, "
                    "by %s, or with a bad prefix", length, p->rank, header_length,
                    (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? "rendezvous" : "eager");
        return UCS_OK;
    }
    payload = (const uint8_t *)data + UCX_WIRE_HFRONT_LEN;
    s->bare_received++;
    if (!s->upcalls_ok || s->rxq_count != 0) {
        return hfront_recv_slow(s, p->rank, id, payload, length - UCX_WIRE_HFRONT_LEN, false);
    }
    if (s->base.up.deliver_handler_now(s->base.core, p->rank, 0, id, payload,
                                       length - UCX_WIRE_HFRONT_LEN) != MR_OK) {
        /* Not twice: the handler may have run and asked to be called again. */
        return hfront_recv_slow(s, p->rank, id, payload, length - UCX_WIRE_HFRONT_LEN, true);
    }
    s->cb_events++;
    return UCS_OK;
}

static void ctrlq_push(mr_substrate_t *s, int source, uint32_t imm)
{
    if (s->ctrlq_count == s->ctrlq_cap) {
        size_t cap = s->ctrlq_cap ? s->ctrlq_cap * 2 : 64;
        uint32_t *q = malloc(cap * 2 * sizeof(*q));
        if (q == NULL) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory; a control message from rank "
                    "%d is lost.", source);
            return;
        }
        for (size_t i = 0; i < s->ctrlq_count; i++) {
            size_t k = (s->ctrlq_head + i) % s->ctrlq_cap;
            q[2 * i] = s->ctrlq[2 * k];
            q[2 * i + 1] = s->ctrlq[2 * k + 1];
        }
        free(s->ctrlq);
        s->ctrlq = q;
        s->ctrlq_cap = cap;
        s->ctrlq_head = 0;
    }
    size_t k = (s->ctrlq_head + s->ctrlq_count) % s->ctrlq_cap;
    s->ctrlq[2 * k] = (uint32_t)source;
    s->ctrlq[2 * k + 1] = imm;
    s->ctrlq_count++;
}

static ucs_status_t ctrl_am_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    mr_substrate_t *s = arg;
    uint8_t kind;
    uint32_t imm;
    int source;

    (void)data;
    if (!hdr_parse(s, "control", header, header_length, &kind, &imm, &source)) return UCS_OK;
    if (length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        proto_error(s, "control message from rank %d with a %zu-byte payload", source, length);
        return UCS_OK;
    }
    switch (kind) {
    case UCX_WIRE_CTRL_CREDIT:
        if (s->closed) break;
        if (s->upcalls_ok) {
            s->base.up.control(s->base.core, source, imm);
            s->cb_events++;
        } else {
            ctrlq_push(s, source, imm);
        }
        break;
    default:
        proto_error(s, "control message of unknown kind %u from rank %d", kind, source);
        break;
    }
    return UCS_OK;
}

/* ------------------------------------------------------------------------ */
/* Upcall drains (progress() only).                                         */

int ucx__drain_ctrlq(mr_substrate_t *s)
{
    int n = 0;

    while (s->ctrlq_count > 0) {
        size_t k = s->ctrlq_head;
        s->ctrlq_head = (s->ctrlq_head + 1) % s->ctrlq_cap;
        s->ctrlq_count--;
        s->base.up.control(s->base.core, (int)s->ctrlq[2 * k], s->ctrlq[2 * k + 1]);
        n++;
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* Setting the handlers (open()).                                           */

/* The handlers of the data and the control active messages. */
mr_status_t ucx__set_handlers(mr_substrate_t *s)
{
    ucp_am_handler_param_t hparam;
    ucs_status_t us;

    memset(&hparam, 0, sizeof(hparam));
    hparam.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                        UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hparam.flags = UCP_AM_FLAG_WHOLE_MSG;
    hparam.arg = s;
    hparam.id = UCX_AM_DATA;
    hparam.cb = data_am_cb;
    us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
    if (us == UCS_OK) {
        hparam.id = UCX_AM_CTRL;
        hparam.cb = ctrl_am_cb;
        us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
    }
    /* Header-less data from each peer, in jobs small enough to name them all. */
    for (int r = 0; us == UCS_OK && s->bare_ids && r < s->base.size; r++) {
        hparam.arg = &s->peers[r];
        static const ucp_am_recv_callback_t cbs[UCX_BARE_KINDS] = {
            bare_data_am_cb, bare_items_am_cb, bare_handler_am_cb, bare_hfront_am_cb};
        for (int k = 0; us == UCS_OK && k < UCX_BARE_KINDS; k++) {
            hparam.id = (unsigned)(UCX_AM_BARE + UCX_BARE_KINDS * r + k);
            hparam.cb = cbs[k];
            us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
        }
    }
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot set the active-message handlers: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}
