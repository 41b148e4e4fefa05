/*
 * Credit returns and the zero-credit clock, shared by the rank and node
 * policies.
 */
#include "mr_credit.h"
#include "mr_log.h"
#include "mr_time.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * The grants cover this long at the receiver's best recent rate: longer than
 * a credit loop through shared memory or a switch, so that a receiver that
 * is not the bottleneck lets its senders run at full speed, and short enough
 * that what waits in a switch in front of a bottlenecked receiver (1 ms at
 * 200 Mbit/s is 25 KB) fits a shallow buffer. docs/incast.md has the numbers.
 */
#define MR_CREDIT_HORIZON_NS (1 * MR_NS_PER_MS)
/* Arrivals are counted in intervals of at least this long to estimate the rate. */
#define CREDIT_INTERVAL_NS (1 * MR_NS_PER_MS)
/* The rate estimate loses 2% per interval: a maximum over the last tens of ms. */
#define CREDIT_RATE_DECAY 0.98
/* Keys count as active for an epoch this long after they last sent. */
#define CREDIT_EPOCH_NS (250 * MR_NS_PER_MS)

mr_status_t mr_credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t limit, bool adaptive,
                                const mr_flowctl_params_t *params)
{
    uint32_t initial = mr_credit_initial(limit, adaptive);

    memset(o, 0, sizeof(*o));
    o->nkeys = nkeys;
    o->limit = limit;
    o->threshold = params->return_threshold;
    o->owed = calloc((size_t)nkeys, sizeof(*o->owed));
    o->held = calloc((size_t)nkeys, sizeof(*o->held));
    o->seen_epoch = calloc((size_t)nkeys, sizeof(*o->seen_epoch));
    o->return_to = calloc((size_t)nkeys, sizeof(*o->return_to));
    o->queued = calloc((size_t)nkeys, sizeof(*o->queued));
    o->retry = calloc((size_t)nkeys, sizeof(*o->retry));
    o->core = params->core;
    o->send_control = params->send_control;
    if (!o->owed || !o->held || !o->seen_epoch || !o->return_to || !o->queued || !o->retry) {
        mr_error("Cannot allocate credit-return state for %d senders.", nkeys);
        mr_credit_owed_fini(o);
        return MR_ERR_NO_MEMORY;
    }
    /* Every key starts with `initial` credits; the rest of its share waits here. */
    for (int k = 0; k < nkeys; k++) {
        o->held[k] = initial;
        o->owed[k] = limit - initial;
        o->seen_epoch[k] = UINT32_MAX;
    }
    o->win.adaptive = adaptive;
    o->win.window = initial;
    o->win.active = 1;
    o->return_at = mr_credit_return_at(initial, o->threshold);
    return MR_OK;
}

void mr_credit_owed_fini(mr_credit_owed_t *o)
{
    if (o->win.adaptive && o->win.rate > 0) {
        mr_debug("Credit window: %u per key over %d active key(s); peak rate %.0f messages/s.",
                 o->win.window, o->win.active, o->win.rate);
    }
    free(o->owed);
    free(o->held);
    free(o->seen_epoch);
    free(o->return_to);
    free(o->queued);
    free(o->retry);
    memset(o, 0, sizeof(*o));
}

/* Notes that `n` credits went back to `key`. */
static void credit_granted(mr_credit_owed_t *o, int key, uint32_t n)
{
    o->owed[key] -= n;
    o->held[key] += n;
}

uint32_t mr_credit_owed_take(mr_credit_owed_t *o, int key)
{
    uint32_t n = mr_credit_owed_returnable(o, key);

    if (n != 0) credit_granted(o, key, n);
    return n;
}

/* Sends what may be returned to `key`; a refusal puts the key on the retry list. */
static void credit_owed_return(mr_credit_owed_t *o, int key)
{
    uint32_t n = mr_credit_owed_returnable(o, key);
    mr_status_t status = o->send_control(o->core, o->return_to[key], n);

    if (status == MR_OK) {
        credit_granted(o, key, n);
    } else if (status == MR_AGAIN) {
        if (!o->queued[key]) {
            o->queued[key] = 1;
            o->retry[o->nretry++] = key;
        }
    } else {
        /* The peer is gone; its credits no longer matter. */
        o->owed[key] = 0;
    }
}

