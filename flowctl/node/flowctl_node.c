/*
 * The `node` policy: all ranks of a sending node share one pool of credits
 * per receiving rank.
 *
 * Every receiver reserves for every node, its own included, a share of its
 * receive pool: per_node = MAILRAIL_RECV_SLOTS / nodes, or
 * MAILRAIL_NODE_CREDITS. With the setting at 0 a remote node starts with 2
 * credits and the receiver grants back what it frees up to an adaptive window
 * (flowctl/credit.c, docs/flowctl.md); with a count set, the whole share is
 * granted at once, as in the paper. The pool of a node lives in a
 * shared-memory segment (mr_node_segment_t), so a rank spends credits that
 * its neighbours freed without waiting for the receiver. The receiver returns
 * credits to the rank whose message it released last (or piggybacks them on
 * a data message to any rank of that node); that rank deposits them in its
 * node's pool. Credits of the receiver's own node (its whole share from the
 * start) go straight back into the shared pool: intra-node credit updates
 * never touch the network.
 */
#include "mr_credit.h"
#include "mr_log.h"
#include "mr_node_segment.h"
#include "mr_node_wake.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct node_config {
    uint64_t credits;    /* MAILRAIL_NODE_CREDITS; 0 derives it from the pool. */
} node_config_t;

static const mr_config_entry_t node_config_table[] = {
    {"MAILRAIL_NODE_CREDITS", "0", MR_CONFIG_UINT, offsetof(node_config_t, credits), 0,
     1u << 24, NULL,
     "Under MAILRAIL_FLOWCTL=node, the credits each receiver grants each sending node, shared "
     "by all ranks of that node, all at once (the paper used 512). 0 grants the share, "
     "MAILRAIL_RECV_SLOTS / nodes, at once to nodes on the same host and adaptively to nodes "
     "on other hosts: 2 to start, then what the receiver takes in over 1 ms (or two credit "
     "loops) at its best recent rate, shared by its active nodes. Credits times nodes must fit "
     "in MAILRAIL_RECV_SLOTS; when that is not set, the pool grows to them."},
    {NULL, NULL, 0, 0, 0, 0, NULL, NULL},
};

struct mr_flowctl {
    int rank, node;
    const int *node_of;
    uint32_t per_node;
    bool piggyback;
    bool creator;
    bool overflow_logged;
    uint64_t over_returned;   /* Credits deposited beyond a receiver's grant to this node. */
    int node_count;
    char segment_name[128];
    mr_node_segment_t *seg;
    mr_credit_owed_t owed;    /* Per sending node: what this rank grants it. */
    uint32_t local_owed;      /* Consumed credits of this node's own senders, not yet deposited. */
    uint32_t local_return_at; /* Deposit them in batches of this many. */
    bool adaptive;
    mr_credit_clock_t clock;
    uint64_t piggybacked;
    /*
     * Credits taken from the shared pools ahead of need, per receiving rank:
     * one atomic operation per batch instead of per message. Every progress
     * call puts what is left back (node_stash_return), so neighbours never
     * wait long on credits this rank is not using. Listed ranks have a stash.
     */
    uint32_t *stash;
    bool *listed;
    int *stashed;
    int nstashed;
    /* Sleeping for credits of the shared pools, and waking neighbours (node_wake.c). */
    mr_node_wake_t wake;
    int *local_rank;          /* The node's ranks, ascending. */
    int nblocked;             /* Receivers this rank's sends wait for credits of, */
    int blocked_hint;         /* the last of them to run out. */
    void *core;
    uint32_t (*deferred)(void *core, int dest); /* Sends this rank waits to make to `dest`. */
};

/*
 * The most credits one acquire takes from a shared pool: a quarter of what
 * is there, so that a scarce pool still goes round the node's ranks.
 */
#define NODE_STASH_MAX 32

static void node_stash_return(mr_flowctl_t *fc, bool keep_wanted);

static void node_finalize(mr_flowctl_t *fc)
{
    if (fc->seg != NULL) node_stash_return(fc, false);
    mr__node_wake_close(&fc->wake);
    free(fc->local_rank);
    mr__node_segment_unmap(fc->seg);
    free(fc->stash);
    free(fc->listed);
    free(fc->stashed);
    mr__credit_owed_fini(&fc->owed);
    mr__credit_clock_fini(&fc->clock);
    free(fc);
}

