/*
 * The flow-control seam. Internal.
 *
 * A policy decides when the core may hand a data message to the substrate,
 * what immediate travels with it (piggybacked credits), and what to do when a
 * message arrives, when the application releases a receive slot and when a
 * control message comes in. The core calls these hooks from its send and
 * receive paths and never looks inside a policy; `none`, `rank` and `node`
 * each live in a directory of their own under flowctl/.
 */
#ifndef MR_FLOWCTL_H
#define MR_FLOWCTL_H

#include "mailrail.h"
#include "mr_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MR_FLOWCTL_ABI_VERSION 1

/* Flow control's settings (flowctl_settings.c), shared by every policy. */
typedef struct mr_flowctl_config {
    unsigned policy;                  /* Index into mr__flowctl_names. */
    uint64_t credit_return_threshold; /* Return credits after 1/this of them were consumed. */
    uint64_t credit_horizon_us;       /* The shortest time an adaptive window covers. */
    bool credit_grow;                 /* Senders that wait ask; their windows grow. */
    bool piggyback;                   /* Carry owed credits on data messages. */
} mr_flowctl_config_t;

extern const mr_config_entry_t mr__flowctl_config_table[];

typedef struct mr_flowctl mr_flowctl_t; /* A policy's own state. */

/* What the core offers a policy. */
typedef struct mr_flowctl_params {
    int rank;
    int size;
    int node_count;
    const int *node_of_rank;
    const int *host_of_rank;     /* The physical host: adaptive grants only cross hosts. */
    size_t recv_slots;
    unsigned return_threshold;   /* MAILRAIL_CREDIT_RETURN_THRESHOLD. */
    uint64_t horizon_ns;         /* MAILRAIL_CREDIT_HORIZON_US; 0 takes its default. */
    bool grow;                   /* MAILRAIL_CREDIT_GROW. */
    bool piggyback;              /* MAILRAIL_PIGGYBACK. */
    const char *job_id;
    const void *config;     /* The policy's settings, parsed from its table. */
    void *core;
    /* Sends a control message (zero payload, `imm` only) to `dest`. */
    mr_status_t (*send_control)(void *core, int dest, uint32_t imm);
    /* The messages this rank has deferred to `dest` now: sends waiting for credit. */
    uint32_t (*deferred)(void *core, int dest);
    /* Blocks until every rank called it (for shared set-up at init only). */
    mr_status_t (*barrier)(void *core);
} mr_flowctl_params_t;

typedef struct mr_flowctl_ops {
    uint32_t abi_version;
    uint32_t ops_size;
    const char *name;
    const char *description;
    const mr_config_entry_t *config_table; /* May be NULL. */
    size_t config_size;

    /* Sets *out only on MR_OK. Logs its own errors. */
    mr_status_t (*init)(const mr_flowctl_params_t *params, mr_flowctl_t **out);

    /*
     * Takes one credit for a data message to `dest` and sets *imm to what
     * travels with it (piggybacked credits; 0 for this rank). Returns false
     * when there is no credit: the message stays deferred.
     */
    bool (*acquire)(mr_flowctl_t *fc, int dest, uint32_t *imm);

    /* Gives back a credit taken by acquire() for a send the substrate refused. */
    void (*unacquire)(mr_flowctl_t *fc, int dest, uint32_t imm);

    /* A data message from `source` arrived carrying `imm`. */
    void (*on_arrival)(mr_flowctl_t *fc, int source, uint32_t imm);

    /* The application released a receive slot that held a message from `source`. */
    void (*on_release)(mr_flowctl_t *fc, int source);

    /* A control message from `source` arrived. */
    void (*on_control)(mr_flowctl_t *fc, int source, uint32_t imm);

    /* Retries control messages the substrate refused earlier. Returns work done. */
    int (*progress)(mr_flowctl_t *fc);

    /* Adds the policy's counters to *stats, breaches of its invariants included. */
    void (*stats)(mr_flowctl_t *fc, mr_stats_t *stats);

    /* Frees everything. */
    void (*finalize)(mr_flowctl_t *fc);
    /*
     * The receive slots the policy needs for params->size ranks on
     * params->node_count nodes with its settings (params->config); the core
     * grows an unset MAILRAIL_RECV_SLOTS to it before init(). May be NULL:
     * any pool will do.
     */
    uint64_t (*recv_slots_needed)(const mr_flowctl_params_t *params);
    /*
     * Copies up to `count` holders' outstanding credits (granted, messages not
     * arrived) into `out`; returns the number of holders. NULL: none granted.
     */
    int (*grants)(mr_flowctl_t *fc, uint32_t *out, int count);
    /*
     * A descriptor that becomes readable when this rank should wake from a
     * sleep in mr_wait() for credits (another process put them in shared
     * memory), or -1. The core adds it to the substrate's wait once. NULL: none.
     */
    int (*wake_fd)(mr_flowctl_t *fc);
    /*
     * Called with sleeping = true before the core sleeps with sends waiting for
     * credit, when the substrate waits on wake_fd(); returns true when the
     * policy asked to be woken, and the core then offers the deferred sends
     * credits once more before it sleeps. Called with false after the sleep.
     */
    bool (*sleep)(mr_flowctl_t *fc, bool sleeping);
    /*
     * The most messages this policy lets be in flight to this rank at once:
     * every holder's credits added up. The core checks arrivals against it
     * (mr_stats_t.breach_beyond_grant). NULL: the policy bounds nothing.
     */
    uint64_t (*recv_bound)(mr_flowctl_t *fc);
    /*
     * Called after acquire() found no credit for `dest`: true when no credit
     * for `dest` can come before the next progress() (they only come with
     * arrivals and control messages, which substrates upcall from progress
     * only), so that the core need not ask again until then. NULL: credit may
     * come at any time (from other processes, say).
     */
    bool (*waits_for_progress)(mr_flowctl_t *fc, int dest);
    /*
     * True when acquire() always grants a credit with imm 0 and on_arrival()
     * and on_release() do nothing: the core then skips those calls on every
     * message (`none`).
     */
    bool unconstrained;
    /*
     * acquire() of up to `want` (> 0) credits for `dest` at once, for the
     * core's drain of messages queued for it: returns how many it took, each
     * as an acquire() call would have taken it (0 when acquire() would have
     * found none; 1 when the first call differs from the next ones, as when
     * it ends a wait); *imm rides on the first message, 0 on the others
     * (each is given back with unacquire(), the first with *imm). NULL: the
     * core calls acquire() per message.
     */
    uint32_t (*acquire_n)(mr_flowctl_t *fc, int dest, uint32_t want, uint32_t *imm);
} mr_flowctl_ops_t;

/* Names accepted by MAILRAIL_FLOWCTL, NULL-terminated, in table order. */
extern const char *const mr__flowctl_names[];

/*
 * The policy called `name`, or NULL when this build has none by that name
 * (a policy listed in mr__flowctl_names but not yet built).
 */
const mr_flowctl_ops_t *mr__flowctl_find(const char *name);

#endif /* MR_FLOWCTL_H */