/*
 * Sizes the window: MR_CREDIT_HORIZON_NS worth of arrivals at the receiver's
 * best recent rate, shared by the keys that send to it (docs/incast.md).
 */
static void credit_window_update(mr_credit_window_t *w, uint32_t limit)
{
    int active = w->active > w->active_now ? w->active : w->active_now;
    double total = w->rate * (double)MR_CREDIT_HORIZON_NS / 1e9;
    double per = total / (double)(active > 0 ? active : 1);
    uint32_t n = per >= (double)limit ? limit : (uint32_t)per + 1;

    w->window = n < 1 ? 1 : n;
}

/* Counts an arrival for the rate, rolls epochs over, resizes the window. */
static void credit_window_arrival(mr_credit_owed_t *o, int key)
{
    mr_credit_window_t *w = &o->win;
    uint64_t now;

    if (o->seen_epoch[key] != w->epoch) {
        o->seen_epoch[key] = w->epoch;
        w->active_now++;
    }
    if ((++w->interval_arrivals & 15) != 0) return;
    now = mr_now_ns();
    if (w->interval_start_ns == 0) {
        w->interval_start_ns = now;
        w->epoch_end_ns = now + CREDIT_EPOCH_NS;
        w->interval_arrivals = 0;
        return;
    }
    if (now - w->interval_start_ns < CREDIT_INTERVAL_NS) return;
    double dt = (double)(now - w->interval_start_ns) / 1e9;
    double rate = (double)w->interval_arrivals / dt;
    double decayed = w->rate;
    for (uint64_t t = CREDIT_INTERVAL_NS; t <= now - w->interval_start_ns && decayed > 1;
         t += CREDIT_INTERVAL_NS) {
        decayed *= CREDIT_RATE_DECAY;
    }
    w->rate = rate > decayed ? rate : decayed;
    w->interval_start_ns = now;
    w->interval_arrivals = 0;
    if (now >= w->epoch_end_ns) {
        w->active = w->active_now > 0 ? w->active_now : 1;
        w->active_now = 0;
        w->epoch++;
        w->epoch_end_ns = now + CREDIT_EPOCH_NS;
    }
    credit_window_update(w, o->limit);
    o->return_at = mr_credit_return_at(w->window, o->threshold);
}

void mr_credit_owed_arrived(mr_credit_owed_t *o, int key)
{
    if (o->held[key] > 0) o->held[key]--;
    if (o->win.adaptive) credit_window_arrival(o, key);
}

void mr_credit_owed_consume(mr_credit_owed_t *o, int key, int rank)
{
    o->return_to[key] = rank;
    o->owed[key]++;
    if (!o->queued[key] && mr_credit_owed_returnable(o, key) >= o->return_at) {
        credit_owed_return(o, key);
    }
}

int mr_credit_owed_progress(mr_credit_owed_t *o)
{
    int sent = 0, kept = 0;

    if (o->nretry == 0) return 0;
    for (int i = 0; i < o->nretry; i++) {
        int key = o->retry[i];
        uint32_t n = mr_credit_owed_returnable(o, key);
        mr_status_t status;

        /* Piggybacking may have paid the debt meanwhile. */
        if (n < o->return_at) {
            o->queued[key] = 0;
            continue;
        }
        status = o->send_control(o->core, o->return_to[key], n);
        if (status == MR_AGAIN) {
            o->retry[kept++] = key;
            continue;
        }
        o->queued[key] = 0;
        if (status == MR_OK) {
            credit_granted(o, key, n);
            sent++;
        } else {
            o->owed[key] = 0;
        }
    }
    o->nretry = kept;
    return sent;
}

mr_status_t mr_credit_clock_init(mr_credit_clock_t *c, int ndest)
{
    c->total_ns = 0;
    c->since = calloc((size_t)ndest, sizeof(*c->since));
    if (c->since == NULL) {
        mr_error("Cannot allocate the zero-credit clock for %d destinations.", ndest);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

void mr_credit_clock_fini(mr_credit_clock_t *c)
{
    free(c->since);
    c->since = NULL;
}

void mr_credit_clock_blocked(mr_credit_clock_t *c, int dest)
{
    if (c->since[dest] == 0) c->since[dest] = mr_now_ns();
}

void mr_credit_clock_stop(mr_credit_clock_t *c, int dest)
{
    c->total_ns += mr_now_ns() - c->since[dest];
    c->since[dest] = 0;
}
