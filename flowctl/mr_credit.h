/*
 * Building blocks shared by the credit policies (rank and node). Internal.
 *
 * mr_credit_owed_t keeps, per key (a sending rank under `rank`, a sending
 * node under `node`), the credits a receiver has consumed and not yet given
 * back, returns them in a control message once they reach the threshold, and
 * retries returns the substrate refused. mr_credit_clock_t measures how long
 * sends waited for credit.
 */
#ifndef MR_CREDIT_H
#define MR_CREDIT_H

#include "mr_flowctl.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct mr_credit_owed {
    int nkeys;
    uint32_t return_at;   /* Return once this many are owed to a key. */
    uint32_t *owed;       /* Per key. */
    int32_t *return_to;   /* Per key: the rank that gets the control message. */
    uint8_t *queued;      /* Per key: on the retry list. */
    int *retry;           /* Keys whose return the substrate refused. */
    int nretry;
    void *core;
    mr_status_t (*send_control)(void *core, int dest, uint32_t imm);
} mr_credit_owed_t;

mr_status_t mr_credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t return_at,
                                const mr_flowctl_params_t *params);
void mr_credit_owed_fini(mr_credit_owed_t *o);

/* One credit of `key` was consumed by a message from `rank`; returns when due. */
void mr_credit_owed_consume(mr_credit_owed_t *o, int key, int rank);

/* Takes everything owed to `key`, to piggyback it on a data message. */
static inline uint32_t mr_credit_owed_take(mr_credit_owed_t *o, int key)
{
    uint32_t n = o->owed[key];
    o->owed[key] = 0;
    return n;
}

/* Puts back credits taken with mr_credit_owed_take() that did not travel. */
static inline void mr_credit_owed_put_back(mr_credit_owed_t *o, int key, uint32_t n)
{
    o->owed[key] += n;
}

/* Retries refused returns. Returns the number of returns sent. */
int mr_credit_owed_progress(mr_credit_owed_t *o);

/* The credit threshold: consumed credits are returned after 1/threshold of them. */
static inline uint32_t mr_credit_return_at(uint32_t granted, unsigned threshold)
{
    uint32_t at = granted / (threshold ? threshold : 1);
    return at ? at : 1;
}

typedef struct mr_credit_clock {
    uint64_t *since;      /* Per destination: when it ran out of credit, or 0. */
    uint64_t total_ns;
} mr_credit_clock_t;

mr_status_t mr_credit_clock_init(mr_credit_clock_t *c, int ndest);
void mr_credit_clock_fini(mr_credit_clock_t *c);

/* A send to `dest` found no credit. */
void mr_credit_clock_blocked(mr_credit_clock_t *c, int dest);

/* Ends the wait of `dest`, adding it to the total. */
void mr_credit_clock_stop(mr_credit_clock_t *c, int dest);

/* A send to `dest` got a credit. */
static inline void mr_credit_clock_granted(mr_credit_clock_t *c, int dest)
{
    if (c->since[dest] != 0) mr_credit_clock_stop(c, dest);
}

#endif /* MR_CREDIT_H */