static mr_status_t node_credits(const mr_flowctl_params_t *params, uint32_t *out)
{
    const node_config_t *cfg = params->config;

    return mr__credit_share("node", "MAILRAIL_NODE_CREDITS", "nodes", cfg->credits,
                            params->recv_slots, params->node_count, out);
}

/* One slot per sending node at least, MAILRAIL_NODE_CREDITS per node when set. */
static uint64_t node_recv_slots_needed(const mr_flowctl_params_t *params)
{
    return mr__credit_slots_needed(((const node_config_t *)params->config)->credits,
                                   params->node_count);
}

/*
 * The node's lowest rank creates the segment; after a barrier the others map
 * it; after a second barrier the creator unlinks its name. Every rank goes
 * through both barriers whatever happened, so that a failure cannot hang the
 * others here.
 */
static mr_status_t node_attach(mr_flowctl_t *fc, const mr_flowctl_params_t *params)
{
    mr_status_t status = MR_OK, barrier;
    int leader = 0;

    while (params->node_of_rank[leader] != fc->node) leader++;
    fc->creator = leader == fc->rank;
    mr__node_segment_name(fc->segment_name, sizeof(fc->segment_name), params->job_id, fc->node);
    if (fc->creator) {
        mr__node_segment_cleanup_stale();
        status = mr__node_segment_create(fc->segment_name, params->job_id, fc->node,
                                        params->size, fc->wake.nlocal, fc->per_node, &fc->seg);
        /* Receivers on other hosts grant little to start; on this host, all at once. */
        int my_host = params->host_of_rank[fc->rank];
        for (int r = 0; status == MR_OK && r < params->size; r++) {
            uint32_t n = params->host_of_rank[r] == my_host
                             ? fc->per_node
                             : mr__credit_initial(fc->per_node, fc->adaptive);
            atomic_store(&fc->seg->credits[r].n, n);
        }
    }
    barrier = params->barrier(params->core);
    if (!fc->creator && status == MR_OK && barrier == MR_OK) {
        status = mr__node_segment_open(fc->segment_name, params->job_id, fc->node, params->size,
                                      fc->wake.nlocal, fc->per_node, &fc->seg);
    }
    if (barrier == MR_OK) barrier = params->barrier(params->core);
    /* Every rank of the node has mapped it (or failed): the name is no longer needed. */
    if (fc->creator && fc->seg != NULL) mr__node_segment_unlink(fc->segment_name);
    return status != MR_OK ? status : barrier;
}

/* The ranks of this node, ascending, and this rank's index among them. */
static mr_status_t node_list_local(mr_flowctl_t *fc, const mr_flowctl_params_t *params)
{
    int n = 0;

    fc->local_rank = malloc((size_t)params->size * sizeof(*fc->local_rank));
    if (fc->local_rank == NULL) {
        mr_error("Cannot allocate the rank list of node %d.", fc->node);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < params->size; r++) {
        if (params->node_of_rank[r] != fc->node) continue;
        if (r == fc->rank) fc->wake.me = n;
        fc->local_rank[n++] = r;
    }
    fc->wake.nlocal = n;
    return MR_OK;
}

