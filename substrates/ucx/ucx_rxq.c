/*
 * The UCX substrate's arrival queue: arrivals that wait for a receive slot
 * or for a rendezvous to complete, delivered in arrival order; the
 * rendezvous receives and the spill area it uses (ucx_substrate.h lists the
 * other files).
 */
#include "ucx_substrate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The spill area.                                                           */

/* Copies `len` bytes aside for a waiting entry; false only when out of memory. */
bool ucx__spill_store(mr_substrate_t *s, ucx_rx_t *e, const void *data, size_t len)
{
    size_t need = align_up(len ? len : 1, 16), off = SIZE_MAX, end = 0;

    if (s->spill_cap >= need) {
        if (s->spill_used == 0) s->spill_head = s->spill_tail = 0;
        if (s->spill_tail >= s->spill_head && s->spill_used < s->spill_cap) {
            if (s->spill_cap - s->spill_tail >= need) {
                off = s->spill_tail;
            } else if (s->spill_head >= need) {
                /* Wrap: the gap at the end is freed with this entry. */
                s->spill_used += s->spill_cap - s->spill_tail;
                off = 0;
            }
        } else if (s->spill_tail < s->spill_head && s->spill_head - s->spill_tail >= need) {
            off = s->spill_tail;
        }
    }
    e->state = RX_SPILL;
    e->length = len;
    if (off != SIZE_MAX) {
        end = off + need;
        s->spill_tail = end;
        s->spill_used += need;
        e->heap = false;
        e->data = s->spill + off;
        e->spill_end = end;
    } else {
        e->heap = true;
        e->data = malloc(len ? len : 1);
        if (e->data == NULL) return false;
        s->spilled_heap++;
        if (!s->spill_warned) {
            s->spill_warned = true;
            MR__LOG(s, MR_LOG_WARN, "UCX substrate: every receive slot is taken and the %zu-byte "
                    "spill area is full: messages are copied to the heap. Use credit flow control "
                    "(MAILRAIL_FLOWCTL=rank or node) or raise MAILRAIL_UCX_SPILL_SIZE.",
                    s->spill_cap);
        }
    }
    if (len > 0) memcpy(e->data, data, len);
    s->spilled++;
    return true;
}

/* Releases the copy of a spilled entry (in FIFO order for the arena). */
static void spill_release(mr_substrate_t *s, ucx_rx_t *e)
{
    if (e->heap) {
        free(e->data);
    } else {
        size_t start = s->spill_head;
        size_t freed = e->spill_end > start ? e->spill_end - start
                                            : (s->spill_cap - start) + e->spill_end;
        s->spill_used -= freed < s->spill_used ? freed : s->spill_used;
        s->spill_head = e->spill_end;
        if (s->spill_used == 0) s->spill_head = s->spill_tail = 0;
    }
    e->data = NULL;
}

/* ------------------------------------------------------------------------ */
/* The arrival queue.                                                        */

/* A new entry at the tail, or NULL when out of memory (the queue doubles when full). */
ucx_rx_t *ucx__rxq_push(mr_substrate_t *s)
{
    if (s->rxq_count == s->rxq_cap) {
        size_t cap = s->rxq_cap * 2;
        ucx_rx_t *q = malloc(cap * sizeof(*q));
        if (q == NULL) return NULL;
        for (size_t i = 0; i < s->rxq_count; i++) q[i] = *rxq_at(s, i);
        free(s->rxq);
        s->rxq = q;
        s->rxq_cap = cap;
        s->rxq_head = 0;
    }
    ucx_rx_t *e = &s->rxq[(s->rxq_head + s->rxq_count) & (s->rxq_cap - 1)];
    s->rxq_count++;
    memset(e, 0, sizeof(*e));
    return e;
}

/*
 * Counts an entry that starts waiting for a slot (held, spilled or a
 * rendezvous not started) into held(): a data batch whose bytes are here by
 * its frames, each a message with a credit of its own; anything else as one.
 * A batch waits whole, so the count stays right until it gets a slot.
 */
void ucx__rx_wait(mr_substrate_t *s, ucx_rx_t *e)
{
    uint32_t n = 1;

    if (e->kind == MR_KIND_BATCH && e->state != RX_RNDV_WAIT) {
        size_t frames = mr__batch_frames_from(e->data, e->length, 0);
        if (frames > 1) n = (uint32_t)frames;
    }
    e->frames = n;
    s->rxq_waiting += n;
}

/* A waiting entry got a slot or was delivered in place: held() no longer counts it. */
static void rx_unwait(mr_substrate_t *s, ucx_rx_t *e)
{
    s->rxq_waiting -= e->frames;
    e->frames = 0;
}

static void rxq_pop(mr_substrate_t *s)
{
    s->rxq_head = (s->rxq_head + 1) & (s->rxq_cap - 1);
    s->rxq_count--;
}

/* ------------------------------------------------------------------------ */
/* Rendezvous receives.                                                     */

void ucx__rreq_free(mr_substrate_t *s, ucx_rreq_t *r)
{
    r->next = s->free_rreqs;
    s->free_rreqs = r;
}

static void recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_rreq_t *r = request;

    (void)length;
    (void)user_data;
    r->status = status;
    r->done = true;
}

/*
 * Starts receiving a rendezvous into a fresh slot. The entry becomes
 * RX_READY, RX_RECEIVING or RX_FAILED; false (nothing changed) when no slot
 * or no receive state is free.
 */
