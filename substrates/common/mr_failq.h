/*
 * Peer failures, as every substrate handles them: found where they happen
 * (a failed send, an error callback, a read, a dead process) and queued,
 * once per rank, then reported to the core in the next progress call, in
 * the order found. Upcalls only run from progress(), which is why a failure
 * waits here. Internal to the substrates (mr_substrate_base.h).
 */
#ifndef MR_FAILQ_H
#define MR_FAILQ_H

#include "mr_substrate.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct mr__failq {
    int *ring;            /* Ranks in the order their failure was found. */
    mr_status_t *why;     /* Per rank, while queued. */
    uint8_t *queued;      /* Per rank: in the ring. */
    int head, count, size;
} mr__failq_t;

/* What a substrate makes of a queued failure when progress() drains it. */
typedef enum mr__fail_verdict {
    MR__FAIL_SKIP,        /* Nothing to do (the peer had failed already). */
    MR__FAIL_QUIET,       /* Clean up, but the core is not told (an expected departure). */
    MR__FAIL_REPORT       /* Clean up and tell the core: the peer_failed() upcall. */
} mr__fail_verdict_t;

typedef struct mr__fail_ops {
    /* Marks `rank` failed in the substrate's own state and logs it; says what follows. */
    mr__fail_verdict_t (*begin)(mr_substrate_t *s, int rank, mr_status_t why);
    /*
     * After the core was told: gives back what the substrate held for `rank`
     * (its sends' buffers, through send_complete()). Returns the number of
     * upcalls it made. May be NULL.
     */
    int (*end)(mr_substrate_t *s, int rank);
} mr__fail_ops_t;

/* For ranks 0 to size - 1. */
mr_status_t mr__failq_init(mr__failq_t *q, int size);
void mr__failq_fini(mr__failq_t *q);

/* Queues the failure of `rank`; false when it is queued already (the first `why` stays). */
bool mr__failq_push(mr__failq_t *q, int rank, mr_status_t why);

static inline bool mr__failq_empty(const mr__failq_t *q)
{
    return q->count == 0;
}

static inline bool mr__failq_queued(const mr__failq_t *q, int rank)
{
    return q->queued[rank] != 0;
}

/*
 * Reports every queued failure: begin(), the peer_failed() upcall unless
 * begin() said otherwise, then end(). progress() only. Returns the number
 * of upcalls made.
 */
int mr__failq_drain(mr_substrate_t *s, mr__failq_t *q, const mr__fail_ops_t *ops);

#endif /* MR_FAILQ_H */