static mr_status_t node_init(const mr_flowctl_params_t *params, mr_flowctl_t **out)
{
    mr_flowctl_t *fc;
    uint32_t per_node;
    mr_status_t status;

    status = node_credits(params, &per_node);
    if (status != MR_OK) return status;
    fc = calloc(1, sizeof(*fc));
    if (fc == NULL) {
        mr_error("Cannot allocate the node flow-control state.");
        return MR_ERR_NO_MEMORY;
    }
    mr__node_wake_init(&fc->wake);
    fc->rank = params->rank;
    fc->node = params->node_of_rank[params->rank];
    fc->node_of = params->node_of_rank;
    fc->per_node = per_node;
    fc->node_count = params->node_count;
    fc->piggyback = params->piggyback;
    fc->core = params->core;
    fc->deferred = params->deferred;
    fc->adaptive = ((const node_config_t *)params->config)->credits == 0;
    fc->local_return_at = mr__credit_return_at(per_node, params->return_threshold);
    /* Sending nodes on other hosts get adaptive grants, a share per rank; between
       ranks of one host there is no network to protect. A node's ranks share a host. */
    uint32_t *weight = calloc((size_t)params->node_count, sizeof(*weight));
    for (int r = 0; weight != NULL && r < params->size; r++) {
        if (params->host_of_rank[r] != params->host_of_rank[params->rank]) {
            weight[params->node_of_rank[r]]++;
        }
    }
    if (weight == NULL) mr_error("Cannot allocate the host map of %d nodes.", params->node_count);
    status = weight == NULL ? MR_ERR_NO_MEMORY
                            : mr__credit_owed_init(&fc->owed, params->node_count, per_node,
                                                  fc->adaptive, weight, params);
    free(weight);
    if (status == MR_OK) mr__credit_owed_cumulative(&fc->owed);
    if (status == MR_OK) status = mr__credit_clock_init(&fc->clock, params->size);
    if (status == MR_OK) status = node_list_local(fc, params);
    if (status == MR_OK) {
        fc->stash = calloc((size_t)params->size, sizeof(*fc->stash));
        fc->listed = calloc((size_t)params->size, sizeof(*fc->listed));
        fc->stashed = calloc((size_t)params->size, sizeof(*fc->stashed));
        if (fc->stash == NULL || fc->listed == NULL || fc->stashed == NULL) {
            mr_error("Cannot allocate the credit stash of %d ranks.", params->size);
            status = MR_ERR_NO_MEMORY;
        }
    }
    /* Every rank must reach the barriers in node_attach, even after a local failure. */
    mr_status_t attached = node_attach(fc, params);
    if (status == MR_OK) status = attached;
    if (status == MR_OK) {
        status = mr__node_wake_open(&fc->wake, fc->seg, params->job_id, fc->local_rank,
                                   fc->wake.nlocal, fc->wake.me);
    }
    if (status != MR_OK) {
        node_finalize(fc);
        return status;
    }
    mr_info("Node flow control: up to %u credits per sending node, %s; segment %s.", per_node,
            fc->adaptive ? "granted adaptively (MAILRAIL_NODE_CREDITS=0)" : "all granted at once",
            fc->segment_name);
    *out = fc;
    return MR_OK;
}

/* Makes sure node_stash_return() visits `dest`. */
static void node_stash_list(mr_flowctl_t *fc, int dest)
{
    if (!fc->listed[dest]) {
        fc->listed[dest] = true;
        fc->stashed[fc->nstashed++] = dest;
    }
}

/* Moves credits for `dest` from the shared pool into this rank's stash; false when it is empty. */
static bool node_stash_fill(mr_flowctl_t *fc, int dest)
{
    _Atomic uint32_t *pool = &fc->seg->credits[dest].n;
    uint32_t have = atomic_load_explicit(pool, memory_order_relaxed), take;

    do {
        if (have == 0) return false;
        take = have / 4;
        take = take < 1 ? 1 : take > NODE_STASH_MAX ? NODE_STASH_MAX : take;
    } while (!atomic_compare_exchange_weak_explicit(pool, &have, have - take, memory_order_acq_rel,
                                                    memory_order_relaxed));
    fc->stash[dest] = take;
    if (take > 1) node_stash_list(fc, dest);
    return true;
}

/* The sends to `dest` this rank waits to make beyond the credits in its stash. */
static uint32_t node_demand(const mr_flowctl_t *fc, int dest)
{
    uint32_t queued = fc->deferred != NULL ? fc->deferred(fc->core, dest) : 0;

    return queued > fc->stash[dest] ? queued - fc->stash[dest] : 0;
}

/*
 * Puts stashed credits back into the shared pools: all of them, or, with
 * keep_wanted, those beyond what this rank's deferred sends take right after
 * this progress call (the core drains them then).
 */
