/*
 * Credit returns and the zero-credit clock, shared by the rank and node
 * policies.
 */
#include "mr_credit.h"
#include "mr_log.h"
#include "mr_time.h"

#include <stdlib.h>
#include <time.h>

mr_status_t mr_credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t return_at,
                                const mr_flowctl_params_t *params)
{
    o->nkeys = nkeys;
    o->return_at = return_at;
    o->owed = calloc((size_t)nkeys, sizeof(*o->owed));
    o->return_to = calloc((size_t)nkeys, sizeof(*o->return_to));
    o->queued = calloc((size_t)nkeys, sizeof(*o->queued));
    o->retry = calloc((size_t)nkeys, sizeof(*o->retry));
    o->nretry = 0;
    o->core = params->core;
    o->send_control = params->send_control;
    if (!o->owed || !o->return_to || !o->queued || !o->retry) {
        mr_error("Cannot allocate credit-return state for %d senders.", nkeys);
        mr_credit_owed_fini(o);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

void mr_credit_owed_fini(mr_credit_owed_t *o)
{
    free(o->owed);
    free(o->return_to);
    free(o->queued);
    free(o->retry);
    o->owed = NULL;
    o->return_to = NULL;
    o->queued = NULL;
    o->retry = NULL;
}

/* Sends what is owed to `key`; a refusal puts the key on the retry list. */
static void credit_owed_return(mr_credit_owed_t *o, int key)
{
    mr_status_t status = o->send_control(o->core, o->return_to[key], o->owed[key]);

    if (status == MR_OK) {
        o->owed[key] = 0;
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

void mr_credit_owed_consume(mr_credit_owed_t *o, int key, int rank)
{
    o->return_to[key] = rank;
    if (++o->owed[key] >= o->return_at && !o->queued[key]) credit_owed_return(o, key);
}

int mr_credit_owed_progress(mr_credit_owed_t *o)
{
    int sent = 0, kept = 0;

    if (o->nretry == 0) return 0;
    for (int i = 0; i < o->nretry; i++) {
        int key = o->retry[i];
        mr_status_t status;

        /* Piggybacking may have paid the debt meanwhile. */
        if (o->owed[key] < o->return_at) {
            o->queued[key] = 0;
            continue;
        }
        status = o->send_control(o->core, o->return_to[key], o->owed[key]);
        if (status == MR_AGAIN) {
            o->retry[kept++] = key;
            continue;
        }
        o->queued[key] = 0;
        o->owed[key] = 0;
        sent += status == MR_OK;
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
