/*
 * The `rank` policy: credits per (sender rank, receiver rank) pair.
 *
 * Every receiver reserves for every sender, itself included, a share of its
 * receive pool: per_pair = MAILRAIL_RECV_SLOTS / ranks, or
 * MAILRAIL_RANK_CREDITS. With the setting at 0 a remote sender starts with 2
 * credits and the receiver grants back what it frees up to an adaptive window
 * (flowctl/credit.c, docs/flowctl.md); with a count set, the whole share is
 * granted at once, as in the paper. A sender spends one credit per message
 * and defers the message when it has none. Credits go back in a control
 * message or piggybacked on a data message going to that sender. Credits for
 * oneself are returned at once.
 */
#include "mr_credit.h"
#include "mr_log.h"

#include <stdlib.h>

typedef struct rank_config {
    uint64_t credits;    /* MAILRAIL_RANK_CREDITS; 0 derives it from the pool. */
} rank_config_t;

static const mr_config_entry_t rank_config_table[] = {
    {"MAILRAIL_RANK_CREDITS", "0", MR_CONFIG_UINT, offsetof(rank_config_t, credits), 0,
     1u << 24, NULL,
     "Under MAILRAIL_FLOWCTL=rank, the credits each receiver grants each sender, all at once "
     "(the paper used 8). 0 grants the share, MAILRAIL_RECV_SLOTS / ranks, at once to "
     "senders on the same host and adaptively to senders on other hosts: 2 to start, then "
     "what the receiver takes in over 1 ms (or two credit loops) at its best recent rate, "
     "shared by its active senders. Credits times ranks must fit in MAILRAIL_RECV_SLOTS; "
     "when that is not set, the pool grows to them."},
    {NULL, NULL, 0, 0, 0, 0, NULL, NULL},
};

struct mr_flowctl {
    int rank, size;
    uint32_t per_pair;
    bool piggyback;
    bool overflow_logged;
    uint64_t over_returned;   /* Credits returned beyond what was outstanding. */
    uint32_t *credits;        /* Per destination: credits this rank may spend. */
    mr_credit_owed_t owed;    /* Per sender: what this rank grants it. */
    mr_credit_clock_t clock;
    uint64_t piggybacked;
};

static void rank_finalize(mr_flowctl_t *fc)
{
    mr__credit_owed_fini(&fc->owed);
    mr__credit_clock_fini(&fc->clock);
    free(fc->credits);
    free(fc);
}

/* Works out the credits per pair, or explains why the pool cannot hold them. */
static mr_status_t rank_credits(const mr_flowctl_params_t *params, uint32_t *out)
{
    const rank_config_t *cfg = params->config;

    return mr__credit_share("rank", "MAILRAIL_RANK_CREDITS", "ranks", cfg->credits,
                            params->recv_slots, params->size, out);
}

/* One slot per rank at least, MAILRAIL_RANK_CREDITS per rank when set. */
static uint64_t rank_recv_slots_needed(const mr_flowctl_params_t *params)
{
    return mr__credit_slots_needed(((const rank_config_t *)params->config)->credits, params->size);
}

static mr_status_t rank_init(const mr_flowctl_params_t *params, mr_flowctl_t **out)
{
    mr_flowctl_t *fc;
    uint32_t per_pair;
    bool adaptive;
    mr_status_t status;

    status = rank_credits(params, &per_pair);
    if (status != MR_OK) return status;
    fc = calloc(1, sizeof(*fc));
    if (fc == NULL) {
        mr_error("Cannot allocate the rank flow-control state.");
        return MR_ERR_NO_MEMORY;
    }
    fc->rank = params->rank;
    fc->size = params->size;
    fc->per_pair = per_pair;
    fc->piggyback = params->piggyback;
    adaptive = ((const rank_config_t *)params->config)->credits == 0;
    fc->credits = malloc((size_t)params->size * sizeof(*fc->credits));
    if (fc->credits == NULL) {
        mr_error("Cannot allocate credits for %d ranks.", params->size);
        free(fc);
        return MR_ERR_NO_MEMORY;
    }
    /* Grants between ranks of one host never cross a network: all of them at once. */
    uint32_t *weight = calloc((size_t)params->size, sizeof(*weight));
    if (weight == NULL) {
        mr_error("Cannot allocate the host map of %d ranks.", params->size);
        rank_finalize(fc);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < params->size; r++) {
        weight[r] = params->host_of_rank[r] != params->host_of_rank[fc->rank];
        fc->credits[r] = weight[r] != 0 ? mr__credit_initial(per_pair, adaptive) : per_pair;
    }
    status = mr__credit_owed_init(&fc->owed, params->size, per_pair, adaptive, weight, params);
    free(weight);
    if (status == MR_OK) status = mr__credit_clock_init(&fc->clock, params->size);
    if (status != MR_OK) {
        rank_finalize(fc);
        return status;
    }
    mr_info("Rank flow control: up to %u credits per sender, %s.", per_pair,
            adaptive ? "granted adaptively (MAILRAIL_RANK_CREDITS=0)" : "all granted at once");
    *out = fc;
    return MR_OK;
}

/*
 * The per-message hooks handle the common case inline, without a call (and so
 * without a stack frame), and leave the rest to an out-of-line half that does
 * all of it: `_slow` is the whole hook.
 */

__attribute__((noinline)) static bool rank_acquire_slow(mr_flowctl_t *fc, int dest,
                                                        uint32_t *imm)
{
    if (fc->credits[dest] == 0) {
        /* A new wait asks the receiver for more credit. */
        if (fc->clock.since[dest] == 0 && dest != fc->rank) mr__credit_ask(&fc->owed, dest, dest);
        mr__credit_clock_blocked(&fc->clock, dest);
        return false;
    }
    mr__credit_clock_granted(&fc->clock, dest);
    fc->credits[dest]--;
    *imm = fc->piggyback && dest != fc->rank ? mr__credit_owed_take(&fc->owed, dest) : 0;
    fc->piggybacked += *imm;
    return true;
}