static void node_stash_return(mr_flowctl_t *fc, bool keep_wanted)
{
    int kept = 0;

    for (int i = 0; i < fc->nstashed; i++) {
        int dest = fc->stashed[i];
        uint32_t keep = 0;
        if (keep_wanted && fc->deferred != NULL) {
            uint32_t queued = fc->deferred(fc->core, dest);
            keep = queued < fc->stash[dest] ? queued : fc->stash[dest];
        }
        uint32_t back = fc->stash[dest] - keep;
        if (back > 0) {
            atomic_fetch_add_explicit(&fc->seg->credits[dest].n, back, memory_order_acq_rel);
            mr__node_wake_others(&fc->wake, dest, back);
            fc->stash[dest] = keep;
        }
        if (keep > 0) {
            fc->stashed[kept++] = dest;
        } else {
            fc->listed[dest] = false;
        }
    }
    fc->nstashed = kept;
}

/*
 * The node's pool for `dest` ran dry under a send of this rank: asks the
 * receiver for more credit (mr__credit_ask()), unless a rank of the node
 * asked since the last deposit.
 */
static void node_ask(mr_flowctl_t *fc, int dest)
{
    _Atomic uint32_t *asked = &fc->seg->credits[dest].asked;
    int dest_node = fc->node_of[dest];

    if (!fc->owed.grow || !fc->owed.key[dest_node].adaptive ||
        atomic_exchange_explicit(asked, 1, memory_order_relaxed) != 0) {
        return;
    }
    if (mr__credit_ask(&fc->owed, dest_node, dest) != MR_OK) {
        atomic_store_explicit(asked, 0, memory_order_relaxed); /* Another rank may ask. */
    }
}

/*
 * The per-message hooks handle the common case inline, without a call (and so
 * without a stack frame), and leave the rest to an out-of-line half that does
 * all of it: `_slow` is the whole hook.
 */

__attribute__((noinline)) static bool node_acquire_slow(mr_flowctl_t *fc, int dest,
                                                        uint32_t *imm)
{
    int dest_node = fc->node_of[dest];

    if (fc->stash[dest] == 0 && !node_stash_fill(fc, dest)) {
        if (fc->clock.since[dest] == 0) {
            fc->nblocked++;
            fc->blocked_hint = dest;
            node_ask(fc, dest);
        }
        mr__credit_clock_blocked(&fc->clock, dest);
        return false;
    }
    fc->stash[dest]--;
    if (fc->clock.since[dest] != 0) fc->nblocked--;
    mr__credit_clock_granted(&fc->clock, dest);
    /* Credits owed to the destination's node ride along (never to one's own node). */
    uint32_t n = fc->piggyback && dest_node != fc->node ? mr__credit_owed_take(&fc->owed, dest_node)
                                                        : 0;
    *imm = mr__credit_owed_wire(&fc->owed, dest_node, n);
    fc->piggybacked += n;
    return true;
}

/* True when nothing owed to the node of `dest` may ride on a message to it. */
static inline bool node_take_none(const mr_flowctl_t *fc, int dest)
{
    int dest_node = fc->node_of[dest];

    return dest_node == fc->node || mr__credit_owed_take_none(&fc->owed, dest_node);
}

static bool node_acquire(mr_flowctl_t *fc, int dest, uint32_t *imm)
{
    uint32_t stash = fc->stash[dest];

    if (fc->clock.since[dest] == 0) {
        /* A credit in the stash, no wait to end, nothing to piggyback. */
        if (stash != 0 && (!fc->piggyback || node_take_none(fc, dest))) {
            fc->stash[dest] = stash - 1;
            *imm = 0;
            return true;
        }
    } else if (stash == 0 &&
               atomic_load_explicit(&fc->seg->credits[dest].n, memory_order_relaxed) == 0) {
        return false; /* Still none, in the stash or the pool, and the wait is timed already. */
    }
    return node_acquire_slow(fc, dest, imm);
}

/* node_acquire() of up to `want` credits: while nothing rides along, all those in the stash. */
static uint32_t node_acquire_n(mr_flowctl_t *fc, int dest, uint32_t want, uint32_t *imm)
{
    uint32_t stash = fc->stash[dest];

    if (fc->clock.since[dest] == 0 && stash != 0 && (!fc->piggyback || node_take_none(fc, dest))) {
        uint32_t n = stash < want ? stash : want;
        fc->stash[dest] = stash - n;
        *imm = 0;
        return n;
    }
    return node_acquire(fc, dest, imm) ? 1 : 0;
}

