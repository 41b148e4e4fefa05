/*
 * mailrail_graph: a distributed graph kernel on MailRail — vertex degrees,
 * then triangle counting — written against the public API only, as a graph
 * analytics code embedding MailRail would be.
 *
 *   mpiexec -n N mailrail_graph (-f FILE | -r SCALE) [options]
 *     -f FILE     edge list: SNAP-style text ("u v" per line, '#' or '%' comments,
 *                 ids 0 to 2^63-1) or the binary form written by -o; read in
 *                 parallel slices by all ranks
 *     -r SCALE    generate an R-MAT graph of 2^SCALE vertices instead (Graph500
 *                 parameters a=0.57, b=0.19, c=0.19)
 *     -e FACTOR   R-MAT edge factor: edges = FACTOR x 2^SCALE (default 16)
 *     -S SEED     R-MAT seed (default: a fresh one each run, printed; -S SEED repeats a run)
 *     -p POLICIES comma-separated flow-control policies (default: MAILRAIL_FLOWCTL or none)
 *     -t TRIALS   runs of the kernel per policy (default 1)
 *     -V          also compute the result serially on rank 0 and compare
 *     -c FILE     append one CSV row per policy, trial and phase to FILE
 *     -o FILE     write the loaded edges to FILE in the binary form and stop
 *     -q          only the result lines
 *     -P          one MailRail session per phase instead of one for the whole kernel
 *     -H          records handled by item handlers (mr_items_handler) in progress,
 *                 instead of pulled: a phase's handler is installed when the phase
 *                 starts, so records of the next one wait in their aggregator
 *
 * Vertices are owned by hash. Records go to their owners through
 * aggregators of MailRail's item layer (mailrail_items.h), which pack them
 * per owner into datagrams; records for this rank go through them too,
 * without touching the network. The kernel has three phases, each ended by
 * mr_items_end_phase(), which includes MailRail's quiescence:
 *   degree    every edge (u, v) goes to the owners of u and v; owners build
 *             sorted, de-duplicated adjacency lists. A hub's owner receives
 *             one record per edge of the hub: it is the incast phase.
 *   orient    every vertex tells its neighbours' owners its degree, so that each
 *             edge can be oriented from the lower (degree, id) to the higher.
 *   triangle  every vertex u sends, for each pair v < w of its higher
 *             neighbours, a query "is w adjacent to v?" to v's owner, which
 *             counts a triangle when it is. Each triangle is counted once.
 * One MailRail session (mr_init to mr_finalize) carries all three phases, as
 * in an application: a rank starts the next phase as soon as it has seen
 * quiescence and built what it needs. Each phase has its own aggregator, so
 * records of a phase that reach a rank still finishing the previous one wait,
 * zero copy, in that aggregator until the rank gets there. Messages and bytes
 * are the datagrams between ranks, counted by the phase they belong to when
 * their records are handled; credit returns are differences of
 * mr_get_stats(). The peak receive slots are exact when a phase sets a new
 * high for the session, and otherwise sampled whenever the kernel drains.
 * With -P, MailRail is initialized afresh for each phase instead (not timed) and the
 * ranks start each phase together, so the peaks are exact.
 *
 * Checked every run: the owners received exactly two arcs per edge that is not
 * a self loop; every neighbour degree arrived exactly once; every query was
 * answered once; the degree sum is twice the edge count; and every policy and
 * trial gives the same result. -V adds the serial reference.
 */
#include "graph_dist.h"
#include "graph_edges.h"
#include "graph_serial.h"
#include "mailrail.h"
#include "mailrail_items.h"
#include "tool_common.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GRAPH_MAX_POLICIES 3
#define GRAPH_MAX_TRIALS 64
/* Larger than any vertex id, and below 2^63 (see graph_reduce). */
#define GRAPH_NO_VERTEX ((uint64_t)GRAPH_MAX_VERTEX_ID)
/* The header in front of the items of every datagram (mailrail_items.h). */
#define GRAPH_DATAGRAM_HEADER 8

typedef struct graph_options {
    const char *file;
    graph_rmat_t rmat;
    bool use_rmat;
    bool seed_given;         /* -S; else rank 0 draws a fresh R-MAT seed. */
    const char *policies[GRAPH_MAX_POLICIES];
    int npolicies;
    int trials;
    bool verify;
    const char *csv;
    const char *convert;
    bool quiet;
    bool session_per_phase;
    bool handlers;
} graph_options_t;

typedef enum graph_phase { GRAPH_DEGREE, GRAPH_ORIENT, GRAPH_TRIANGLE, GRAPH_PHASES } graph_phase_t;
static const char *const graph_phase_names[GRAPH_PHASES] = {"degree", "orient", "triangle"};

