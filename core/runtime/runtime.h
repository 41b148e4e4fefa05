/*
 * The runtime behind mailrail.h: its state, and what its files share.
 * Internal to libmailrail; docs/runtime.md describes the files.
 *
 * One message's path: mr_reserve() takes a send-pool slot; mr_send() either
 * hands it to the substrate (after flow control granted a credit) or appends
 * it to the deferred queue of its destination; the substrate completes the
 * send in a later progress call and the slot returns to the pool. At the
 * receiver the substrate copies the payload into a receive-pool slot it took
 * through recv_slot_acquire() and delivers it; the slot joins the arrival
 * queue, mr_receive() hands it out in arrival order and mr_release() returns
 * it to the pool, telling flow control that a credit was consumed.
 */
#ifndef MR_RUNTIME_H
#define MR_RUNTIME_H

#include "mailrail.h"
#include "mailrail_items.h"
#include "mr_bootstrap.h"
#include "mr_config.h"
#include "mr_flowctl.h"
#include "mr_log.h"
#include "mr_pool.h"
#include "mr_substrate.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* RT_IN_HANDLER: a handler runs; only sends are allowed (RT_CHECK_SEND). */
enum rt_state { RT_UNINITIALIZED, RT_READY, RT_IN_HANDLER, RT_FINALIZED };

/* Peer health, per rank. */
enum peer_state { PEER_OK, PEER_FAILED_UNREPORTED, PEER_FAILED_REPORTED };

#define RT_HOST_MAX 64
#define RT_JOB_ID_MAX 40

typedef struct rt_runtime {
    mr_core_config_t cfg;
    mr_flowctl_config_t fcfg;
    int rank, size, node_count;
    int *node_of;
    int *host_of;          /* Physical host index per rank. */
    int machine_ranks;     /* Ranks sharing this machine's kernel, whatever their host names. */
    bool idle_yield;       /* Idle polls give the core away (MAILRAIL_YIELD). */
    uint64_t nap_ns;       /* mr__backoff()'s nap in waits on the bootstrap. */
    bool wait_naps;        /* mr_wait() naps before it sleeps (MAILRAIL_WAIT_NAP). */
    uint8_t job_key[MR_JOB_KEY_LEN];
    char job_id[RT_JOB_ID_MAX];

    void *bootstrap_dl;
    const mr_bootstrap_ops_t *bootstrap;
    mr_bootstrap_t *bs;

    void *substrate_dl;
    const mr_substrate_ops_t *substrate;
    mr_substrate_t *sub;
    void *substrate_config;
    char *addrs;        /* size * addr_len bytes. */
    size_t addr_len;

    const mr_flowctl_ops_t *flowctl;
    mr_flowctl_t *fc;
    void *flowctl_config;

    uint8_t *peer;         /* enum peer_state per rank. */
    bool closing;          /* All ranks finished sending; EOF from peers is expected. */
    int failures_unreported;
    bool any_failure;
    int *notice_q;         /* Failed ranks in the order this rank learnt of them ... */
    int notice_count;      /* ... how many ... */
    int notice_sent;       /* ... and how many were passed on around the ring (failures.c) ... */
    int notice_dest;       /* ... to this rank, the next live one when they were sent. */

    /*
     * Quiescence: whether a wave is pending (in rt_reduce_*) and the last completed one.
     * wave_pending is also set while mr_connect()'s reduction is (connect_pending), so
     * that mr_finalize() waits for whichever collective is pending before its barrier.
     */
    bool wave_pending;
    bool connect_pending;
    bool have_last_wave;
    uint64_t last_wave[2];
    bool unclean;          /* A collective was abandoned: MPI cannot be finalized. */
    uint64_t dropped_at_finalize;

    bool wake_registered;  /* The substrate's wait includes flow control's wake_fd(). */
    mr_stats_t stats;
} rt_runtime_t;

extern rt_runtime_t rt;
extern enum rt_state rt_state;

/*
 * Buffers of the bootstrap's non-blocking reductions (init's agreements and
 * quiescence waves). They live outside `rt` and are never freed: a reduction
 * abandoned because a peer died may still be completed by MPI later, and must
 * not write into reused memory.
 */