/*
 * Puts credits for receiver `dest` into this node's shared pool. Those that
 * this rank's own deferred sends to `dest` can use go to its stash instead:
 * it runs now, and the core drains its queue right after the upcall, while a
 * sleeping neighbour would first have to be woken and scheduled. The rest
 * wakes as many sleeping neighbours as it takes to use them.
 */
static void node_deposit(mr_flowctl_t *fc, int dest, uint32_t n)
{
    uint32_t keep = dest == fc->rank ? 0 : node_demand(fc, dest);
    _Atomic uint32_t *asked = &fc->seg->credits[dest].asked;

    /* Credit came: the next rank to run dry may ask again. */
    if (atomic_load_explicit(asked, memory_order_relaxed) != 0) {
        atomic_store_explicit(asked, 0, memory_order_relaxed);
    }

    if (keep > n) keep = n;
    if (keep > 0) {
        fc->stash[dest] += keep;
        node_stash_list(fc, dest);
        n -= keep;
        if (n == 0) return;
    }
    uint32_t before = atomic_fetch_add_explicit(&fc->seg->credits[dest].n, n, memory_order_acq_rel);

    mr__node_wake_others(&fc->wake, dest, n);
    if (before + n > fc->per_node) {
        fc->over_returned += before >= fc->per_node ? n : before + n - fc->per_node;
        if (!fc->overflow_logged) {
            mr_error("Rank %d's credits for this node reached %u, more than the %u it grants; "
                     "a peer returned credits it was not owed.", dest, before + n, fc->per_node);
            fc->overflow_logged = true;
        }
    }
}

/*
 * A return from receiver `dest` that says it has granted this node `total`
 * credits so far: deposits what this node has not had of them. Returns come
 * to any rank of the node, over several connections, and may be said twice
 * (credit.c repeats one a lost packet may hold up): the segment keeps the
 * total applied, and only a larger one adds credits.
 */
static void node_deposit_total(mr_flowctl_t *fc, int dest, uint32_t total)
{
    _Atomic uint32_t *applied = &fc->seg->credits[dest].total;
    uint32_t old = atomic_load_explicit(applied, memory_order_relaxed), gain;

    do {
        gain = mr__credit_total_gain(old, total);
        if (gain == 0) return; /* Said before, or overtaken. */
    } while (!atomic_compare_exchange_weak_explicit(applied, &old, total, memory_order_acq_rel,
                                                    memory_order_relaxed));
    node_deposit(fc, dest, gain);
}

static void node_unacquire(mr_flowctl_t *fc, int dest, uint32_t imm)
{
    /* Into the stash: a substrate that refuses now (MPI's send window) is asked again soon. */
    fc->stash[dest]++;
    node_stash_list(fc, dest);
    fc->piggybacked -= mr__credit_owed_put_back(&fc->owed, fc->node_of[dest], imm);
}

__attribute__((noinline)) static void node_on_arrival_slow(mr_flowctl_t *fc, int source,
                                                           uint32_t imm)
{
    int source_node = fc->node_of[source];

    if (source_node != fc->node) mr__credit_owed_arrived(&fc->owed, source_node, source);
    if (imm != 0) node_deposit_total(fc, source, imm);
}

static void node_on_arrival(mr_flowctl_t *fc, int source, uint32_t imm)
{
    int source_node = fc->node_of[source];

    /* No credits came with it, and it spent one of this node's or of a static grant. */
    if (imm == 0 &&
        (source_node == fc->node || mr__credit_owed_arrived_fast(&fc->owed, source_node))) {
        return;
    }
    node_on_arrival_slow(fc, source, imm);
}

__attribute__((noinline)) static void node_on_release_slow(mr_flowctl_t *fc, int source)
{
    int source_node = fc->node_of[source];

    /*
     * A sender on this node gets its credits back through the shared pool,
     * in batches of the static share's return threshold, so that sender and
     * receiver do not fight over the pool's cache line for every message.
     * Safe: a sender that runs out has left every credit with this receiver,
     * which deposits once local_return_at are consumed.
     */
    if (source_node == fc->node) {
        if (++fc->local_owed >= fc->local_return_at) {
            node_deposit(fc, fc->rank, fc->local_owed);
            fc->local_owed = 0;
        }
    } else {
        mr__credit_owed_consume(&fc->owed, source_node, source);
    }
}

