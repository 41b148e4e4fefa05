/*
 * mailrail_moe over MailRail's datagrams, and through its active-message
 * handlers (+h): a token, or each datagram-sized piece of it, goes in a
 * message of its own; an expert's rank transforms it straight from the
 * receive slot into a send buffer and sends it back as it arrives, so that
 * dispatch, compute and combine overlap (moe_step.h).
 */
#include "moe_step.h"
#include "tool_common.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An expert's work on a piece that found no free send buffer: its result is parked. */
static bool moe_park(moe_rank_t *r, const uint8_t *msg, size_t len, int source)
{
    uint8_t *at = moe_park_slot(r, len);

    if (at == NULL) return false;
    len = moe_expert(r, msg, len, source, at);
    if (len > 0) moe_park_commit(r, len, source);
    return true;
}

/* Sends the parked results while send buffers are free; a result sent is progress. */
static mr_status_t moe_unpark(moe_rank_t *r, bool *progress)
{
    const uint8_t *result;
    size_t len;
    int dest;

    while (moe_parked_peek(r, &result, &len, &dest)) {
        void *buf;
        mr_status_t st = mr_reserve(&buf);
        if (st != MR_OK) return st == MR_AGAIN ? MR_OK : st;
        memcpy(buf, result, len);
        if ((st = mr_send(buf, len, dest)) != MR_OK) {
            mr_release(buf);
            return st;
        }
        moe_parked_pop(r);
        *progress = true;
    }
    return MR_OK;
}

/* Receives what arrived: dispatch pieces are answered, results combined. */
static mr_status_t moe_drain(moe_rank_t *r, bool *progress)
{
    mr_message_t m;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        const uint8_t *msg = m.data;
        *progress = true;
        if (m.length >= MOE_HEADER && (msg[offsetof(moe_header_t, piece)] & MOE_COMBINE_BIT)) {
            moe_combine(r, msg, m.length, m.source);
        } else {
            void *buf;
            /* Replies go in order: behind any parked one. */
            if (r->parked_head == r->parked_len && (st = mr_reserve(&buf)) == MR_OK) {
                size_t len = moe_expert(r, msg, m.length, m.source, buf);
                st = len > 0 ? mr_send(buf, len, m.source) : MR_OK;
                if (len == 0 || st != MR_OK) mr_release(buf);
            } else if (st == MR_OK || st == MR_AGAIN) {
                st = moe_park(r, msg, m.length, m.source) ? MR_OK : MR_ERR_NO_MEMORY;
            }
            if (st != MR_OK) {
                mr_release(m.data);
                return st;
            }
        }
        if ((st = mr_release(m.data)) != MR_OK) return st;
    }
    return st == MR_AGAIN ? MR_OK : st;
}

static mr_status_t moe_on_dispatch(const mr_message_t *m, void *arg)
{
    moe_rank_t *r = arg;
    void *buf;
    mr_status_t st = mr_reserve(&buf);

    if (st != MR_OK) return st; /* MR_AGAIN: called again later with the same message. */
    size_t len = moe_expert(r, m->data, m->length, m->source, buf);
    st = len > 0 ? mr_send_handler(buf, len, m->source, MOE_H_COMBINE) : MR_OK;
    if (len == 0 || st != MR_OK) mr_release(buf);
    return st;
}

static mr_status_t moe_on_combine(const mr_message_t *m, void *arg)
{
    moe_combine(arg, m->data, m->length, m->source);
    return MR_OK;
}

/* Progress once: whether anything happened, or an error. */
static mr_status_t moe_progress(moe_rank_t *r, bool handlers, bool *progress)
{
    mr_status_t st;

    if (handlers) return moe_poll(progress);
    if ((st = moe_unpark(r, progress)) != MR_OK) return st;
    return moe_drain(r, progress);
}

static mr_status_t moe_quiesce(moe_rank_t *r)
{
    (void)r;
    return mr_quiesce();
}

/*
 * One step over MailRail: dispatch every piece, answer and combine as they
 * come. Returns this rank's seconds through *seconds, from the barrier to its
 * last result; quiescence follows, untimed.
 */
mr_status_t moe_step_datagrams(moe_rank_t *r, const tool_contender_t *c, double *seconds)
{
    const moe_options_t *o = r->o;
    uint64_t pairs = o->tokens * o->k, next = 0;
    unsigned piece = 0;
    mr_status_t st = MR_OK;

    moe_barrier(o);
    double start = tool_now();
    while (st == MR_OK && r->pairs_done < pairs) {
        bool progress = false;
        /*
         * Results owed to other ranks first, so that the experts' replies do
         * not wait behind this rank's own dispatch for send buffers; then
         * pieces of the dispatch while send buffers are free.
         */
        st = moe_progress(r, c->handlers, &progress);
        for (int burst = 0; st == MR_OK && r->parked_head == r->parked_len && next < pairs &&
                            burst < 64; burst++) {
            void *buf;
            int dest;
            if ((st = mr_reserve(&buf)) != MR_OK) break;
            size_t len = moe_dispatch_record(r, &next, &piece, buf, &dest);
            st = c->handlers ? mr_send_handler(buf, len, dest, MOE_H_DISPATCH)
                             : mr_send(buf, len, dest);
            if (st != MR_OK) {
                /* Not sent: the caller stops at the error, which names it. */
                mr_release(buf);
                break;
            }
            progress = true;
        }
        if (st == MR_AGAIN) st = MR_OK;
        if (st == MR_OK && !progress) {
            if (tool_now() - start > o->timeout_s) {
                moe_name_missing(r, c->name);
                st = MR_ERR_TIMEOUT;
                break;
            }
            st = moe_idle(r);
        }
    }
    *seconds = tool_now() - start;
    /* Untimed: serve the other ranks' tokens until every rank is done. */
    return st == MR_OK ? moe_finish(r, c->handlers, moe_progress, moe_quiesce) : st;
}

mr_status_t moe_datagrams_open(moe_rank_t *r, bool handlers)
{
    /* A handler's message gives up its last byte to the handler id. */
    if (!moe_set_pieces(r, mr_datagram_size() - (handlers ? 1 : 0))) {
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    mr_handler_register(MOE_H_DISPATCH, moe_on_dispatch, r);
    mr_handler_register(MOE_H_COMBINE, moe_on_combine, r);
    return MR_OK;
}

