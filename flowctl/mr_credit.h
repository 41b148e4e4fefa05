/*
 * Building blocks shared by the credit policies (rank and node). Internal.
 *
 * mr_credit_owed_t keeps, per key (a sending rank under `rank`, a sending
 * node under `node`), the credits a receiver has freed and not yet given
 * back and those it has granted, sizes the grants (mr_credit_window_t),
 * returns credits in a control message once they reach the threshold, and
 * retries returns the substrate refused. mr_credit_clock_t measures how long
 * sends waited for credit.
 */
#ifndef MR_CREDIT_H
#define MR_CREDIT_H

#include "mr_flowctl.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * What a receiver grants one key: `limit` credits are its share of the receive
 * slots and never more are outstanding. With adaptive grants (the default
 * when no credit count is set) a key starts with MR_CREDIT_INITIAL and the
 * receiver keeps about 1 ms worth of its best recent arrival rate
 * outstanding over all keys that send to it, shared evenly, so that what
 * waits in the network in front of it stays small whatever the number of
 * senders (docs/incast.md). Static grants keep window = limit.
 */
#define MR_CREDIT_INITIAL 2

typedef struct mr_credit_window {
    bool adaptive;
    uint32_t window;          /* Credits each active key may have outstanding now. */
    uint64_t epoch_end_ns;
    double rate;              /* Most arrivals per second lately (a decaying maximum). */
    uint64_t interval_start_ns;
    uint32_t interval_arrivals;
    int active, active_now;   /* Keys that sent in the last epoch, and in this one. */
    uint32_t epoch;
} mr_credit_window_t;

typedef struct mr_credit_owed {
    int nkeys;
    uint32_t limit;       /* Credits per key: its share of the receive slots. */
    unsigned threshold;   /* MAILRAIL_CREDIT_RETURN_THRESHOLD. */
    uint32_t return_at;   /* Return once this many are returnable to a key. */
    uint32_t *owed;       /* Per key: freed slots not yet granted back. */
    uint32_t *held;       /* Per key: granted credits whose messages have not arrived. */
    uint32_t *seen_epoch; /* Per key: the last epoch it sent in. */
    int32_t *return_to;   /* Per key: the rank that gets the control message. */
    uint8_t *queued;      /* Per key: on the retry list. */
    int *retry;           /* Keys whose return the substrate refused. */
    int nretry;
    mr_credit_window_t win;
    void *core;
    mr_status_t (*send_control)(void *core, int dest, uint32_t imm);
} mr_credit_owed_t;

/* The credits a sender starts with for each receiver: same on both sides. */
static inline uint32_t mr_credit_initial(uint32_t limit, bool adaptive)
{
    return adaptive && limit > MR_CREDIT_INITIAL ? MR_CREDIT_INITIAL : limit;
}

mr_status_t mr_credit_owed_init(mr_credit_owed_t *o, int nkeys, uint32_t limit, bool adaptive,
                                const mr_flowctl_params_t *params);
void mr_credit_owed_fini(mr_credit_owed_t *o);

/* A message of `key` arrived (a data message using one of its credits). */
void mr_credit_owed_arrived(mr_credit_owed_t *o, int key);

/* One credit of `key` was freed by a message from `rank`; returns credits when due. */
void mr_credit_owed_consume(mr_credit_owed_t *o, int key, int rank);

/* What may be granted back to `key` now: freed slots, up to its window. */
static inline uint32_t mr_credit_owed_returnable(const mr_credit_owed_t *o, int key)
{
    uint32_t room = o->win.window > o->held[key] ? o->win.window - o->held[key] : 0;
    return o->owed[key] < room ? o->owed[key] : room;
}

/* Takes what may be granted back to `key`, to piggyback it on a data message. */
uint32_t mr_credit_owed_take(mr_credit_owed_t *o, int key);

/* Puts back credits taken with mr_credit_owed_take() that did not travel. */
static inline void mr_credit_owed_put_back(mr_credit_owed_t *o, int key, uint32_t n)
{
    o->owed[key] += n;
    o->held[key] -= n;
}

/* Retries refused returns. Returns the number of returns sent. */
int mr_credit_owed_progress(mr_credit_owed_t *o);

/* The credit threshold: freed credits are returned after 1/threshold of a grant. */
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
