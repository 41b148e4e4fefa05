/*
 * The UCX substrate's send states: the pool (in blocks, UCX's request before
 * each), UCX's send callback, and the completion of sent batches
 * (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Send state.                                                               */

ucx_sreq_t *ucx__sreq_at(const mr_substrate_t *s, const ucx_sreq_block_t *b, size_t i)
{
    return (ucx_sreq_t *)(void *)(b->mem + i * s->sreq_stride + align_up(s->ucx_req_size, 64));
}

/*
 * Adds a block of `ndata` data and `nctrl` control send states to the free
 * lists. Not on the hot path: at open, and when a peer's sends are retired.
 */
mr_status_t ucx__sreq_block_add(mr_substrate_t *s, size_t ndata, size_t nctrl)
{
    ucx_sreq_block_t *blocks = realloc(s->sreq_blocks,
                                       (s->nsreq_blocks + 1) * sizeof(*s->sreq_blocks));
    ucx_sreq_block_t *b;

    if (blocks == NULL) return MR_ERR_NO_MEMORY;
    s->sreq_blocks = blocks;
    b = &blocks[s->nsreq_blocks];
    b->n = ndata + nctrl;
    b->mem = aligned_alloc(64, s->sreq_stride * b->n);
    if (b->mem == NULL) return MR_ERR_NO_MEMORY;
    s->nsreq_blocks++;
    memset(b->mem, 0, s->sreq_stride * b->n);
    for (size_t i = b->n; i-- > 0;) {
        ucx_sreq_t *r = ucx__sreq_at(s, b, i);
        r->s = s;
        r->ctrl = i >= ndata;
        if (r->ctrl) {
            ctrl_free(s, r);
        } else {
            mr__sreq_push(&s->free_sreqs, &r->link);
        }
    }
    return MR_OK;
}

/* Frees the batches sent (or given up); returns how many. */
int ucx__batches_complete(mr_substrate_t *s)
{
    int n = 0;

    while (s->batches_done != NULL) {
        mr__batch_t *b = s->batches_done;
        s->batches_done = b->next_free;
        mr__batcher_release(&s->batcher, b);
        n++;
    }
    return n;
}

void ucx__send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_sreq_t *r = request;
    mr_substrate_t *s = r->s;

    (void)user_data;
    if (r->retired) return; /* Already reported; its memory is never used again. */
    r->inflight = false;
    if (status != UCS_OK && !s->base.closing && !s->closed && ucx__is_peer_gone_status(status)) {
        ucx__peer_fail(s, r->dest, status);
    }
    if (r->ctrl) {
        ctrl_free(s, r);
        return;
    }
    if (r->batch != NULL) {
        batch_done_push(s, r->batch);
        r->batch = NULL;
        mr__sreq_push(&s->free_sreqs, &r->link);
        return;
    }
    mr__done_push(&s->done, &r->link);
}