static void node_on_release(mr_flowctl_t *fc, int source)
{
    int source_node = fc->node_of[source];

    /* Short of a deposit (this node's senders) or of a return (another node's). */
    if (source_node == fc->node) {
        if (fc->local_owed + 1 < fc->local_return_at) {
            fc->local_owed++;
            return;
        }
    } else if (mr__credit_owed_consume_fast(&fc->owed, source_node, source)) {
        return;
    }
    node_on_release_slow(fc, source);
}

static void node_on_control(mr_flowctl_t *fc, int source, uint32_t imm)
{
    int source_node = fc->node_of[source];

    /* A rank of that node asks for more (node_ask()). */
    if (imm == MR_CREDIT_ASK) {
        if (source_node != fc->node) mr__credit_owed_asked(&fc->owed, source_node);
        return;
    }
    node_deposit_total(fc, source, imm);
}

__attribute__((noinline)) static int node_progress_slow(mr_flowctl_t *fc)
{
    if (fc->nstashed > 0) node_stash_return(fc, true);
    mr__node_wake_progress(&fc->wake);
    return mr__credit_owed_progress(&fc->owed);
}

static int node_progress(mr_flowctl_t *fc)
{
    /* No stash to put back, no wake-up to read. */
    if (fc->nstashed == 0 && !fc->wake.expect) return mr__credit_owed_progress(&fc->owed);
    return node_progress_slow(fc);
}

static void node_stats(mr_flowctl_t *fc, mr_stats_t *stats)
{
    stats->piggybacked_credits += fc->piggybacked;
    stats->zero_credit_ns += fc->clock.total_ns;
    stats->breach_uncredited += fc->owed.uncredited;
    stats->breach_over_returned += fc->over_returned;
}

/* Every sending node, this rank's own included, may have its share in flight. */
static uint64_t node_recv_bound(mr_flowctl_t *fc)
{
    return (uint64_t)fc->per_node * (uint64_t)fc->node_count;
}

static int node_wake_fd(mr_flowctl_t *fc)
{
    return fc->wake.fd;
}

/*
 * Before a sleep: puts the stash back (a neighbour may use it meanwhile) and,
 * with sends waiting for credits of the shared pools, asks to be woken when
 * credits for the receiver it waits for (or for any) come in, saying how many
 * it can use. After: awake.
 */
static bool node_sleep(mr_flowctl_t *fc, bool sleeping)
{
    uint32_t waits_for, want = 1;

    if (!sleeping) return mr__node_wake_sleep(&fc->wake, false, 0, 0);
    /* A sleeping rank keeps no credits: a neighbour may use them meanwhile. */
    if (fc->nstashed > 0) node_stash_return(fc, false);
    if (fc->nblocked == 0) return false;
    if (fc->nblocked == 1 && fc->clock.since[fc->blocked_hint] != 0) {
        waits_for = (uint32_t)fc->blocked_hint + 1;
        want = node_demand(fc, fc->blocked_hint);
    } else {
        waits_for = MR_NODE_WAIT_ANY;
    }
    return mr__node_wake_sleep(&fc->wake, true, waits_for, want > 0 ? want : 1);
}

static int node_grants(mr_flowctl_t *fc, uint32_t *out, int count)
{
    return mr__credit_owed_outstanding(&fc->owed, out, count);
}

const mr_flowctl_ops_t mr__flowctl_node_ops = {
    .abi_version = MR_FLOWCTL_ABI_VERSION,
    .ops_size = sizeof(mr_flowctl_ops_t),
    .name = "node",
    .description = "Credits per sending node, shared in memory by its ranks (MAILRAIL_NODE_CREDITS).",
    .config_table = node_config_table,
    .config_size = sizeof(node_config_t),
    .init = node_init,
    .acquire = node_acquire,
    .acquire_n = node_acquire_n,
    .unacquire = node_unacquire,
    .on_arrival = node_on_arrival,
    .on_release = node_on_release,
    .on_control = node_on_control,
    .progress = node_progress,
    .stats = node_stats,
    .finalize = node_finalize,
    .recv_slots_needed = node_recv_slots_needed,
    .grants = node_grants,
    .wake_fd = node_wake_fd,
    .sleep = node_sleep,
    .recv_bound = node_recv_bound,
};
