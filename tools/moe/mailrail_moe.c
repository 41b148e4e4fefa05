/*
 * mailrail_moe: one expert-parallel Mixture-of-Experts step, dispatch and
 * combine, as in DeepEP's and pplx-kernels' dispatch/combine, over MailRail
 * against what its users run today on CPU clusters, MPI_Alltoallv.
 *
 *   mpiexec -n P mailrail_moe [options]
 *     -T TOKENS      tokens per rank (default 4096)
 *     -H BYTES       bytes per token (default 7168: DeepSeek-V3's hidden size in FP8;
 *                    14336 for BF16)
 *     -k K           experts per token (default 8)
 *     -E EXPERTS     experts in all (default 256), E / P on each rank
 *     -z S           Zipf skew of the experts' popularity (default 1.0; 0 is uniform)
 *     --hot          the most popular experts on the last host (incast inside the
 *                    all-to-all); otherwise they are spread round robin over the ranks
 *     -r FILE        the routing from a router's trace: one line per token, its k
 *                    expert ids; token t of rank r takes line (r * T + t) mod lines
 *     -p CONTENDERS  comma-separated (default alltoallv,none,rank,node,node+h):
 *                    alltoallv, a flow-control policy, or a policy with +h (handlers)
 *     -t TRIALS      trials per contender, interleaved (default 3)
 *     --warmup N     untimed steps before each timed one (default 1)
 *     -s SEED        seed of the tokens and the routing (default: a fresh one each run,
 *                    printed; -s SEED repeats a run)
 *     -c FILE        append one CSV row per contender and trial to FILE; besides the
 *                    step's time it has what the timed step cost all ranks together:
 *                    CPU seconds (cpu_s), and MailRail's credit returns, credits
 *                    piggybacked, seconds blocked on credit and deferred sends
 *     -P COMMAND     rank 0 runs COMMAND (with sh) before and after each timed step; it
 *                    prints "bytes packets drops" of the bottleneck (tools/fabric's
 *                    $FABRIC_PORT_COUNTERS); the differences go to the output and CSV
 *     -w             idle ranks sleep (mr_wait, 1 ms at most; MPI through
 *                    nonblocking collectives tested with naps) instead of spinning
 *     -W MS          -w, for at most MS milliseconds at a time
 *     --timeout S    a step that has not ended after S seconds fails, naming the
 *                    (token, expert) pairs still missing (default 600)
 *     --inject F     for the tests: rank 0 drops, duplicates or flips a byte of its
 *                    first result of token 0 in the timed step (drop, duplicate, flip),
 *                    which the checks must name
 *     --pack         MailRail's contenders send tokens as items of the item layer
 *                    (mailrail_items.h), packed into datagrams per destination: set
 *                    MAILRAIL_DATAGRAM_SIZE to a multiple of 8 + H (+ 3) for several
 *                    tokens per transport message
 *     -q             only the summary lines
 *
 * One step: every rank holds T tokens of H bytes, each routed to k distinct
 * experts; each (token, expert) pair sends the token to the expert's rank
 * (dispatch), the expert transforms it (moe_model.h), and its result goes
 * back (combine), where the token's rank sums the k results and checks every
 * byte against a serial reference it computes itself. Each pair must arrive
 * exactly once; every error names the token, the expert and the rank.
 *
 * The contenders, with the same tokens and routing:
 *   alltoallv  what a user codes today: pack the tokens by destination,
 *              MPI_Alltoall of the counts, MPI_Alltoallv of the tokens, the
 *              expert compute over what arrived, MPI_Alltoallv back, combine.
 *   POLICY     MailRail under that flow-control policy: a token (or, when it
 *              is longer than a datagram, each datagram-sized piece of it) goes
 *              in a message of its own with an 8-byte header; an expert's rank
 *              transforms it straight from the receive slot into a send buffer
 *              and sends it back as it arrives, so dispatch, compute and
 *              combine overlap. Set MAILRAIL_DATAGRAM_SIZE above H + 8 for one
 *              message per pair (each receive slot and send buffer is that
 *              large: docs/workloads.md gives the memory).
 *   POLICY+h   the same through active-message handlers.
 * Each trial of a MailRail contender initializes MailRail afresh, connects
 * each rank to the ranks it exchanges tokens with (mr_connect, untimed), and
 * runs the warm-up steps and one timed step. A step is timed on every rank
 * from a common barrier to the moment its own k results of every token have
 * arrived; the step's time is the largest. Quiescence (mr_quiesce) and the
 * checks follow, untimed.
 */
