/*
 * What every substrate plugin shares: the head of its state, the log macro,
 * the preamble of open(), the queue of send completions that wait for
 * progress(), and the operations that are the same everywhere. Internal.
 *
 * This is compiled into each plugin (substrates/common/meson.build: a static
 * library with hidden symbols), never taken from libmailrail: a plugin must
 * not call the core's symbols, since the core may be linked statically into
 * a tool or dlopen'd privately (see MR_SUBSTRATE_LOG).
 *
 * A plugin's struct mr_substrate starts with a mr__substrate_base_t named
 * `base` (checked with MR__BASE_CHECK): MR__LOG and the functions here that
 * take a mr_substrate_t rely on it.
 */
#ifndef MR_SUBSTRATE_BASE_H
#define MR_SUBSTRATE_BASE_H

#include "mr_substrate.h"
#include "mr_time.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The head of every plugin's state: what open() was told, and the finalize flag. */
typedef struct mr__substrate_base {
    int rank, size;
    size_t datagram_size;
    size_t max_sends;
    unsigned timeout_s;
    void *core;                        /* First argument of every upcall. */
    mr_substrate_upcalls_t up;
    void (*log)(mr_log_level_t level, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
    const mr_log_level_t *log_threshold; /* Never NULL. */
    bool closing;                      /* closing() was called: every rank finished sending. */
    uint64_t rejected;                 /* connections_rejected in mr__substrate_stats(). */
} mr__substrate_base_t;

/* Put after a plugin's struct mr_substrate: the base must come first. */
#define MR__BASE_CHECK()                                                                 \
    _Static_assert(offsetof(struct mr_substrate, base) == 0,                             \
                   "struct mr_substrate starts with its mr__substrate_base_t")

/* Logs through the core's log function; `s` is a plugin's mr_substrate_t. */
#define MR__LOG(s, level, ...)                                                           \
    MR_SUBSTRATE_LOG((s)->base.log, (s)->base.log_threshold, level, __VA_ARGS__)

/* Whether a message at `level` would be printed: guards costly log arguments. */
static inline bool mr__log_enabled(const mr__substrate_base_t *b, mr_log_level_t level)
{
    return level <= *b->log_threshold;
}

/*
 * Fills the base from open()'s parameters. Upcalls stay zero when there are
 * none, and a missing log threshold is MR_LOG_WARN.
 */
void mr__base_init(mr__substrate_base_t *b, const mr_substrate_params_t *p);

/*
 * The preamble of open(): checks the parameters (mr_substrate_params_valid(),
 * logging as `who`), allocates `size` zeroed bytes of plugin state and fills
 * its base. Sets *out only on MR_OK.
 */
mr_status_t mr__substrate_alloc(const mr_substrate_params_t *p, size_t size, const char *who,
                                size_t max_datagram, bool needs_key, mr_substrate_t **out);

/*
 * The checks every send makes of its destination: MR_ERR_INVALID_PARAM
 * without a substrate, MR_ERR_INVALID_RANK outside the job or for this rank.
 */
static inline mr_status_t mr__send_target_check(const mr_substrate_t *s, int dest)
{
    const mr__substrate_base_t *b = (const mr__substrate_base_t *)(const void *)s;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    if (dest < 0 || dest >= b->size || dest == b->rank) return MR_ERR_INVALID_RANK;
    return MR_OK;
}

/* The closing() operation: only records that every rank finished sending. */
void mr__substrate_closing(mr_substrate_t *s);

/* The stats() operation: adds base.rejected to connections_rejected. */
void mr__substrate_stats(mr_substrate_t *s, mr_stats_t *stats);

/* Adds `n` to stats->peers_connected, when the caller's struct is recent enough to have it. */
static inline void mr__stats_add_peers(mr_stats_t *stats, uint64_t n)
{
    if (stats->size >= offsetof(mr_stats_t, peers_connected) + sizeof(stats->peers_connected)) {
        stats->peers_connected += n;
    }
}

/* ------------------------------------------------------------------------ */
/* Send requests and their completions.                                      */

/*
 * The head of a plugin's send request: the link of a free list or of the
 * done queue, and send()'s cookie. It comes first in the plugin's request.
 */
typedef struct mr__sreq {
    struct mr__sreq *next;
    void *cookie;
} mr__sreq_t;

/* Sends that have completed, oldest first, waiting for progress() to report them. */
typedef struct mr__done_queue {
    mr__sreq_t *head, *tail;
} mr__done_queue_t;

/* Takes a request from a free list, or NULL when it is empty. */
static inline mr__sreq_t *mr__sreq_pop(mr__sreq_t **free_list)
{
    mr__sreq_t *r = *free_list;
    if (r != NULL) *free_list = r->next;
    return r;
}

/* Puts a request back on a free list. */
static inline void mr__sreq_push(mr__sreq_t **free_list, mr__sreq_t *r)
{
    r->next = *free_list;
    r->cookie = NULL;
    *free_list = r;
}

static inline bool mr__done_empty(const mr__done_queue_t *q)
{
    return q->head == NULL;
}

/* Appends a completed send; no upcall runs (safe inside send()). */
static inline void mr__done_push(mr__done_queue_t *q, mr__sreq_t *r)
{
    r->next = NULL;
    if (q->tail != NULL) q->tail->next = r;
    else q->head = r;
    q->tail = r;
}

/*
 * Reports the queued completions: each request goes back to `free_list`,
 * then send_complete() gets its cookie. The queue is detached first, so
 * that completions of sends made by these upcalls wait for the next call.
 * progress() only. Returns the number of completions.
 */
int mr__done_drain(mr_substrate_t *s, mr__done_queue_t *q, mr__sreq_t **free_list);

/*
 * deliver_handler_now() of a handler's message whose id is its payload's last
 * byte, as it travels when the id is not carried apart. MR_AGAIN for an
 * empty one (it goes the usual way, and the core refuses it there).
 */
static inline mr_status_t mr__deliver_handler_trailer(const mr__substrate_base_t *b, int source,
                                                      uint32_t imm, const void *data,
                                                      size_t length)
{
    if (length == 0) return MR_AGAIN;
    return b->up.deliver_handler_now(b->core, source, imm, ((const uint8_t *)data)[length - 1],
                                     data, length - 1);
}

/* ------------------------------------------------------------------------ */
/* The ops table.                                                            */

/* The first fields of every plugin's ops table. */
#define MR__SUBSTRATE_OPS_HEAD                                                           \
    .abi_version = MR_SUBSTRATE_ABI_VERSION, .ops_size = sizeof(mr_substrate_ops_t)

/* Defines the plugin's one exported function, returning `ops`. */
#define MR__SUBSTRATE_ENTRY(ops)                                                         \
    __attribute__((visibility("default"))) const mr_substrate_ops_t *mr_substrate_get_ops(void) \
    {                                                                                    \
        return &(ops);                                                                   \
    }

#endif /* MR_SUBSTRATE_BASE_H */