/* This rank's part of the graph. */
typedef struct graph_local {
    int rank, size;
    graph_edges_t input;       /* The edges this rank read or generated. */
    uint64_t self_loops;       /* Among them. */
    graph_edges_t arcs;        /* Degree phase: (u owned here, neighbour v), repeats included. */
    uint64_t arcs_received;    /* Their number, kept once they are freed. */
    size_t nv;                 /* Vertices owned here that have an edge. */
    uint64_t *ids;             /* Their ids, sorted. */
    size_t *offs;              /* Adjacency of ids[i]: adj[offs[i] .. offs[i + 1]). */
    uint64_t *adj;             /* Sorted, without repeats. */
    uint64_t *nbr_degree;      /* Degree of adj[k], filled by the orient phase. */
    uint64_t nbr_degrees_set;  /* Orient messages applied. */
    uint64_t duplicate_arcs;
    uint64_t queries_sent;     /* Triangle queries sent (or answered locally). */
    uint64_t queries_answered;
    uint64_t triangles;
    uint64_t bad_records;      /* Records naming a vertex or arc that is not here. */
    /*
     * One aggregator per phase, created in phase order by every rank at the
     * start of a session, so that records of the next phase wait in their
     * own aggregator until this rank gets there.
     */
    mr_items_t *items[GRAPH_PHASES];
    bool sample_slots;         /* One session for all phases: sample the receive slots. */
    uint64_t sampled_peak_slots;
    /* Datagrams from other ranks and their bytes, by the phase they belong to. */
    uint64_t datagrams_received[GRAPH_PHASES], bytes_received[GRAPH_PHASES];
    bool handlers;             /* -H: records go to item handlers, run in progress. */
} graph_local_t;

typedef void (*graph_handler_t)(graph_local_t *g, const uint64_t *record);

/* What one phase measured on this rank. */
typedef struct graph_phase_local {
    double seconds;
    uint64_t messages, bytes_received, credit_returns;
    uint64_t peak_slots, peak_rss_kb;
    uint64_t early;            /* Messages that were here when this rank began the phase. */
} graph_phase_local_t;

/* What one phase measured, reduced over ranks. */
typedef struct graph_phase_result {
    double seconds;
    uint64_t messages, bytes, credit_returns, early;
    int busiest;                /* The rank that received the most bytes. */
    double busiest_share;       /* Its share of all bytes received. */
    uint64_t busiest_peak_slots;
    uint64_t busiest_peak_rss_kb;
} graph_phase_result_t;


