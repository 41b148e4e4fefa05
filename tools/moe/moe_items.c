/*
 * mailrail_moe over MailRail's item layer (--pack): each token (or piece of
 * one) is an item of 8 + H bytes, and an aggregator packs the items to each
 * rank into datagrams, so that a datagram of MAILRAIL_DATAGRAM_SIZE bytes
 * carries as many tokens as fit: fewer, larger transport messages, as a
 * fine-grained messaging user would send them (YGM, Conveyors). Two
 * aggregators, created in the same order on every rank: the dispatch and
 * the combine. An expert's rank pulls a token zero copy, transforms it and
 * pushes the result; a partly filled datagram leaves when its rank runs out
 * of work (mr_items_flush), so that nothing waits for a datagram to fill.
 * With +h both aggregators have item handlers instead of pulls (moe_step.h).
 */
#include "mailrail_items.h"
#include "moe_step.h"
#include "tool_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Items handed out by one pull: at most one datagram's. */
#define MOE_PULL_BATCH 64

/* Pushes one result to the combine aggregator, or parks it when no send buffer is free. */
static mr_status_t moe_items_reply(moe_rank_t *r, const uint8_t *msg, size_t len, int source)
{
    size_t out = moe_expert(r, msg, len, source, r->scratch);
    mr_status_t st;

    if (out == 0) return MR_OK; /* Broke the protocol: counted and named. */
    if (r->parked_head == r->parked_len) {
        st = mr_items_push(r->combine_items, r->scratch, out, source);
        if (st != MR_AGAIN) return st;
    }
    return moe_park_result(r, r->scratch, out, source) ? MR_OK : MR_ERR_NO_MEMORY;
}

/* Pushes the parked results while send buffers are free. */
static mr_status_t moe_items_unpark(moe_rank_t *r)
{
    const uint8_t *result;
    size_t len;
    int dest;

    while (moe_parked_peek(r, &result, &len, &dest)) {
        mr_status_t st = mr_items_push(r->combine_items, result, len, dest);
        if (st != MR_OK) return st == MR_AGAIN ? MR_OK : st;
        moe_parked_pop(r);
    }
    return MR_OK;
}

/*
 * MR_AGAIN: the handler is called again later with the same item (handlers
 * run in order), whose result stays in scratch meanwhile, computed once.
 */
static mr_status_t moe_on_dispatch_item(const mr_item_t *item, void *arg)
{
    moe_rank_t *r = arg;
    size_t out = r->scratch_unsent;

    if (out == 0) out = moe_expert(r, item->data, item->length, item->source, r->scratch);
    if (out == 0) return MR_OK;
    mr_status_t st = mr_items_push(r->combine_items, r->scratch, out, item->source);
    r->scratch_unsent = st == MR_AGAIN ? out : 0;
    return st;
}

static mr_status_t moe_on_combine_item(const mr_item_t *item, void *arg)
{
    moe_combine(arg, item->data, item->length, item->source);
    return MR_OK;
}

/* Pulls what arrived: tokens are answered, results combined. */
static mr_status_t moe_items_drain(moe_rank_t *r, bool *progress)
{
    mr_item_t items[MOE_PULL_BATCH];
    size_t n;
    mr_status_t st;

    if ((st = moe_items_unpark(r)) != MR_OK) return st;
    while ((st = mr_items_pull_batch(r->dispatch_items, items, MOE_PULL_BATCH, &n)) == MR_OK) {
        *progress = true;
        for (size_t i = 0; i < n && st == MR_OK; i++) {
            st = moe_items_reply(r, items[i].data, items[i].length, items[i].source);
        }
        if (st != MR_OK) return st;
    }
    if (st != MR_AGAIN) return st;
    while ((st = mr_items_pull_batch(r->combine_items, items, MOE_PULL_BATCH, &n)) == MR_OK) {
        *progress = true;
        for (size_t i = 0; i < n; i++) moe_combine(r, items[i].data, items[i].length, items[i].source);
    }
    return st == MR_AGAIN ? MR_OK : st;
}

static mr_status_t moe_items_progress(moe_rank_t *r, bool handlers, bool *progress)
{
    return handlers ? moe_poll(progress) : moe_items_drain(r, progress);
}

static mr_status_t moe_items_end(moe_rank_t *r)
{
    return mr_items_end_phase(r->dispatch_items);
}

mr_status_t moe_items_open(moe_rank_t *r, bool handlers)
{
    mr_status_t st;

    if ((st = mr_items_create(MR_ITEMS_VARIABLE, &r->dispatch_items)) != MR_OK) return st;
    if ((st = mr_items_create(MR_ITEMS_VARIABLE, &r->combine_items)) != MR_OK) return st;
    if (!moe_set_pieces(r, mr_items_max_size(r->dispatch_items))) return MR_ERR_MESSAGE_TOO_LONG;
    free(r->scratch);
    if ((r->scratch = malloc(MOE_HEADER + r->piece_bytes)) == NULL) return MR_ERR_NO_MEMORY;
    if (handlers) {
        if ((st = mr_items_handler(r->dispatch_items, moe_on_dispatch_item, r)) != MR_OK) return st;
        if ((st = mr_items_handler(r->combine_items, moe_on_combine_item, r)) != MR_OK) return st;
    }
    return MR_OK;
}

mr_status_t moe_step_items(moe_rank_t *r, const tool_contender_t *c, double *seconds)
{
    const moe_options_t *o = r->o;
    uint64_t pairs = o->tokens * o->k, next = 0;
    unsigned piece = 0;
    mr_status_t st = MR_OK;
    bool dispatch_flushed = false;
    /* A dispatch record is built apart from the results, which handlers build in r->scratch. */
    uint8_t *record = malloc(MOE_HEADER + r->piece_bytes);
    if (record == NULL) return MR_ERR_NO_MEMORY;
    moe_barrier(o);
    double start = tool_now();
    while (st == MR_OK && r->pairs_done < pairs) {
        bool progress = false;
        st = moe_items_progress(r, c->handlers, &progress);
        /* The dispatch, while the aggregator takes it and no result is owed. */
        for (int burst = 0; st == MR_OK && r->parked_head == r->parked_len && next < pairs &&
                            burst < 64; burst++) {
            int dest;
            size_t len = moe_dispatch_record(r, &next, &piece, record, &dest);
            if ((st = mr_items_push(r->dispatch_items, record, len, dest)) != MR_OK) {
                /* MR_AGAIN: the same record again after progress. */
                if (piece-- == 0) {
                    piece = r->pieces - 1;
                    next--;
                }
                break;
            }
            progress = true;
        }
        if (st == MR_AGAIN) st = MR_OK;
        if (st == MR_OK && next == pairs && !dispatch_flushed) {
            st = mr_items_flush(r->dispatch_items);
            dispatch_flushed = true;
        }
        if (st == MR_OK && !progress) {
            /* Nothing to do now: what waits in partly filled datagrams leaves. */
            st = mr_items_flush(r->combine_items);
            if (st == MR_OK && tool_now() - start > o->timeout_s) {
                moe_name_missing(r, c->name);
                st = MR_ERR_TIMEOUT;
            }
            if (st == MR_OK) st = moe_idle(r);
        }
    }
    *seconds = tool_now() - start;
    free(record);
    /* Untimed: serve the other ranks' tokens until every item of the step is pulled. */
    return st == MR_OK ? moe_finish(r, c->handlers, moe_items_progress, moe_items_end) : st;
}

void moe_items_free(moe_rank_t *r)
{
    free(r->scratch);
    r->scratch = NULL;
}