extern uint64_t rt_reduce_in[2], rt_reduce_out[2];

/* "before mr_init()" or "after mr_finalize()", for error messages. */
const char *rt_who(void);

#define RT_CHECK_READY(fn)                                                                   \
    do {                                                                                     \
        if (rt_state != RT_READY) {                                                          \
            mr_error("%s called %s.", fn, rt_who());                                         \
            return rt_state == RT_IN_HANDLER ? MR_ERR_IN_HANDLER : MR_ERR_NOT_INITIALIZED;    \
        }                                                                                    \
    } while (0)

/* Initialized: ready, or inside a handler (one comparison). */
#define RT_LIVE() ((unsigned)rt_state - RT_READY <= RT_IN_HANDLER - RT_READY)

/* For the calls a handler may make too (the sends): ready, or inside a handler. */
#define RT_CHECK_SEND(fn)                                                                    \
    do {                                                                                     \
        if (!RT_LIVE()) {                                                                    \
            mr_error("%s called %s.", fn, rt_who());                                         \
            return MR_ERR_NOT_INITIALIZED;                                                   \
        }                                                                                    \
    } while (0)

/* failures.c: peer failures, and notices of them around a ring of all ranks. */
/* Rank `rank` failed, as the substrate (reporter -1) or rank `reporter` says. */
void rt_peer_down(int rank, mr_status_t why, int reporter);
/* Whether a control immediate is a failure notice rather than credits. */
bool rt_is_notice(uint32_t imm);
/* A failure notice arrived from `source`. */
void rt_notice_arrived(int source, uint32_t imm);
/* Passes failure notices on to the next live rank; returns how many were sent. */
int rt_notices_forward(void);
/* After connect(): asks the substrate to watch this rank's two ring neighbours. */
mr_status_t rt_watch_neighbours(void);

/* items.c: aggregators (mailrail_items.h), a consumer of the datapath's item datagrams. */
/* Empties the table and registers the item layer with the datapath. */
void rt_items_init(void);
/* At finalize: destroys every aggregator and drops their queued datagrams. */
void rt_items_fini(void);
/* Drops every datagram waiting for an aggregator; returns how many. */
uint64_t rt_items_drop_arrivals(void);

/* handlers.c: active-message handlers (mailrail.h), the consumer of MR_KIND_HANDLER. */
/* Empties the table, allocates a queue per source and registers with the datapath. */
mr_status_t rt_handlers_init(void);
/* Frees the queues (after rt_handlers_stop(), with the datapath); safe when not allocated. */
void rt_handlers_fini(void);
/* At finalize: handlers run no more; returns how many waiting messages were dropped. */
uint64_t rt_handlers_stop(void);

/* connect.c: mr_connect(), connections made ahead of the traffic. */
/*
 * Tests mr_connect()'s reduction when one was left pending (MAILRAIL_TIMEOUT):
 * MR_OK once it completed (or when none is pending), MR_AGAIN while not yet,
 * or the bootstrap's error. A collective call makes sure of it before its own.
 */
mr_status_t rt_connect_settle(void);

/* job.c: what the ranks set up together at init, over the bootstrap. */
mr_status_t rt_agree(mr_status_t local);
mr_status_t rt_map_nodes(void);
mr_status_t rt_share_job_key(void);
mr_status_t rt_exchange_addresses(const uint8_t *addr, size_t len);
mr_status_t rt_barrier(void *core);
/* The bootstrap's blocking collectives, counted in mr_stats_t (init_collectives). */
mr_status_t rt_allgather(const void *send, void *recv, size_t len);
mr_status_t rt_bcast(void *buf, size_t len, int root);

/* settings_check.c: settings no module declares, and those that must agree. */
#define RT_SETTING_TABLES_MAX 8
/*
 * Fills tables[] and sizes[] (their structs' sizes) with the settings tables
 * of the core, of flow control and of every policy, at most `max`. Returns
 * how many.
 */
size_t rt_setting_tables(const mr_config_entry_t **tables, size_t *sizes, size_t max);
void rt_warn_unknown_settings(void);
mr_status_t rt_agree_settings(void);

#endif /* MR_RUNTIME_H */