static bool rank_acquire(mr_flowctl_t *fc, int dest, uint32_t *imm)
{
    uint32_t credits = fc->credits[dest];

    if (fc->clock.since[dest] == 0) {
        /* A credit, no wait to end, nothing to piggyback. */
        if (credits != 0 &&
            (!fc->piggyback || dest == fc->rank || mr__credit_owed_take_none(&fc->owed, dest))) {
            fc->credits[dest] = credits - 1;
            *imm = 0;
            return true;
        }
    } else if (credits == 0) {
        return false; /* Still none, and the wait is timed already. */
    }
    return rank_acquire_slow(fc, dest, imm);
}

/* rank_acquire() of up to `want` credits: while nothing rides along, all those there. */
static uint32_t rank_acquire_n(mr_flowctl_t *fc, int dest, uint32_t want, uint32_t *imm)
{
    uint32_t credits = fc->credits[dest];

    if (fc->clock.since[dest] == 0 && credits != 0 &&
        (!fc->piggyback || dest == fc->rank || mr__credit_owed_take_none(&fc->owed, dest))) {
        uint32_t n = credits < want ? credits : want;
        fc->credits[dest] = credits - n;
        *imm = 0;
        return n;
    }
    return rank_acquire(fc, dest, imm) ? 1 : 0;
}

static void rank_unacquire(mr_flowctl_t *fc, int dest, uint32_t imm)
{
    fc->credits[dest]++;
    mr__credit_owed_put_back(&fc->owed, dest, imm);
    fc->piggybacked -= imm;
}

/* Credits come back from `source`; more than it ever granted is a peer's bug. */
static void rank_refill(mr_flowctl_t *fc, int source, uint32_t n)
{
    if (n > fc->per_pair - fc->credits[source]) {
        fc->over_returned += n - (fc->per_pair - fc->credits[source]);
        if (!fc->overflow_logged) {
            mr_error("Rank %d returned %u credits but only %u were outstanding; ignoring the "
                     "excess.", source, n, fc->per_pair - fc->credits[source]);
            fc->overflow_logged = true;
        }
        n = fc->per_pair - fc->credits[source];
    }
    fc->credits[source] += n;
}

__attribute__((noinline)) static void rank_on_arrival_slow(mr_flowctl_t *fc, int source,
                                                           uint32_t imm)
{
    if (source != fc->rank) mr__credit_owed_arrived(&fc->owed, source, source);
    if (imm != 0) rank_refill(fc, source, imm);
}

static void rank_on_arrival(mr_flowctl_t *fc, int source, uint32_t imm)
{
    /* No credits came with it, and it spent one of a static grant (or oneself's). */
    if (imm == 0 && (source == fc->rank || mr__credit_owed_arrived_fast(&fc->owed, source))) return;
    rank_on_arrival_slow(fc, source, imm);
}

static void rank_on_release(mr_flowctl_t *fc, int source)
{
    if (source == fc->rank) fc->credits[source]++;
    else if (!mr__credit_owed_consume_fast(&fc->owed, source, source)) {
        mr__credit_owed_consume(&fc->owed, source, source);
    }
}

static void rank_on_control(mr_flowctl_t *fc, int source, uint32_t imm)
{
    /* The sender asks for more (mr__credit_ask()). */
    if (imm == MR_CREDIT_ASK) mr__credit_owed_asked(&fc->owed, source);
    else rank_refill(fc, source, imm);
}

static int rank_progress(mr_flowctl_t *fc)
{
    return mr__credit_owed_progress(&fc->owed);
}

/* Credits for another rank come only in arrivals and control messages; oneself's on release. */
static bool rank_waits_for_progress(mr_flowctl_t *fc, int dest)
{
    return dest != fc->rank;
}

static void rank_stats(mr_flowctl_t *fc, mr_stats_t *stats)
{
    stats->piggybacked_credits += fc->piggybacked;
    stats->zero_credit_ns += fc->clock.total_ns;
    stats->breach_uncredited += fc->owed.uncredited;
    stats->breach_over_returned += fc->over_returned;
}

/* Every sender, this rank included, may have its share in flight. */
static uint64_t rank_recv_bound(mr_flowctl_t *fc)
{
    return (uint64_t)fc->per_pair * (uint64_t)fc->size;
}

static int rank_grants(mr_flowctl_t *fc, uint32_t *out, int count)
{
    return mr__credit_owed_outstanding(&fc->owed, out, count);
}

const mr_flowctl_ops_t mr__flowctl_rank_ops = {
    .abi_version = MR_FLOWCTL_ABI_VERSION,
    .ops_size = sizeof(mr_flowctl_ops_t),
    .name = "rank",
    .description = "Credits per sender and receiver pair (MAILRAIL_RANK_CREDITS).",
    .config_table = rank_config_table,
    .config_size = sizeof(rank_config_t),
    .init = rank_init,
    .acquire = rank_acquire,
    .acquire_n = rank_acquire_n,
    .unacquire = rank_unacquire,
    .on_arrival = rank_on_arrival,
    .on_release = rank_on_release,
    .on_control = rank_on_control,
    .progress = rank_progress,
    .stats = rank_stats,
    .finalize = rank_finalize,
    .recv_slots_needed = rank_recv_slots_needed,
    .grants = rank_grants,
    .recv_bound = rank_recv_bound,
    .waits_for_progress = rank_waits_for_progress,
};