bool ucx__rx_start_rndv(mr_substrate_t *s, ucx_rx_t *e, void *desc)
{
    ucx_rreq_t *r = s->free_rreqs;
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    void *slot;

    if (r == NULL) return false;
    slot = s->base.up.recv_slot_acquire(s->base.core);
    if (slot == NULL) return false;
    rx_unwait(s, e);
    s->free_rreqs = r->next;
    r->done = false;
    r->status = UCS_INPROGRESS;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.recv_am = recv_cb;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    e->data = slot;
    sp = ucp_am_recv_data_nbx(s->worker, desc, slot, e->length, &param);
    if (sp == NULL) {
        ucx__rreq_free(s, r);
        e->state = RX_READY;
    } else if (UCS_PTR_IS_ERR(sp)) {
        ucx__rreq_free(s, r);
        e->state = RX_FAILED;
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: cannot receive a %zu-byte rendezvous message from "
                "rank %d: %s; it is lost.", e->length, (int)e->source,
                ucs_status_string(UCS_PTR_STATUS(sp)));
    } else {
        e->state = RX_RECEIVING;
        e->rreq = r;
        s->nreceiving++;
    }
    s->rndv_received++;
    return true;
}

/* A receiving entry whose rendezvous completed becomes ready or failed. */
static void rx_finish_rndv(mr_substrate_t *s, ucx_rx_t *e)
{
    ucx_rreq_t *r = e->rreq;

    e->rreq = NULL;
    s->nreceiving--;
    if (r->status == UCS_OK) {
        e->state = RX_READY;
    } else {
        e->state = RX_FAILED;
        if (!s->base.closing && !s->closed) {
            MR__LOG(s, MR_LOG_WARN, "UCX substrate: a %zu-byte rendezvous message from rank %d "
                    "failed: %s; it is lost.", e->length, (int)e->source,
                    ucs_status_string(r->status));
        }
    }
    ucx__rreq_free(s, r);
}

/* ------------------------------------------------------------------------ */
/* Delivery in arrival order.                                               */

/*
 * Gives a waiting entry a slot: copies a held buffer or a spilled copy into
 * it, or starts the rendezvous. false when no slot is free.
 */
static bool rx_claim(mr_substrate_t *s, ucx_rx_t *e)
{
    void *slot;

    if (e->state == RX_RNDV_WAIT) return ucx__rx_start_rndv(s, e, e->data);
    slot = s->base.up.recv_slot_acquire(s->base.core);
    if (slot == NULL) return false;
    rx_unwait(s, e);
    if (e->length > 0) memcpy(slot, e->data, e->length);
    if (e->state == RX_HELD) ucp_am_data_release(s->worker, e->data);
    else spill_release(s, e);
    e->data = slot;
    e->state = RX_READY;
    return true;
}

static void deliver_slot(mr_substrate_t *s, int source, unsigned kind, uint32_t imm, void *slot,
                         size_t length)
{
    mr_status_t st = s->base.up.deliver(s->base.core, source, kind, imm, slot, length, NULL);
    if (st != MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank %d "
                "(status %d).", source, (int)st);
    }
}

/*
 * Delivers what the head of the queue allows and hands slots to waiting
 * entries in arrival order. Upcalls: progress() only. Returns the deliveries.
 */
int ucx__rx_drain(mr_substrate_t *s)
{
    int n = 0;

    while (s->rxq_count > 0) {
        ucx_rx_t *e = rxq_at(s, 0);

        if (e->state == RX_RECEIVING) {
            if (!e->rreq->done) break;
            rx_finish_rndv(s, e);
        }
        if (e->state == RX_READY || e->state == RX_FAILED) {
            ucx_rx_t c = *e;
            rxq_pop(s);
            s->rxq_claimed--;
            if (c.state == RX_READY) {
                deliver_slot(s, c.source, c.kind, c.imm, c.data, c.length);
                n++;
            } else {
                s->base.up.recv_slot_abandon(s->base.core, c.data);
            }
            continue;
        }
        /* The head waits for a slot. */
        if (e->state == RX_HELD && e->kind != MR_KIND_BATCH && zcopy_ok(s, e->length)) {
            mr_status_t st = s->base.up.deliver(s->base.core, e->source, e->kind, e->imm, e->data,
                                                e->length, e->data);
            if (st == MR_AGAIN) break;
            rx_unwait(s, e);
            if (st != MR_OK) {
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank %d "
                        "(status %d).", (int)e->source, (int)st);
                ucp_am_data_release(s->worker, e->data);
            } else {
                s->zcopy_delivered++;
                n++;
            }
            rxq_pop(s);
            continue;
        }
        if (!rx_claim(s, e)) break;
        s->rxq_claimed++;
    }
    /* Waiting entries behind a rendezvous in flight may take slots, in order. */
    while (s->rxq_claimed < s->rxq_count && s->rxq_claimed > 0) {
        if (!rx_claim(s, rxq_at(s, s->rxq_claimed))) break;
        s->rxq_claimed++;
    }
    return n;
}



/* ------------------------------------------------------------------------ */
/* Closing.                                                                 */

/* Whether a rendezvous receive is still under way (close() only). */
bool ucx__rx_any_receiving(mr_substrate_t *s)
{
    for (size_t i = 0; i < s->rxq_count; i++) {
        ucx_rx_t *e = rxq_at(s, i);
        if (e->state == RX_RECEIVING && !e->rreq->done) return true;
    }
    return false;
}