#include "mailrail.h"
#include "moe_model.h"
#include "moe_step.h"
#include "tool_common.h"
#include "tool_mpi.h"

#include <getopt.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const moe_inject_names[] = {"none", "drop", "duplicate", "flip"};

static int moe_rank0_printf(const moe_rank_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int moe_rank0_printf(const moe_rank_t *r, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (r->rank != 0) return 0;
    va_start(ap, fmt);
    n = vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    return n;
}

/* ---- Trials. ---- */

/*
 * What the timed step cost, summed over all ranks: CPU seconds (getrusage,
 * user and system, MPI's and UCX's threads included), and MailRail's
 * flow-control counters (0 for alltoallv). Taken from before the step to
 * after its quiescence.
 */
enum { MOE_COST_CPU_S, MOE_COST_RETURNS, MOE_COST_PIGGYBACKED, MOE_COST_ZERO_CREDIT_S,
       MOE_COST_DEFERRED, MOE_COST_PARKED, MOE_COSTS };

/* What one trial of one contender measured, the same on every rank. */
typedef struct moe_trial {
    double seconds;
    int hottest_rank;
    double hottest_mib;
    long long port[3];
    double cost[MOE_COSTS];
    bool verified;
    int nodes;
} moe_trial_t;

/* This rank's costs so far (MailRail's counters only while it is initialized). */
static void moe_costs(bool mailrail, double cost[MOE_COSTS])
{
    mr_stats_t st = {.size = sizeof(st)};

    memset(cost, 0, MOE_COSTS * sizeof(*cost));
    cost[MOE_COST_CPU_S] = tool_cpu_s();
    if (!mailrail || mr_get_stats(&st) != MR_OK) return;
    cost[MOE_COST_RETURNS] = (double)st.credit_returns_sent;
    cost[MOE_COST_PIGGYBACKED] = (double)st.piggybacked_credits;
    cost[MOE_COST_ZERO_CREDIT_S] = (double)st.zero_credit_ns * 1e-9;
    cost[MOE_COST_DEFERRED] = (double)st.deferred_sends;
    cost[MOE_COST_PARKED] = (double)st.handler_parked;
}

/* Runs the --warmup steps, untimed, and one timed step of `c`; false when MailRail failed. */
static bool moe_run_steps(moe_rank_t *r, const tool_contender_t *c, double *seconds,
                          bool *verified, long long port[3], double cost[MOE_COSTS])
{
    const moe_options_t *o = r->o;
    long long before[3];
    double cost0[MOE_COSTS];
    bool ok = true, probed = false, all_checked = true;

    for (int s = 0; s <= o->warmup && ok; s++) {
        bool timed = s == o->warmup;
        moe_step_reset(r);
        if (timed && r->rank == 0) r->inject = o->inject;
        if (timed) probed = r->rank == 0 && o->port_command != NULL &&
                            tool_port_probe("mailrail_moe", o->port_command, before);
        if (timed) moe_costs(!c->mpi, cost0);
        if (c->mpi) {
            *seconds = moe_step_alltoallv(r);
        } else {
            mr_status_t st = o->pack ? moe_step_items(r, c, seconds)
                                     : moe_step_datagrams(r, c, seconds);
            if (st != MR_OK) {
                fprintf(stderr, "mailrail_moe: %s: rank %d: %s\n", c->name, r->rank,
                        mr_status_string(st));
                ok = false;
            }
        }
        if (timed) {
            moe_costs(!c->mpi, cost);
            for (int i = 0; i < MOE_COSTS; i++) cost[i] -= cost0[i];
        }
        if (timed && probed && tool_port_probe("mailrail_moe", o->port_command, port)) {
            for (int i = 0; i < 3; i++) port[i] -= before[i];
        } else if (timed) {
            for (int i = 0; i < 3; i++) port[i] = -1;
        }
        all_checked = moe_check(r, c->name) && all_checked;
    }
    *verified = ok && all_checked;
    return ok;
}

/* One trial of one contender; fills *out identically on every rank. */
static bool moe_trial(moe_rank_t *r, const tool_contender_t *c, moe_trial_t *out)
{
    const moe_options_t *o = r->o;
    MPI_Comm comm = MPI_COMM_WORLD;
    double seconds = 0, cost[MOE_COSTS] = {0};
    bool verified = false, ran = true;

    out->nodes = r->nodes;
    if (!c->mpi) {
        setenv("MAILRAIL_FLOWCTL", c->policy, 1);
        mr_status_t st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) {
            fprintf(stderr, "mailrail_moe: %s: rank %d: mr_init: %s\n", c->name, r->rank,
                    mr_status_string(st));
            tool_abort();
        }
        st = o->pack ? moe_items_open(r, c->handlers) : moe_datagrams_open(r, c->handlers);
        if (st == MR_ERR_MESSAGE_TOO_LONG) {
            /* The same on every rank: rank 0 says it, with the room that would do. */
            size_t enough = (o->hidden + MOE_MAX_PIECES - 1) / MOE_MAX_PIECES + 3 * MOE_HEADER;
            if (r->rank == 0) {
                fprintf(stderr, "mailrail_moe: -H %zu: a token would take more than %d datagrams "
                        "of MAILRAIL_DATAGRAM_SIZE=%zu; set it to at least %zu\n", o->hidden,
                        MOE_MAX_PIECES, mr_datagram_size(), enough);
            }
        } else if (st != MR_OK) {
            fprintf(stderr, "mailrail_moe: %s: rank %d: %s\n", c->name, r->rank,
                    mr_status_string(st));
        }
        if (st != MR_OK) tool_abort();
        /*
         * The ranks this one exchanges tokens with are connected now, untimed, with the
         * handlers registered, so that no step pays for dialling (--warmup 0 too).
         */
        if (tool_connect("mailrail_moe", r->peers, r->npeers) != MR_OK) tool_abort();
        out->nodes = mr_node_count();
    }
    ran = moe_run_steps(r, c, &seconds, &verified, out->port, cost);
    if (!c->mpi) {
        if (!tool_invariants_hold("mailrail_moe")) verified = false;
        if (ran && mr_finalize() != MR_OK) verified = false;
        if (!ran) tool_abort(); /* Peers may wait for this rank forever. */
    }
    /* The step's time, its verdict and the rank that received the most. */
    int mine_ok = verified, all_ok = 0;
    moe_allreduce(o, &seconds, &out->seconds, 1, MPI_DOUBLE, MPI_MAX);
    moe_allreduce(o, &mine_ok, &all_ok, 1, MPI_INT, MPI_MIN);
    moe_allreduce(o, cost, out->cost, MOE_COSTS, MPI_DOUBLE, MPI_SUM);
    struct { double bytes; int rank; } mine = {(double)r->bytes_received, r->rank}, hottest;
    moe_allreduce(o, &mine, &hottest, 1, MPI_DOUBLE_INT, MPI_MAXLOC);
    out->hottest_rank = hottest.rank;
    out->hottest_mib = hottest.bytes / 1048576.0;
    out->verified = all_ok != 0;
    return out->verified;
}

