/* The plumbing shared by the substrate plugins (see mr_substrate_base.h). */
#include "mr_substrate_base.h"

#include <stdlib.h>
#include <string.h>

static const mr_log_level_t mr__default_threshold = MR_LOG_WARN;

/* The base of a plugin's state; valid because `base` is its first member. */
static mr__substrate_base_t *mr__base_of(mr_substrate_t *s)
{
    return (mr__substrate_base_t *)(void *)s;
}

void mr__base_init(mr__substrate_base_t *b, const mr_substrate_params_t *p)
{
    b->rank = p->rank;
    b->size = p->size;
    b->datagram_size = p->datagram_size;
    b->max_sends = p->max_sends;
    b->timeout_s = p->timeout_s;
    b->core = p->core;
    if (p->upcalls != NULL) b->up = *p->upcalls;
    b->log = p->log;
    b->log_threshold = p->log_threshold != NULL ? p->log_threshold : &mr__default_threshold;
}

mr_status_t mr__substrate_alloc(const mr_substrate_params_t *p, size_t size, const char *who,
                                size_t max_datagram, bool needs_key, mr_substrate_t **out)
{
    mr_substrate_t *s;

    if (p == NULL || out == NULL) return MR_ERR_INVALID_PARAM;
    if (!mr_substrate_params_valid(p, who, max_datagram, needs_key)) {
        return MR_ERR_INVALID_PARAM;
    }
    s = calloc(1, size);
    if (s == NULL) return MR_ERR_NO_MEMORY;
    mr__base_init(mr__base_of(s), p);
    *out = s;
    return MR_OK;
}

void mr__substrate_closing(mr_substrate_t *s)
{
    if (s != NULL) mr__base_of(s)->closing = true;
}

void mr__substrate_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    if (s == NULL || stats == NULL) return;
    if (stats->size >= offsetof(mr_stats_t, connections_rejected) + sizeof(uint64_t)) {
        stats->connections_rejected += mr__base_of(s)->rejected;
    }
}

int mr__done_drain(mr_substrate_t *s, mr__done_queue_t *q, mr__sreq_t **free_list)
{
    const mr__substrate_base_t *b = mr__base_of(s);
    mr__sreq_t *r = q->head;
    int n = 0;

    q->head = q->tail = NULL;
    while (r != NULL) {
        mr__sreq_t *next = r->next;
        void *cookie = r->cookie;
        mr__sreq_push(free_list, r);
        b->up.send_complete(b->core, cookie);
        n++;
        r = next;
    }
    return n;
}
