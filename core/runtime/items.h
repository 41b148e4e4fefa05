/*
 * What the files of the item layer share (items.c: the aggregators' table,
 * their life and the end of a phase; items_push.c: staging and sending;
 * items_pull.c: arrivals and pulling). Internal to the runtime;
 * docs/items.md describes the design and items_wire.h the layout.
 *
 * The layer talks to the datapath only through datapath.h: it is the
 * consumer of MR_KIND_ITEMS datagrams, which the datapath hands it as they
 * arrive. A staged datagram is a send-pool slot, so credits and the send
 * pool govern items exactly as they govern mr_send(). A datagram to oneself
 * never leaves its send slot: rt_submit_local() hands it over like an
 * arrival.
 * Quiescence counts a datagram as sent when it leaves staging and as
 * received only when its last item has been pulled, so that an item handler
 * that pushes more keeps the phase open.
 */
#ifndef MR_ITEMS_H
#define MR_ITEMS_H

#include "datapath.h"

#include <stdbool.h>
#include <stdint.h>

/* Where the items for one destination are being staged. */
typedef struct items_stage {
    uint8_t *pos;       /* Next free byte, or NULL when nothing is staged. */
    uint8_t *end;       /* End of the datagram. */
} items_stage_t;

/* Aligned to a power of two, so that checking a handle takes no division. */
struct __attribute__((aligned(128))) mr_items {
    bool live;
    uint8_t id;              /* Its place in rt_items_table and rt_items_arrivals. */
    uint16_t number;         /* The order of its creation: what peers address. */
    uint32_t item_size;      /* 0: variable. */
    size_t max_item;
    items_stage_t *stage;    /* Per destination. */
    int *staged;             /* Destinations with a staged datagram (maybe sent since). */
    uint8_t *listed;         /* Per destination: in staged[]. */
    int nstaged;

    /* The datagram being pulled, or MR_NIL. */
    rt_msg_t cur;
    int cur_source;
    const uint8_t *pos, *end;

    unsigned pulls;                  /* Datagrams taken, to pace progress. */

    mr_item_handler_t handler;       /* mr_items_handler(), or NULL: items are pulled. */
    void *handler_arg;
    bool blocked;                    /* Its handler asked to be called again this progress. */
};

/* Aggregators live here, so that a handle is checked without dereferencing it. */
extern mr_items_t rt_items_table[MR_ITEMS_MAX];
/* Item datagrams that arrived (from oneself too), per place in rt_items_table. */
extern rt_msgq_t rt_items_arrivals[MR_ITEMS_MAX];
/* Item datagrams for aggregators this rank has not created yet. */
extern rt_msgq_t rt_items_future;
/* Aggregators created since mr_init(): the next one's number. */
extern uint16_t rt_items_created;

/* Whether `a` is a live aggregator; never reads memory outside the table. */
static inline bool rt_items_valid(const mr_items_t *a)
{
    uintptr_t off = (uintptr_t)a - (uintptr_t)rt_items_table;

    return a != NULL && off < sizeof(rt_items_table) && off % sizeof(*a) == 0 && a->live;
}

/* Returns from an API function called before init or with an invalid handle. */
#define RT_ITEMS_CHECK_STATE(fn, a, state_check)                                             \
    do {                                                                                     \
        state_check(fn);                                                                     \
        if (!rt_items_valid(a)) {                                                            \
            mr_error("%s: %p is not a live aggregator from mr_items_create().", fn,          \
                     (const void *)(a));                                                     \
            return MR_ERR_INVALID_PARAM;                                                     \
        }                                                                                    \
    } while (0)
#define RT_ITEMS_CHECK(fn, a) RT_ITEMS_CHECK_STATE(fn, a, RT_CHECK_READY)
/* For the pulls: refused on an aggregator whose items go to its handler. */
#define RT_ITEMS_CHECK_PULL(fn, a)                                                           \
    do {                                                                                     \
        RT_ITEMS_CHECK(fn, a);                                                               \
        if ((a)->handler != NULL) {                                                          \
            mr_error("%s: aggregator %u has a handler (mr_items_handler()), which takes its " \
                     "items.", fn, (a)->number);                                             \
            return MR_ERR_INVALID_PARAM;                                                     \
        }                                                                                    \
    } while (0)
/* For pushes and flushes, which a handler may make. */
#define RT_ITEMS_CHECK_SEND(fn, a) RT_ITEMS_CHECK_STATE(fn, a, RT_CHECK_SEND)

/* items.c: the live aggregator created as `number`, or NULL. */
mr_items_t *rt_items_by_number(uint16_t number);
/* items_pull.c: the datapath's consumer of item datagrams, with a progress hook while an
 * aggregator has a handler, and without it. */
extern const rt_consumer_t rt_items_consumer, rt_items_consumer_handlers;
/* Aggregators with a handler. */
extern int rt_items_nhandlers;
/* items_pull.c: moves the datagrams that came early for a new aggregator into its queue. */
void rt_items_adopt_early(mr_items_t *a);
/* items_pull.c: counts the datagram being pulled as received and gives its slot back. */
void rt_items_release_current(mr_items_t *a);
/* items_push.c: sends every staged datagram of an aggregator. */
void rt_items_flush(mr_items_t *a);
/* items_push.c: flushes every aggregator. */
void rt_items_flush_all(void);

#endif /* MR_ITEMS_H */
