/*
 * The queue of peer failures every substrate reports from progress()
 * (mr_failq.h).
 */
#include "mr_failq.h"
#include "mr_substrate_base.h"

#include <stdlib.h>

mr_status_t mr__failq_init(mr__failq_t *q, int size)
{
    q->ring = calloc((size_t)size, sizeof(*q->ring));
    q->why = calloc((size_t)size, sizeof(*q->why));
    q->queued = calloc((size_t)size, sizeof(*q->queued));
    q->head = q->count = 0;
    q->size = size;
    if (q->ring == NULL || q->why == NULL || q->queued == NULL) {
        mr__failq_fini(q);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

void mr__failq_fini(mr__failq_t *q)
{
    free(q->ring);
    free(q->why);
    free(q->queued);
    q->ring = NULL;
    q->why = NULL;
    q->queued = NULL;
    q->count = q->size = 0;
}

bool mr__failq_push(mr__failq_t *q, int rank, mr_status_t why)
{
    if (q->queued[rank]) return false;
    q->queued[rank] = 1;
    q->why[rank] = why;
    q->ring[(q->head + q->count) % q->size] = rank;
    q->count++;
    return true;
}

int mr__failq_drain(mr_substrate_t *s, mr__failq_t *q, const mr__fail_ops_t *ops)
{
    mr__substrate_base_t *b = (mr__substrate_base_t *)s;
    int n = 0;

    while (q->count > 0) {
        int rank = q->ring[q->head];
        mr_status_t why = q->why[rank];
        mr__fail_verdict_t verdict;

        q->head = (q->head + 1) % q->size;
        q->count--;
        q->queued[rank] = 0;
        verdict = ops->begin(s, rank, why);
        if (verdict == MR__FAIL_SKIP) continue;
        if (verdict == MR__FAIL_REPORT) {
            b->up.peer_failed(b->core, rank, why);
            n++;
        }
        if (ops->end != NULL) n += ops->end(s, rank);
    }
    return n;
}