/* ---- Set-up: options, routing, placement, the reference. ---- */

static void moe_usage(void)
{
    fprintf(stderr, "usage: mpiexec -n P mailrail_moe [-T tokens] [-H bytes] [-k K] [-E experts] "
            "[-z skew] [--hot] [-r routing-file] [-p alltoallv,none,rank,node,node+h] "
            "[-t trials] [--warmup N] [-s seed] [-c file.csv] [-P command] [-w | -W ms] "
            "[--timeout s] [--pack] [-q]\n");
}

/* Parses the options; returns false (rank 0 says why) on a bad one. */
static bool moe_parse(int argc, char **argv, moe_options_t *o, int rank)
{
    static const struct option longs[] = {{"hot", no_argument, NULL, 'o'},
                                          {"warmup", required_argument, NULL, 'u'},
                                          {"timeout", required_argument, NULL, 'x'},
                                          {"inject", required_argument, NULL, 'i'},
                                          {"pack", no_argument, NULL, 'K'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *contenders = "alltoallv,none,rank,node,node+h";
    uint64_t v;
    bool ok = true;
    int c;

    *o = (moe_options_t){.tokens = 4096, .hidden = 7168, .k = 8, .experts = 256, .skew = 1.0,
                         .trials = 3, .warmup = 1, .seed = 1, .wait_ms = 1, .timeout_s = 600};
    bool k_given = false;
    while ((c = getopt_long(argc, argv, "T:H:k:E:z:r:p:t:s:c:P:W:wqh", longs, NULL)) != -1) {
        char *end = NULL;
        const char *what = NULL;
        switch (c) {
        case 'T': if (!tool_parse_uint(optarg, 1, UINT32_MAX, &o->tokens)) what = "-T takes 1 to 4294967295 tokens"; break;
        case 'H': if (!tool_parse_uint(optarg, 1, SIZE_MAX / 2, &v)) what = "-H takes a size of at least 1 byte"; else o->hidden = (size_t)v; break;
        case 'k': if (!tool_parse_unsigned(optarg, &o->k) || o->k < 1 || o->k > MOE_MAX_K) what = "-k takes 1 to 64 experts per token"; k_given = true; break;
        case 'E': if (!tool_parse_unsigned(optarg, &o->experts) || o->experts < 1 || o->experts > MOE_MAX_EXPERTS) what = "-E takes 1 to 65535 experts"; break;
        case 'z': o->skew = strtod(optarg, &end); if (end == optarg || *end != '\0' || !(o->skew >= 0 && o->skew <= 10)) what = "-z takes a skew from 0 to 10"; break;
        case 'o': o->hot = true; break;
        case 'r': o->routing_file = optarg; break;
        case 'p': contenders = optarg; break;
        case 't': if (!tool_parse_int(optarg, 1, MOE_MAX_TRIALS, &o->trials)) what = "-t takes 1 to 64 trials"; break;
        case 'u': if (!tool_parse_int(optarg, 0, 100, &o->warmup)) what = "--warmup takes 0 to 100 steps"; break;
        case 's':
            if (!tool_parse_uint(optarg, 0, UINT64_MAX, &o->seed)) what = "-s takes an unsigned seed";
            o->seed_given = true;
            break;
        case 'c': o->csv = optarg; break;
        case 'P': o->port_command = optarg; break;
        case 'w': o->wait = true; break;
        case 'W': o->wait = true; if (!tool_parse_int(optarg, 0, 60000, &o->wait_ms)) what = "-W takes 0 to 60000 ms"; break;
        case 'x': o->timeout_s = strtod(optarg, &end); if (end == optarg || *end != '\0' || !(o->timeout_s > 0)) what = "--timeout takes a positive number of seconds"; break;
        case 'q': o->quiet = true; break;
        case 'K': o->pack = true; break;
        case 'i':
            o->inject = -1;
            for (int f = 0; f < 4; f++) {
                if (strcmp(optarg, moe_inject_names[f]) == 0) o->inject = f;
            }
            if (o->inject < 0) what = "--inject takes none, drop, duplicate or flip";
            break;
        default: what = ""; break;
        }
        if (what != NULL) {
            if (rank == 0 && *what) fprintf(stderr, "mailrail_moe: %s\n", what);
            ok = false;
        }
    }
    if (ok && optind < argc) {
        if (rank == 0) fprintf(stderr, "mailrail_moe: unexpected argument '%s'\n", argv[optind]);
        ok = false;
    }
    if (ok && (o->ncontenders = tool_parse_contenders(contenders, o->contenders, MOE_MAX_CONTENDERS)) < 0) {
        if (rank == 0) fprintf(stderr, "mailrail_moe: -p %s: give alltoallv or a flow-control "
                               "policy (none, rank, node), optionally with +h, comma-separated\n",
                               contenders);
        ok = false;
    }
    if (ok && o->routing_file != NULL && !k_given) o->k = 0; /* The file's first line says. */
    return ok;
}

/* Checks the sizes against each other and the job; rank 0 says what is wrong. */
static bool moe_check_sizes(const moe_options_t *o, int size, int rank)
{
    const char *why = NULL;
    char buf[256];

    if (o->experts % (unsigned)size != 0) {
        snprintf(buf, sizeof(buf), "-E %u is not a multiple of the %d ranks: each rank holds "
                 "E / P experts", o->experts, size);
        why = buf;
    } else if (o->k > o->experts) {
        snprintf(buf, sizeof(buf), "-k %u exceeds -E %u: a token picks k distinct experts", o->k,
                 o->experts);
        why = buf;
    } else if ((size_t)o->tokens * o->k > (size_t)INT_MAX) {
        snprintf(buf, sizeof(buf), "-T %llu x -k %u pairs exceed what MPI counts (%d)",
                 (unsigned long long)o->tokens, o->k, INT_MAX);
        why = buf;
    } else if (o->hidden > (size_t)INT_MAX - MOE_HEADER) {
        snprintf(buf, sizeof(buf), "-H %zu is larger than an MPI record can be", o->hidden);
        why = buf;
    }
    if (why != NULL && rank == 0) fprintf(stderr, "mailrail_moe: %s\n", why);
    return why == NULL;
}

/*
 * The routing of this rank's tokens: drawn with the seed, or rows of the file
 * that rank 0 read and everybody received. Also the experts' popularity
 * order. Returns false (rank 0 says why) on a bad file.
 */
static bool moe_route(moe_rank_t *r, moe_options_t *o, unsigned *order)
{
    moe_routing_t file = {0};
    char why[512] = "";
    unsigned long long head[2] = {0, 0};

    r->route = malloc((size_t)o->tokens * (o->k ? o->k : MOE_MAX_K) * sizeof(*r->route));
    if (o->routing_file == NULL) {
        moe_routing_t mine = {0};
        if (!moe_routing_zipf(&mine, o->tokens, o->k, o->experts, o->skew,
                              o->seed * 0x100000001B3ull + (uint64_t)r->rank)) {
            fprintf(stderr, "mailrail_moe: rank %d: out of memory\n", r->rank);
            tool_abort();
        }
        memcpy(r->route, mine.route, (size_t)o->tokens * o->k * sizeof(*r->route));
        moe_routing_free(&mine);
        for (unsigned e = 0; e < o->experts; e++) order[e] = e;
        return true;
    }
    if (r->rank == 0) {
        if (moe_routing_read(&file, o->routing_file, o->k, o->experts, why, sizeof(why))) {
            head[0] = file.tokens;
            head[1] = file.k;
        } else {
            fprintf(stderr, "mailrail_moe: -r %s\n", why);
        }
    }
    MPI_Bcast(head, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (head[0] == 0) return false;
    o->k = (unsigned)head[1];
    if (r->rank != 0) {
        file.tokens = head[0];
        file.k = o->k;
        file.experts = o->experts;
        file.route = malloc(file.tokens * file.k * sizeof(*file.route));
    }
    MPI_Bcast(file.route, (int)(file.tokens * file.k), MPI_UINT16_T, 0, MPI_COMM_WORLD);
    for (uint64_t t = 0; t < o->tokens; t++) {
        uint64_t line = ((uint64_t)r->rank * o->tokens + t) % file.tokens;
        memcpy(r->route + t * o->k, file.route + line * o->k, o->k * sizeof(*r->route));
    }
    moe_popularity(&file, order);
    moe_routing_free(&file);
    return true;
}

/* The hosts as MailRail sees them (MAILRAIL_RANKS_PER_NODE, or the host names). */
static int moe_hosts(moe_rank_t *r, int **last_host, int *nlast)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    mr_status_t st;

    setenv("MAILRAIL_FLOWCTL", "none", 1);
    if ((st = mr_init_mpi(&comm, sizeof(comm))) != MR_OK) {
        fprintf(stderr, "mailrail_moe: rank %d: mr_init: %s\n", r->rank, mr_status_string(st));
        tool_abort();
    }
    int nodes = mr_node_count(), last = mr_node_of(r->size - 1);
    *last_host = malloc((size_t)r->size * sizeof(int));
    *nlast = 0;
    for (int i = 0; i < r->size; i++) {
        if (mr_node_of(i) == last) (*last_host)[(*nlast)++] = i;
    }
    mr_finalize();
    return nodes;
}

static void moe_print_setup(const moe_rank_t *r, int nlast)
{
    const moe_options_t *o = r->o;
    size_t bytes = (size_t)o->tokens * o->k * o->hidden;

    moe_rank0_printf(r, "# mailrail_moe: %d ranks on %d host(s), %llu tokens of %zu B per rank, "
                     "k=%u of E=%u experts (%u per rank), ", r->size, r->nodes,
                     (unsigned long long)o->tokens, o->hidden, o->k, o->experts,
                     o->experts / (unsigned)r->size);
    if (o->routing_file != NULL) moe_rank0_printf(r, "routing from %s", o->routing_file);
    else moe_rank0_printf(r, "Zipf s=%.2f", o->skew);
    moe_rank0_printf(r, ", experts %s; %.1f MiB dispatched per rank per step; %d trial(s), "
                     "%d warm-up step(s)\n",
                     o->hot ? (nlast < r->size ? "hot on the last host" :
                                                 "spread (--hot: one host only)")
                            : "spread",
                     (double)bytes / 1048576.0, o->trials, o->warmup);
}

/*
 * The ranks this one exchanges tokens with, for mr_connect(): the owners of
 * the experts its tokens go to, and the ranks whose tokens come to its own
 * experts (an all-to-all of one flag per pair tells). Not every pair: at 1,024
 * ranks that would be 523,776 connections for 8 destinations per token.
 */
static bool moe_peers(moe_rank_t *r)
{
    const moe_options_t *o = r->o;
    char *to = calloc((size_t)r->size, 1), *from = calloc((size_t)r->size, 1);
    MPI_Request req;

    r->peers = malloc((size_t)r->size * sizeof(*r->peers));
    if (to == NULL || from == NULL || r->peers == NULL) {
        free(to);
        free(from);
        return false;
    }
    for (uint64_t i = 0; i < o->tokens * o->k; i++) to[r->owner[r->route[i]]] = 1;
    MPI_Ialltoall(to, 1, MPI_CHAR, from, 1, MPI_CHAR, MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, moe_nap_ns(o));
    r->npeers = 0;
    for (int p = 0; p < r->size; p++) {
        if (p != r->rank && (to[p] || from[p])) r->peers[r->npeers++] = p;
    }
    free(to);
    free(from);
    return true;
}

int main(int argc, char **argv)
{
    moe_options_t o;
    moe_rank_t r = {.o = &o};
    int status = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    if (!moe_parse(argc, argv, &o, r.rank)) {
        if (r.rank == 0) moe_usage();
        MPI_Finalize();
        return 2;
    }
    if (!moe_check_sizes(&o, r.size, r.rank)) {
        MPI_Finalize();
        return 2;
    }
    /* A fresh seed unless -s gave one: rank 0's, so that the routing is the same everywhere. */
    if (!o.seed_given && r.rank == 0) o.seed = tool_fresh_seed();
    MPI_Bcast(&o.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    moe_rank0_printf(&r, "# mailrail_moe: seed %llu\n", (unsigned long long)o.seed);
    unsigned *order = malloc(o.experts * sizeof(*order));
    if (!moe_route(&r, &o, order) || !moe_check_sizes(&o, r.size, r.rank)) {
        free(order);
        free(r.route);
        MPI_Finalize();
        return 2;
    }
    int *last_host, nlast;
    r.nodes = moe_hosts(&r, &last_host, &nlast);
    r.owner = malloc(o.experts * sizeof(*r.owner));
    moe_place(o.experts, r.size, order, o.hot, last_host, nlast, r.owner);
    free(order);
    free(last_host);
    if (!moe_peers(&r)) {
        fprintf(stderr, "mailrail_moe: rank %d: out of memory for the list of peers\n", r.rank);
        tool_abort();
    }

    /* This rank's tokens and the serial reference of their combine. */
    size_t tbytes = (size_t)o.tokens * o.hidden;
    r.tokens = malloc(tbytes + 1);
    r.reference = calloc(tbytes + 1, 1);
    r.acc = malloc(tbytes + 1);
    r.arrived = malloc((size_t)o.tokens * o.k * sizeof(*r.arrived));
    uint8_t *scratch = malloc(o.hidden);
    if (r.tokens == NULL || r.reference == NULL || r.acc == NULL || r.arrived == NULL ||
        scratch == NULL) {
        fprintf(stderr, "mailrail_moe: rank %d: out of memory for %zu bytes of tokens\n", r.rank,
                tbytes);
        tool_abort();
    }
    for (uint64_t t = 0; t < o.tokens; t++) {
        uint8_t *tok = r.tokens + t * o.hidden;
        moe_token_bytes(o.seed, r.rank, t, 0, tok, o.hidden);
        for (unsigned j = 0; j < o.k; j++) {
            moe_expert_apply(r.route[t * o.k + j], 0, tok, scratch, o.hidden);
            moe_accumulate(r.reference + t * o.hidden, scratch, o.hidden);
        }
    }
    free(scratch);
    moe_print_setup(&r, nlast);

    FILE *csv = NULL;
    if (r.rank == 0 && o.csv != NULL) {
        csv = fopen(o.csv, "a");
        if (csv == NULL) perror(o.csv);
        else if (ftell(csv) == 0) {
            fprintf(csv, "contender,trial,ranks,nodes,tokens,hidden,k,experts,skew,hot,routing,"
                         "seconds,tokens_per_s,hottest_rank,hottest_mib,port_bytes,port_packets,"
                         "port_drops,verified,packed,cpu_s,credit_returns,piggybacked_credits,"
                         "zero_credit_s,deferred_sends\n");
        }
    }
    if (!o.quiet) {
        moe_rank0_printf(&r, "# %-10s %5s %10s %14s %8s %12s %12s %10s\n", "contender", "trial",
                         "seconds", "tokens/s", "hottest", "hottest MiB", "port bytes",
                         "port drops");
    }
    double secs[MOE_MAX_CONTENDERS][MOE_MAX_TRIALS];
    moe_trial_t last[MOE_MAX_CONTENDERS];
    long long drops[MOE_MAX_CONTENDERS][MOE_MAX_TRIALS];
    double costs[MOE_MAX_CONTENDERS][MOE_COSTS][MOE_MAX_TRIALS];
    for (int k = 0; k < o.trials && status == 0; k++) {
        for (int c = 0; c < o.ncontenders && status == 0; c++) {
            moe_trial_t t = {0};
            const tool_contender_t *ct = &o.contenders[c];
            if (!moe_trial(&r, ct, &t)) {
                moe_rank0_printf(&r, "mailrail_moe: %s trial %d failed the check (seed %llu: "
                                 "rerun with -s %llu)\n", ct->name, k,
                                 (unsigned long long)o.seed, (unsigned long long)o.seed);
                status = 1;
                break;
            }
            secs[c][k] = t.seconds;
            drops[c][k] = t.port[2];
            for (int i = 0; i < MOE_COSTS; i++) costs[c][i][k] = t.cost[i];
            last[c] = t;
            double rate = (double)o.tokens * r.size / t.seconds;
            if (!o.quiet) {
                moe_rank0_printf(&r, "  %-10s %5d %10.4f %14.0f %8d %12.1f %12lld %10lld\n",
                                 ct->name, k, t.seconds, rate, t.hottest_rank, t.hottest_mib,
                                 t.port[0], t.port[2]);
            }
            if (csv != NULL) {
                fprintf(csv, "%s,%d,%d,%d,%llu,%zu,%u,%u,%.2f,%d,%s,%.6f,%.0f,%d,%.3f,%lld,%lld,"
                        "%lld,1,%d,%.3f,%.0f,%.0f,%.3f,%.0f\n", ct->name, k, r.size, t.nodes,
                        (unsigned long long)o.tokens, o.hidden, o.k, o.experts,
                        o.routing_file ? 0.0 : o.skew, o.hot, o.routing_file ? "file" : "zipf",
                        t.seconds, rate, t.hottest_rank, t.hottest_mib, t.port[0], t.port[1],
                        t.port[2], o.pack, t.cost[MOE_COST_CPU_S], t.cost[MOE_COST_RETURNS],
                        t.cost[MOE_COST_PIGGYBACKED], t.cost[MOE_COST_ZERO_CREDIT_S],
                        t.cost[MOE_COST_DEFERRED]);
                fflush(csv);
            }
        }
    }
    if (status == 0 && r.rank == 0) {
        int base = -1;
        for (int c = 0; c < o.ncontenders; c++) {
            if (o.contenders[c].mpi && base < 0) base = c;
        }
        double base_median = 0, lo, hi;
        if (base >= 0) {
            double copy[MOE_MAX_TRIALS];
            memcpy(copy, secs[base], (size_t)o.trials * sizeof(double));
            tool_spread(copy, o.trials, &lo, &base_median, &hi);
        }
        for (int c = 0; c < o.ncontenders; c++) {
            double median;
            tool_spread(secs[c], o.trials, &lo, &median, &hi);
            printf("mailrail_moe: %s: median %.4f s per step (min %.4f, max %.4f over %d "
                   "trials), %.0f tokens/s, hottest rank %d received %.1f MiB", o.contenders[c].name,
                   median, lo, hi, o.trials, (double)o.tokens * r.size / median,
                   last[c].hottest_rank, last[c].hottest_mib);
            if (base >= 0) printf(", %.2f of alltoallv", median / base_median);
            if (drops[c][0] >= 0) {
                long long sum = 0;
                for (int k = 0; k < o.trials; k++) sum += drops[c][k];
                printf(", %lld port drops per step", sum / o.trials);
            }
            printf(", %.2f CPU s of all ranks", tool_median(costs[c][MOE_COST_CPU_S], o.trials));
            if (!o.contenders[c].mpi) {
                printf(", %.0f credit returns, %.2f s of sends blocked on credit "
                       "(destinations summed)", tool_median(costs[c][MOE_COST_RETURNS], o.trials),
                       tool_median(costs[c][MOE_COST_ZERO_CREDIT_S], o.trials));
            }
            if (o.contenders[c].handlers) {
                printf(", %.0f messages parked while handlers waited to send",
                       tool_median(costs[c][MOE_COST_PARKED], o.trials));
            }
            printf("\n");
        }
        printf("mailrail_moe: every token's combine matches the serial reference\n");
        fflush(stdout);
    }
    if (csv != NULL) fclose(csv);
    free(r.route);
    free(r.owner);
    free(r.peers);
    free(r.tokens);
    free(r.reference);
    free(r.acc);
    free(r.arrived);
    moe_park_free(&r);
    moe_items_free(&r);
    moe_alltoallv_free(&r);
    MPI_Finalize();
    return status;
}