static int graph_rank0_printf(const graph_local_t *g, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int graph_rank0_printf(const graph_local_t *g, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (g->rank != 0) return 0;
    va_start(ap, fmt);
    n = vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    return n;
}

static int graph_owner(const graph_local_t *g, uint64_t id)
{
    return graph_owner_of(id, g->size);
}

/* Stops every rank: a communication error leaves no consistent way to go on. */
static void graph_die(const graph_local_t *g, const char *what, mr_status_t st)
{
    fprintf(stderr, "mailrail_graph: rank %d: %s: %s\n", g->rank, what, mr_status_string(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- The exchange: records through one aggregator per phase. ---- */

static void graph_on_arc(graph_local_t *g, const uint64_t *r);
static void graph_on_degree(graph_local_t *g, const uint64_t *r);
static void graph_on_query(graph_local_t *g, const uint64_t *r);

/* The records of each phase: their words, and what their owner does with them. */
static const size_t graph_record_words[GRAPH_PHASES] = {2, 3, 2};
static const graph_handler_t graph_handlers[GRAPH_PHASES] = {graph_on_arc, graph_on_degree,
                                                             graph_on_query};

/* With -H: the item handler of each phase and what it needs. */
typedef struct graph_handler_ctx {
    graph_local_t *g;
    graph_phase_t phase;
} graph_handler_ctx_t;

static graph_handler_ctx_t graph_handler_ctx[GRAPH_PHASES];

/* One record, in progress (-H). Datagrams are not seen: messages come from the counters. */
static mr_status_t graph_item_handler(const mr_item_t *item, void *arg)
{
    const graph_handler_ctx_t *c = arg;

    graph_handlers[c->phase](c->g, item->data);
    if (item->source != c->g->rank) c->g->bytes_received[c->phase] += item->length;
    return MR_OK;
}

/*
 * Handles every record of `phase` that has arrived, a datagram at a time
 * (with -H, progress runs the phase's handler on them). Records of the next
 * phase stay in their own aggregator.
 */
static void graph_drain(graph_local_t *g, graph_phase_t phase)
{
    size_t words = graph_record_words[phase];
    const void *data;
    size_t count;
    int source;
    mr_status_t st;

    if (g->sample_slots) {
        mr_stats_t now = {.size = sizeof(now)};
        if (mr_get_stats(&now) == MR_OK && now.recv_slots_in_use > g->sampled_peak_slots) {
            g->sampled_peak_slots = now.recv_slots_in_use;
        }
    }
    if (g->handlers) {
        st = mr_poll();
        if (st < 0) graph_die(g, "mr_poll", st);
        return;
    }
    for (;;) {
        st = mr_items_pull_block(g->items[phase], &data, &count, &source);
        /* MailRail dropped (and logged) a datagram that did not match: the check fails. */
        if (st == MR_ERR_PROTOCOL) {
            g->bad_records++;
            continue;
        }
        if (st != MR_OK) break;
        /* Items of a multiple of 8 bytes are 8-byte aligned (mailrail_items.h). */
        const uint64_t *records = data;
        for (size_t r = 0; r < count; r++) graph_handlers[phase](g, records + r * words);
        if (source != g->rank) {
            g->datagrams_received[phase]++;
            g->bytes_received[phase] += GRAPH_DATAGRAM_HEADER + count * words * sizeof(uint64_t);
        }
    }
    if (st != MR_AGAIN) graph_die(g, "mr_items_pull_block", st);
}

/* Queues one record of `phase` for `owner`, handling records while MailRail pushes back. */
static void graph_push(graph_local_t *g, graph_phase_t phase, int owner, const uint64_t *record)
{
    size_t bytes = graph_record_words[phase] * sizeof(uint64_t);
    mr_status_t st;

    while ((st = mr_items_push(g->items[phase], record, bytes, owner)) == MR_AGAIN) {
        graph_drain(g, phase);
    }
    if (st != MR_OK) graph_die(g, "mr_items_push", st);
}

/* Handles records until every rank has handled every record of the phase. */
static void graph_end_phase(graph_local_t *g, graph_phase_t phase)
{
    mr_status_t st;

    do {
        graph_drain(g, phase);
        st = mr_items_end_phase(g->items[phase]);
    } while (st == MR_AGAIN);
    if (st != MR_OK) graph_die(g, "mr_items_end_phase", st);
}

/* ---- Phase handlers and generators. ---- */

/* Degree phase: (u, v) arrives at the owner of u. */
static void graph_on_arc(graph_local_t *g, const uint64_t *r)
{
    if (graph_owner(g, r[0]) != g->rank || !graph_edges_push(&g->arcs, r[0], r[1])) {
        g->bad_records++;
    }
}

static void graph_send_arcs(graph_local_t *g)
{
    g->self_loops = 0;
    for (size_t e = 0; e < g->input.count; e++) {
        uint64_t u = g->input.edge[e].u, v = g->input.edge[e].v;
        if (u == v) {
            g->self_loops++;
            continue;
        }
        graph_push(g, GRAPH_DEGREE, graph_owner(g, u), (const uint64_t[]){u, v});
        graph_push(g, GRAPH_DEGREE, graph_owner(g, v), (const uint64_t[]){v, u});
    }
}

/* Orient phase: (w, u, degree of u) arrives at the owner of w. */
static void graph_on_degree(graph_local_t *g, const uint64_t *r)
{
    long i = graph_search(g->ids, g->nv, r[0]);
    long k = i < 0 ? -1 : graph_search(g->adj + g->offs[i], g->offs[i + 1] - g->offs[i], r[1]);

    if (k < 0 || g->nbr_degree[g->offs[i] + (size_t)k] != 0) {
        g->bad_records++;
        return;
    }
    g->nbr_degree[g->offs[i] + (size_t)k] = r[2];
    g->nbr_degrees_set++;
}

static void graph_send_degrees(graph_local_t *g)
{
    for (size_t i = 0; i < g->nv; i++) {
        uint64_t degree = g->offs[i + 1] - g->offs[i];
        for (size_t k = g->offs[i]; k < g->offs[i + 1]; k++) {
            graph_push(g, GRAPH_ORIENT, graph_owner(g, g->adj[k]),
                       (const uint64_t[]){g->adj[k], g->ids[i], degree});
        }
    }
}

/* Triangle phase: "is w adjacent to v?" arrives at the owner of v. */
static void graph_on_query(graph_local_t *g, const uint64_t *r)
{
    long i = graph_search(g->ids, g->nv, r[0]);

    if (i < 0) {
        g->bad_records++;
        return;
    }
    g->queries_answered++;
    if (graph_search(g->adj + g->offs[i], g->offs[i + 1] - g->offs[i], r[1]) >= 0) g->triangles++;
}

/* A neighbour with its degree, for the (degree, id) order. */
typedef struct graph_ranked {
    uint64_t degree, id;
} graph_ranked_t;

static int graph_compare_ranked(const void *a, const void *b)
{
    const graph_ranked_t *x = a, *y = b;
    if (x->degree != y->degree) return x->degree < y->degree ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void graph_send_queries(graph_local_t *g)
{
    size_t max_degree = 0;
    graph_ranked_t *higher;

    for (size_t i = 0; i < g->nv; i++) {
        if (g->offs[i + 1] - g->offs[i] > max_degree) max_degree = g->offs[i + 1] - g->offs[i];
    }
    higher = malloc((max_degree + 1) * sizeof(*higher));
    if (higher == NULL) graph_die(g, "triangle phase", MR_ERR_NO_MEMORY);
    for (size_t i = 0; i < g->nv; i++) {
        graph_ranked_t self = {g->offs[i + 1] - g->offs[i], g->ids[i]};
        size_t n = 0;
        for (size_t k = g->offs[i]; k < g->offs[i + 1]; k++) {
            graph_ranked_t other = {g->nbr_degree[k], g->adj[k]};
            if (graph_compare_ranked(&self, &other) < 0) higher[n++] = other;
        }
        qsort(higher, n, sizeof(*higher), graph_compare_ranked);
        for (size_t a = 0; a < n; a++) {
            for (size_t b = a + 1; b < n; b++) {
                g->queries_sent++;
                graph_push(g, GRAPH_TRIANGLE, graph_owner(g, higher[a].id),
                           (const uint64_t[]){higher[a].id, higher[b].id});
            }
        }
    }
    free(higher);
}

/* ---- Local work between phases. ---- */

static void graph_free_adjacency(graph_local_t *g)
{
    free(g->ids);
    free(g->offs);
    free(g->adj);
    free(g->nbr_degree);
    g->ids = g->adj = g->nbr_degree = NULL;
    g->offs = NULL;
    g->nv = 0;
}

/* Builds sorted adjacency lists without repeats from the arcs of the degree phase. */
static void graph_build_adjacency(graph_local_t *g)
{
    g->arcs_received = g->arcs.count;
    if (!graph_adjacency_build(&g->arcs, &g->nv, &g->ids, &g->offs, &g->adj, &g->duplicate_arcs)) {
        graph_die(g, "adjacency", MR_ERR_NO_MEMORY);
    }
    g->nbr_degree = calloc(g->offs[g->nv] + 1, sizeof(*g->nbr_degree));
    if (g->nbr_degree == NULL) graph_die(g, "adjacency", MR_ERR_NO_MEMORY);
    /* The arcs are in the adjacency now: free them before the next phases are measured. */
    graph_edges_free(&g->arcs);
}

/* ---- One phase, measured. ---- */

/* Initializes MailRail and creates the aggregators of the phases, in phase order on every rank. */
static void graph_session_begin(graph_local_t *g, const char *policy)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    mr_status_t st;

    setenv("MAILRAIL_FLOWCTL", policy, 1);
    st = mr_init_mpi(&comm, sizeof(comm));
    if (st != MR_OK) graph_die(g, "mr_init", st);
    for (int p = 0; p < GRAPH_PHASES; p++) {
        st = mr_items_create(graph_record_words[p] * sizeof(uint64_t), &g->items[p]);
        if (st != MR_OK) graph_die(g, "mr_items_create", st);
    }
}

static void graph_session_end(graph_local_t *g)
{
    mr_status_t st;

    for (int p = 0; p < GRAPH_PHASES; p++) mr_items_destroy(g->items[p]);
    if (!tool_invariants_hold("mailrail_graph")) MPI_Abort(MPI_COMM_WORLD, 1);
    st = mr_finalize();
    if (st != MR_OK) graph_die(g, "mr_finalize", st);
}

/* Reduces what every rank measured in one phase. Collective. */
static void graph_measure(const graph_local_t *g, const graph_phase_local_t *mine,
                          graph_phase_result_t *out)
{
    uint64_t counts[4] = {mine->messages, mine->bytes_received, mine->credit_returns, mine->early};
    uint64_t sum[4];
    uint64_t busiest[2] = {mine->peak_slots, mine->peak_rss_kb};
    struct {
        double bytes;
        int rank;
    } in = {(double)mine->bytes_received, g->rank}, max;
    double received;

    MPI_Allreduce(&mine->seconds, &out->seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(counts, sum, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&in.bytes, &received, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&in, &max, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    MPI_Bcast(busiest, 2, MPI_UINT64_T, max.rank, MPI_COMM_WORLD);
    out->messages = sum[0];
    out->bytes = sum[1];
    out->credit_returns = sum[2];
    out->early = sum[3];
    out->busiest = max.rank;
    out->busiest_share = received > 0 ? max.bytes / received : 0;
    out->busiest_peak_slots = busiest[0];
    out->busiest_peak_rss_kb = busiest[1];
}

/*
 * Runs one phase: the generator's records are exchanged until quiescence.
 * With a session per phase, MailRail is initialized for the phase and the
 * ranks start together; otherwise the phase starts as soon as this rank is
 * ready, with what arrived early for it. Fills this rank's measurements.
 */
static void graph_run_phase(graph_local_t *g, const graph_options_t *o, const char *policy,
                            graph_phase_t phase, graph_phase_local_t *out)
{
    mr_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
    double start;

    if (o->session_per_phase) graph_session_begin(g, policy);
    tool_reset_peak_rss();
    g->sample_slots = !o->session_per_phase;
    g->sampled_peak_slots = 0;
    mr_get_stats(&before);
    if (o->session_per_phase) MPI_Barrier(MPI_COMM_WORLD); /* MailRail is idle: no progress lost. */
    start = tool_now();
    /* Between phases, only datagrams of this phase waiting in its aggregator hold receive slots. */
    out->early = before.recv_slots_in_use;
    if (g->handlers) {
        graph_handler_ctx[phase] = (graph_handler_ctx_t){g, phase};
        mr_status_t st = mr_items_handler(g->items[phase], graph_item_handler,
                                          &graph_handler_ctx[phase]);
        if (st != MR_OK) graph_die(g, "mr_items_handler", st);
    }
    switch (phase) {
    case GRAPH_DEGREE: graph_send_arcs(g); break;
    case GRAPH_ORIENT: graph_send_degrees(g); break;
    default: graph_send_queries(g); break;
    }
    graph_end_phase(g, phase);
    out->seconds = tool_now() - start;
    mr_get_stats(&after);
    if (g->handlers) mr_items_handler(g->items[phase], NULL, NULL);
    /* -H sees no datagrams: those received, this rank's to itself included, from the counters. */
    out->messages = g->handlers ? after.messages_received - before.messages_received
                                : g->datagrams_received[phase];
    out->bytes_received = g->bytes_received[phase];
    out->credit_returns = after.credit_returns_sent - before.credit_returns_sent;
    /*
     * A peak above every earlier one is exact; otherwise the peak of this
     * phase is only known from the samples.
     */
    out->peak_slots = o->session_per_phase || after.peak_recv_slots_in_use >
                                                  before.peak_recv_slots_in_use
                          ? after.peak_recv_slots_in_use
                          : g->sampled_peak_slots;
    out->peak_rss_kb = tool_peak_rss_kb();
    if (o->session_per_phase) graph_session_end(g);
}

/* ---- The whole kernel, checked. ---- */

/* Reduces the result over ranks and checks the invariants; false if one fails. */
static bool graph_reduce(graph_local_t *g, graph_summary_t *s)
{
    uint64_t degree_sum = 0, checksum = 0, max_degree = 0, hub = GRAPH_NO_VERTEX, unset = 0;
    uint64_t mine[13], all[13];

    for (size_t i = 0; i < g->nv; i++) {
        uint64_t degree = g->offs[i + 1] - g->offs[i];
        degree_sum += degree;
        checksum += graph_degree_term(g->ids[i], degree);
        if (degree > max_degree || (degree == max_degree && g->ids[i] < hub)) {
            max_degree = degree;
            hub = g->ids[i];
        }
    }
    for (size_t k = 0; g->offs != NULL && k < g->offs[g->nv]; k++) unset += g->nbr_degree[k] == 0;
    mine[0] = g->input.count;
    mine[1] = g->self_loops;
    mine[2] = g->arcs_received;
    mine[3] = g->duplicate_arcs;
    mine[4] = g->nv;
    mine[5] = degree_sum;
    mine[6] = checksum;
    mine[7] = g->triangles;
    mine[8] = g->queries_sent;
    mine[9] = g->nbr_degrees_set;
    mine[10] = g->queries_answered;
    mine[11] = g->bad_records;
    mine[12] = unset;
    MPI_Allreduce(mine, all, 13, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&max_degree, &s->max_degree, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    /*
     * MPICH 4.0.2 compares MPI_UINT64_T as signed in MPI_MIN and MPI_MAX, so
     * the sentinel must stay below 2^63: ids do.
     */
    if (max_degree != s->max_degree) hub = GRAPH_NO_VERTEX;
    MPI_Allreduce(&hub, &s->hub, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    if (s->max_degree == 0) s->hub = 0; /* An empty graph has no hub, as in the serial summary. */
    s->edges_read = all[0];
    s->self_loops = all[1];
    s->duplicate_edges = all[3] / 2;
    s->vertices = all[4];
    s->edges = all[5] / 2;
    s->degree_checksum = all[6];
    s->triangles = all[7];

    const char *broken = NULL;
    if (all[2] != 2 * (all[0] - all[1])) broken = "the owners did not receive two arcs per edge";
    else if (all[3] % 2 != 0 || all[5] % 2 != 0) broken = "the arcs of some edge are unpaired";
    else if (all[9] != all[5] || all[12] != 0) {
        broken = "neighbour degrees were not delivered exactly once";
    } else if (all[10] != all[8]) {
        broken = "triangle queries were not answered exactly once";
    } else if (all[11] != 0) {
        broken = "records arrived at a rank that does not own their vertex, or were cut short";
    }
    if (broken != NULL) {
        graph_rank0_printf(g, "mailrail_graph: CHECK FAILED: %s\n", broken);
        return false;
    }
    return true;
}

static bool graph_same_summary(const graph_summary_t *a, const graph_summary_t *b)
{
    return a->edges_read == b->edges_read && a->self_loops == b->self_loops &&
           a->duplicate_edges == b->duplicate_edges && a->vertices == b->vertices &&
           a->edges == b->edges && a->max_degree == b->max_degree && a->hub == b->hub &&
           a->degree_checksum == b->degree_checksum && a->triangles == b->triangles;
}

static void graph_print_summary(const graph_local_t *g, const char *label, const graph_summary_t *s)
{
    graph_rank0_printf(g,
                       "%s: vertices=%llu edges=%llu triangles=%llu max_degree=%llu hub=%llu "
                       "edges_read=%llu self_loops=%llu duplicates=%llu checksum=%016llx\n",
                       label, (unsigned long long)s->vertices, (unsigned long long)s->edges,
                       (unsigned long long)s->triangles, (unsigned long long)s->max_degree,
                       (unsigned long long)s->hub, (unsigned long long)s->edges_read,
                       (unsigned long long)s->self_loops, (unsigned long long)s->duplicate_edges,
                       (unsigned long long)s->degree_checksum);
}

/*
 * Runs the three phases once; false if a check fails. The measurements are
 * reduced only at the end: a collective between phases would hold the ranks
 * together, which quiescence alone does not.
 */
static bool graph_kernel(graph_local_t *g, const graph_options_t *o, const char *policy,
                         graph_phase_result_t results[], graph_summary_t *summary)
{
    graph_phase_local_t mine[GRAPH_PHASES];

    graph_edges_free(&g->arcs);
    graph_free_adjacency(g);
    g->nbr_degrees_set = g->queries_sent = g->queries_answered = 0;
    g->triangles = g->bad_records = g->duplicate_arcs = g->arcs_received = 0;
    memset(g->datagrams_received, 0, sizeof(g->datagrams_received));
    memset(g->bytes_received, 0, sizeof(g->bytes_received));

    if (!o->session_per_phase) graph_session_begin(g, policy);
    graph_run_phase(g, o, policy, GRAPH_DEGREE, &mine[GRAPH_DEGREE]);
    graph_build_adjacency(g);
    graph_run_phase(g, o, policy, GRAPH_ORIENT, &mine[GRAPH_ORIENT]);
    graph_run_phase(g, o, policy, GRAPH_TRIANGLE, &mine[GRAPH_TRIANGLE]);
    if (!o->session_per_phase) graph_session_end(g);
    for (int p = 0; p < GRAPH_PHASES; p++) graph_measure(g, &mine[p], &results[p]);
    return graph_reduce(g, summary);
}

/* ---- Input. ---- */

/* Loads this rank's slice of the edges; false (on every rank) after an error. */
static bool graph_load(const graph_options_t *o, graph_local_t *g)
{
    return graph_load_edges("mailrail_graph", o->file, o->use_rmat ? &o->rmat : NULL, g->rank,
                            g->size, &g->input);
}

/*
 * Writes every rank's edges to `path` in the binary form; false on every rank
 * on failure. The header, which makes the file readable, is written last and
 * only once every rank has written its edges; a failed file is deleted.
 */
static bool graph_convert(const graph_local_t *g, const char *path)
{
    uint64_t count = g->input.count, before = 0, total = 0;
    unsigned char *buf = malloc(16 * count + GRAPH_BINARY_HEADER_LEN);
    MPI_File fh;
    int ok = buf != NULL, all_ok;

    MPI_Exscan(&count, &before, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&count, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (g->rank == 0) before = 0;
    if (MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_WRONLY | MPI_MODE_CREATE, MPI_INFO_NULL,
                      &fh) != MPI_SUCCESS) {
        graph_rank0_printf(g, "mailrail_graph: %s: cannot create\n", path);
        free(buf);
        return false;
    }
    /* Collective: truncates what an earlier file of that name held. */
    ok = MPI_File_set_size(fh, 0) == MPI_SUCCESS && ok;
    if (ok) {
        for (size_t e = 0; e < count; e++) {
            graph_put_le64(buf + 16 * e, g->input.edge[e].u);
            graph_put_le64(buf + 16 * e + 8, g->input.edge[e].v);
        }
        /* In pieces: MPI counts are ints. */
        for (uint64_t done = 0; ok && done < 16 * count;) {
            uint64_t piece = 16 * count - done < (1u << 30) ? 16 * count - done : (1u << 30);
            ok = MPI_File_write_at(fh, (MPI_Offset)(GRAPH_BINARY_HEADER_LEN + 16 * before + done),
                                   buf + done, (int)piece, MPI_BYTE,
                                   MPI_STATUS_IGNORE) == MPI_SUCCESS;
            done += piece;
        }
    }
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (all_ok && g->rank == 0) {
        memcpy(buf, GRAPH_BINARY_MAGIC, GRAPH_BINARY_MAGIC_LEN);
        graph_put_le64(buf + GRAPH_BINARY_MAGIC_LEN, total);
        ok = MPI_File_write_at(fh, 0, buf, GRAPH_BINARY_HEADER_LEN, MPI_BYTE,
                               MPI_STATUS_IGNORE) == MPI_SUCCESS;
    }
    ok = MPI_File_close(&fh) == MPI_SUCCESS && ok;
    free(buf);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (all_ok) {
        graph_rank0_printf(g, "mailrail_graph: wrote %llu edges to %s\n",
                           (unsigned long long)total, path);
    } else {
        if (g->rank == 0) MPI_File_delete(path, MPI_INFO_NULL);
        graph_rank0_printf(g, "mailrail_graph: %s: write failed; the file was removed\n", path);
    }
    return all_ok;
}

/* The serial reference on rank 0: loads the whole graph again and computes the summary. */
static bool graph_serial_reference(const graph_options_t *o, const graph_local_t *g,
                                   graph_summary_t *out)
{
    graph_edges_t all = {0};
    graph_error_t error = {.reason = "out of memory"};
    bool ok;

    if (o->use_rmat) {
        ok = graph_rmat_generate(&o->rmat, 0, graph_rmat_edges(&o->rmat), &all);
    } else if (graph_file_is_binary(o->file)) {
        uint64_t total;
        ok = graph_binary_read(o->file, 0, 1, &all, &total, &error);
    } else {
        graph_text_slice_t slice;
        uint64_t lines;
        ok = graph_text_slice(o->file, 0, 1, &slice, &error) &&
             graph_text_read(o->file, &slice, &all, &lines, &error);
    }
    if (ok && !graph_serial_summary(&all, out)) {
        snprintf(error.reason, sizeof(error.reason), "out of memory");
        ok = false;
    }
    graph_edges_free(&all);
    if (!ok) {
        fprintf(stderr, "mailrail_graph: rank %d: the serial reference failed: %s\n", g->rank,
                error.reason);
    }
    return ok;
}

/* ---- Options and main. ---- */

static int graph_parse(int argc, char **argv, graph_options_t *o)
{
    static char policy_buf[64];
    const char *policies = getenv("MAILRAIL_FLOWCTL") ? getenv("MAILRAIL_FLOWCTL") : "none";
    uint64_t scale = 0, factor = 16, trials = 1;
    bool ok = true;
    int c;

    while ((c = getopt(argc, argv, "f:r:e:S:p:t:Vc:o:qPHh")) != -1) {
        switch (c) {
        case 'f': o->file = optarg; break;
        case 'r':
            ok &= tool_parse_uint(optarg, 1, 40, &scale);
            o->use_rmat = true;
            break;
        case 'e': ok &= tool_parse_uint(optarg, 1, 1024, &factor); break;
        case 'S':
            ok &= tool_parse_uint(optarg, 0, UINT64_MAX, &o->rmat.seed);
            o->seed_given = true;
            break;
        case 'p': policies = optarg; break;
        case 't': ok &= tool_parse_uint(optarg, 1, GRAPH_MAX_TRIALS, &trials); break;
        case 'V': o->verify = true; break;
        case 'c': o->csv = optarg; break;
        case 'o': o->convert = optarg; break;
        case 'q': o->quiet = true; break;
        case 'P': o->session_per_phase = true; break;
        case 'H': o->handlers = true; break;
        default: return -1;
        }
    }
    o->rmat.scale = (int)scale;
    o->rmat.edge_factor = (int)factor;
    o->trials = (int)trials;
    o->npolicies = tool_split_policies(policies, policy_buf, sizeof(policy_buf), o->policies,
                                       GRAPH_MAX_POLICIES);
    return ok && o->npolicies > 0 && (o->file != NULL) != o->use_rmat && optind == argc ? 0 : -1;
}

static void graph_report(const graph_options_t *o, const graph_local_t *g, FILE *csv,
                         const char *policy, int trial, const graph_phase_result_t results[],
                         const graph_summary_t *s)
{
    for (int p = 0; p < GRAPH_PHASES && g->rank == 0; p++) {
        const graph_phase_result_t *r = &results[p];
        if (!o->quiet) {
            printf("  %-6s %5d %-8s %9.4f %10llu %12llu %4d %6.1f%% %6llu %9.1f %8llu %7llu\n", policy,
                   trial, graph_phase_names[p], r->seconds, (unsigned long long)r->messages,
                   (unsigned long long)r->bytes, r->busiest, 100.0 * r->busiest_share,
                   (unsigned long long)r->busiest_peak_slots, (double)r->busiest_peak_rss_kb / 1024.0,
                   (unsigned long long)r->credit_returns, (unsigned long long)r->early);
        }
        if (csv != NULL) {
            fprintf(csv, "%s,%d,%s,%d,%.6f,%llu,%llu,%d,%.4f,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n",
                    policy, trial, graph_phase_names[p], g->size, r->seconds,
                    (unsigned long long)r->messages, (unsigned long long)r->bytes, r->busiest,
                    r->busiest_share, (unsigned long long)r->busiest_peak_slots,
                    (unsigned long long)r->busiest_peak_rss_kb,
                    (unsigned long long)r->credit_returns, (unsigned long long)s->vertices,
                    (unsigned long long)s->edges, (unsigned long long)s->triangles,
                    (unsigned long long)r->early);
        }
    }
    fflush(stdout);
}

static FILE *graph_open_csv(const graph_local_t *g, const char *path)
{
    FILE *csv;

    if (path == NULL || g->rank != 0) return NULL;
    csv = fopen(path, "a");
    if (csv != NULL && ftell(csv) == 0) {
        fprintf(csv, "policy,trial,phase,ranks,seconds,messages,bytes,busiest_rank,busiest_share,"
                     "busiest_peak_recv_slots,busiest_peak_rss_kb,credit_returns,vertices,edges,"
                     "triangles,early_messages\n");
    }
    return csv;
}

int main(int argc, char **argv)
{
    graph_options_t o = {0};
    graph_local_t g = {0};
    graph_summary_t first = {0}, reference;
    graph_phase_result_t results[GRAPH_PHASES];
    double best[GRAPH_MAX_POLICIES][GRAPH_PHASES];
    bool have_first = false, ok = true;
    FILE *csv;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
    if (graph_parse(argc, argv, &o) != 0) {
        graph_rank0_printf(&g, "usage: mpiexec -n N mailrail_graph (-f edges | -r scale [-e factor] "
                               "[-S seed]) [-p none,rank,node] [-t trials] [-P] [-H] [-V] "
                               "[-c file.csv] [-o edges.bin] [-q]\n");
        MPI_Finalize();
        return 2;
    }
    g.handlers = o.handlers;
    /* A fresh R-MAT seed unless -S gave one: rank 0's, since every rank draws a slice. */
    if (o.use_rmat && !o.seed_given) {
        if (g.rank == 0) o.rmat.seed = tool_fresh_seed();
        MPI_Bcast(&o.rmat.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (o.quiet) {
            graph_rank0_printf(&g, "# mailrail_graph: R-MAT seed %llu\n",
                               (unsigned long long)o.rmat.seed);
        }
    }
    if (!graph_load(&o, &g)) {
        graph_edges_free(&g.input);
        MPI_Finalize();
        return 1;
    }
    if (o.convert != NULL) {
        ok = graph_convert(&g, o.convert);
        graph_edges_free(&g.input);
        MPI_Finalize();
        return ok ? 0 : 1;
    }
    if (!o.quiet) {
        graph_rank0_printf(&g, "# mailrail_graph: %d ranks, %s", g.size,
                           o.use_rmat ? "R-MAT" : o.file);
        if (o.use_rmat) {
            graph_rank0_printf(&g, " scale %d, edge factor %d, seed %llu", o.rmat.scale,
                               o.rmat.edge_factor, (unsigned long long)o.rmat.seed);
        }
        graph_rank0_printf(&g, "\n# %-6s %5s %-8s %9s %10s %12s %4s %7s %6s %9s %8s %7s\n",
                           "policy", "trial", "phase", "seconds", "messages", "bytes", "busy",
                           "share", "slots", "rss_MiB", "credits", "early");
    }
    csv = graph_open_csv(&g, o.csv);
    for (int p = 0; p < o.npolicies && ok; p++) {
        for (int t = 0; t < o.trials && ok; t++) {
            graph_summary_t s = {0};
            ok = graph_kernel(&g, &o, o.policies[p], results, &s);
            if (!ok) break;
            graph_report(&o, &g, csv, o.policies[p], t, results, &s);
            for (int ph = 0; ph < GRAPH_PHASES; ph++) {
                if (t == 0 || results[ph].seconds < best[p][ph]) best[p][ph] = results[ph].seconds;
            }
            if (!have_first) {
                first = s;
                have_first = true;
                graph_print_summary(&g, "mailrail_graph: result", &s);
            } else if (!graph_same_summary(&first, &s)) {
                graph_print_summary(&g, "mailrail_graph: DIFFERENT RESULT", &s);
                ok = false;
            }
        }
    }
    if (csv != NULL) fclose(csv);
    if (ok && o.npolicies > 1 && g.rank == 0) {
        for (int p = 1; p < o.npolicies; p++) {
            printf("mailrail_graph: %s against %s, best time per phase:", o.policies[p],
                   o.policies[0]);
            for (int ph = 0; ph < GRAPH_PHASES; ph++) {
                printf(" %s %.2fx", graph_phase_names[ph], best[0][ph] / best[p][ph]);
            }
            printf("\n");
        }
    }
    if (ok && o.verify) {
        int good = 1;
        if (g.rank == 0) {
            if (graph_serial_reference(&o, &g, &reference)) {
                good = graph_same_summary(&first, &reference);
                if (good) printf("mailrail_graph: the serial reference agrees\n");
                else graph_print_summary(&g, "mailrail_graph: SERIAL REFERENCE DIFFERS", &reference);
            } else {
                good = 0;
            }
        }
        MPI_Bcast(&good, 1, MPI_INT, 0, MPI_COMM_WORLD);
        ok = good;
    }
    if (!ok && o.use_rmat) {
        graph_rank0_printf(&g, "mailrail_graph: failed on the R-MAT graph of seed %llu (rerun "
                               "with -S %llu)\n", (unsigned long long)o.rmat.seed,
                           (unsigned long long)o.rmat.seed);
    }
    graph_edges_free(&g.input);
    graph_edges_free(&g.arcs);
    graph_free_adjacency(&g);
    MPI_Finalize();
    return ok ? 0 : 1;
}
