/*
 * mailrail_gnn: one layer of GNN mean aggregation over a power-law graph,
 * with MPI's collectives and with MailRail, written against the public API
 * only, as a graph learning code embedding MailRail would be.
 *
 *   mpiexec -n N mailrail_gnn (-r SCALE | -f FILE) [options]
 *     -r SCALE     generate an R-MAT graph of 2^SCALE vertices (Graph500 parameters
 *                  a=0.57, b=0.19, c=0.19, as mailrail_graph)
 *     -f FILE      edge list instead: SNAP-style text ("u v" per line, '#' or '%'
 *                  comments) or mailrail_graph -o's binary form, e.g. Debian's package
 *                  graph from tools/graph/apt_depgraph.sh; read in parallel slices
 *     -e FACTOR    R-MAT edge factor: edges = FACTOR x 2^SCALE (default 16)
 *     -S SEED      R-MAT seed (default: a fresh one each run, printed; -S SEED repeats a run)
 *     -F FEATURES  floats per feature vector (default 128: 512 bytes)
 *     -p LIST      comma-separated contenders (default alltoallv,none,rank,node,node+h):
 *                  alltoallv (MPI collectives), a flow-control policy (MailRail's
 *                  datagrams under MAILRAIL_FLOWCTL=policy), or a policy with +h
 *                  (MailRail's active-message handlers under that policy)
 *     -t TRIALS    timed layers per contender (default 3), interleaved: trial 0 of every
 *                  contender, then trial 1, ...
 *     -c FILE      append one CSV row per contender and trial to FILE (a header first
 *                  when the file is new)
 *     -P COMMAND   rank 0 runs COMMAND (with sh) before and after each timed layer; it
 *                  prints cumulative "bytes packets drops" of the bottleneck (tools/fabric's
 *                  $FABRIC_PORT_COUNTERS), and each layer's differences go to the CSV
 *     -w           ranks with nothing to do sleep instead of spinning (mr_wait, 1 ms at
 *                  most; MPI's waits test with naps): for ranks that outnumber cores
 *     -W MS        -w, sleeping at most MS milliseconds at a time (default 1)
 *     -q           only the summary lines
 *
 * The graph is undirected and simple: an edge (u, v) makes u a neighbour of v
 * and v of u; self loops and repeated edges are dropped. Vertices are owned by
 * hash, as in mailrail_graph. Every vertex has F features, integer-valued
 * floats from 0 to 31 that anybody can compute from the vertex and the
 * feature's index (gnn_feature), so that every sum is exact in any order
 * (below 2^24: degrees up to 541 200). The layer: the owner of each vertex
 * needs the feature vectors of all its neighbours, and computes their sum and
 * their mean (sum / degree). Every contender stores the vectors as they
 * arrive and aggregates once all are here, with the same code.
 *
 * Setup, untimed: every rank loads or generates its slice of the edges, sends
 * each arc to the owner of its first end (MPI_Alltoallv), builds its sorted
 * adjacency lists and its halo: the remote neighbours of its vertices, each
 * requested once per rank however many of its vertices need it, as GNN
 * systems do. Its own vertices' vectors it reads locally.
 *
 * The timed layer, from a common start barrier to the last rank that has
 * every vector it requested and has aggregated (the maximum over ranks):
 *   alltoallv  what a user codes today: MPI_Alltoall of the request counts,
 *              MPI_Alltoallv of the requested ids, the owners pack the vectors,
 *              MPI_Alltoallv of the vectors back, aggregation. With -w the
 *              nonblocking forms, completed by tests with naps (tool_mpi_wait):
 *              MPI's own waits spin, and oversubscribed ranks that spin starve
 *              those that have work.
 *   POLICY     MailRail pulls over datagrams: each rank sends each owner request
 *              datagrams packed with as many ids as fit; an owner answers with
 *              reply datagrams packed with as many (id, vector) records as fit.
 *              The owner never waits for a send buffer while it holds a received
 *              one: the ids of a request go to a queue of what it owes and the
 *              request is released at once; the queue is served whenever
 *              mr_reserve() has a buffer (holding receive slots while waiting for
 *              send buffers could deadlock under credit flow control).
 *   POLICY+h   the same through active-message handlers: a request handler
 *              replies (mr_reserve, mr_send_handler), a reply handler stores the
 *              vectors; progress is mr_poll() (mr_wait() with -w). A request
 *              handler that finds no send buffer returns MR_AGAIN: MailRail parks
 *              the request out of its receive slot and calls the handler again
 *              with it later, and the handler goes on after the records it sent.
 * A hub's owner pulls a vector per neighbour of the hub: it is the incast
 * victim. Each MailRail trial initializes MailRail afresh with its policy,
 * connects each rank to those it requests of or replies to (mr_connect) and
 * runs a warm-up layer first, all untimed; the alltoallv trial also runs
 * one. After each MailRail layer, untimed, mr_quiesce() makes sure that
 * nothing is left in flight.
 *
 * Every layer, warm-up included, is checked: every sum and mean equals the
 * serial reference bit for bit (the owner computes it from the neighbour ids
 * and gnn_feature), every requested vector arrived exactly once at its
 * requester, and every request named a vertex its owner has. The hottest rank
 * is the one that received the most application bytes from other ranks
 * during the layer, counted the same way for every contender: what the
 * receives handed to the application (alltoallv: the counts, ids and vectors
 * of the collectives; MailRail: the requests and replies, their headers and
 * the ids of the replies included), not what the transports add.
 */
#include "graph_dist.h"
#include "graph_edges.h"
#include "mailrail.h"
#include "tool_common.h"
#include "tool_mpi.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GNN_MAX_CONTENDERS 8
#define GNN_MAX_TRIALS 64
#define GNN_MAX_FEATURES (1 << 20)
/* In front of every request and reply: its kind and its number of ids or records. */
#define GNN_HEADER 8
#define GNN_REQUEST 0x52514e47u /* "GNQR" */
#define GNN_REPLY 0x50524e47u   /* "GNRP" */
/* The handler ids of the +h contenders. */
#define GNN_ON_REQUEST 0
#define GNN_ON_REPLY 1

typedef struct gnn_options {
    const char *file;
    graph_rmat_t rmat;
    bool use_rmat;
    bool seed_given;         /* -S; else rank 0 draws a fresh R-MAT seed. */
    int features;
    tool_contender_t contenders[GNN_MAX_CONTENDERS];
    int ncontenders;
    int trials;
    const char *csv;
    const char *port_command;  /* -P, or NULL. */
    bool wait;                 /* -w: sleep when idle, */
    int wait_ms;               /* for at most this long (-W). */
    bool quiet;
} gnn_options_t;

/* One request datagram: halo[first .. first + count), all owned by `owner`. */
typedef struct gnn_chunk {
    int owner;
    size_t first, count;
} gnn_chunk_t;

/* A vector this rank owes (datagram contenders): vertex `id`'s, to rank `dest`. */
typedef struct gnn_owed {
    uint64_t id;
    int dest;
} gnn_owed_t;

/* This rank's part of the graph and of the layer. */
typedef struct gnn_local {
    int rank, size;
    int features;              /* F. */
    size_t vector_bytes;       /* 4 F. */
    long nap_ns;               /* -w: the longest nap between tests of an MPI request; 0 spins. */
    int wait_ms;               /* -w: mr_wait()'s timeout; -1 spins. */
    int mpi_nodes;             /* Nodes as MPI sees them (shared memory), for alltoallv's rows. */
    /* The vertices owned here that have an edge, sorted, and their sorted neighbours. */
    size_t nv;
    uint64_t *ids;
    size_t *offs;              /* Neighbours of ids[i]: adj[offs[i] .. offs[i + 1]). */
    uint64_t *adj;
    /* The halo: the remote neighbours, once each, by owner then id: owner r's are
       halo[halo_offs[r] .. halo_offs[r + 1]). */
    size_t nhalo;
    uint64_t *halo;
    size_t *halo_offs;
    /* Feature vectors, F floats each: nv rows of this rank's own vertices (computed
       in setup), then nhalo rows of the halo (filled by each layer). */
    float *rows;
    size_t *nbr_row;           /* Per adjacency entry: its neighbour's row. */
    float *sum, *mean;         /* The layer's result: nv rows. */
    float *ref_sum, *ref_mean; /* The serial reference. */
    /* Counts for the collectives (setup) and the layer's own (alltoallv). */
    int *req_counts, *req_displs;  /* Ids this rank requests of each rank. */
    int *got_counts, *got_displs;  /* Ids each rank requests of this one, as a layer learns it. */
    size_t asked;              /* Ids all ranks request of this one per layer (from setup). */
    int *peers, npeers;        /* The ranks this one requests of or replies to: mr_connect(). */
    uint64_t *asked_ids;       /* alltoallv: those ids, */
    float *out_rows;           /* and their vectors. */
    MPI_Datatype vector_type;  /* F floats. */
    /* MailRail: what fits in a message, the requests, what this rank owes. */
    size_t ids_per_request, records_per_reply;
    gnn_chunk_t *chunks;
    size_t nchunks;
    gnn_owed_t *owed;          /* owed[owed_head .. owed_tail): a FIFO, empty between layers. */
    size_t owed_head, owed_tail, owed_cap;
    size_t *cursor;            /* +h, per source: records of its request being served already sent. */
    /* Per layer. */
    uint32_t *arrivals;        /* Per halo vertex: how often its vector arrived. */
    size_t arrived;            /* Halo vertices whose vector arrived. */
    uint64_t bytes_received;   /* Application bytes from other ranks. */
    uint64_t bad_records;      /* Requests or replies naming a vertex that is not there, or cut short. */
    mr_status_t handler_error; /* The first error of a +h handler's send. */
    /* The graph, over all ranks. */
    uint64_t vertices, edges, max_degree, hub, halo_total, halo_max;
} gnn_local_t;

/* What one trial measured, the same on every rank. */
typedef struct gnn_result {
    double seconds;            /* Max over ranks. */
    int hottest;               /* The rank that received the most application bytes, */
    double hottest_bytes;      /* and how many. */
    int nodes;
    long long port[3];         /* -P: bytes, packets, drops during the layer; -1 without. */
    bool verified;
} gnn_result_t;

/*
 * Feature f of vertex v: an integer from 0 to 31, so that the sums of up to
 * 2^24 / 31 (541 200) neighbours are exact floats in any order.
 */
static inline float gnn_feature(uint64_t v, int f)
{
    return (float)(graph_mix64(v * 0x9E3779B97F4A7C15ull + (uint64_t)f) % 32);
}

/* Stops every rank: a communication error leaves no consistent way to go on. */
static _Noreturn void gnn_die(const gnn_local_t *l, const char *what, mr_status_t st)
{
    fprintf(stderr, "mailrail_gnn: rank %d: %s: %s\n", l->rank, what, mr_status_string(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* MPI_Abort does not return; the compiler does not know. */
}

static void *gnn_alloc(const gnn_local_t *l, size_t count, size_t size)
{
    void *p = calloc(count > 0 ? count : 1, size);
    if (p == NULL) gnn_die(l, "setup", MR_ERR_NO_MEMORY);
    return p;
}

/* ---- MPI, without spinning with -w. ---- */

static void gnn_mpi_wait(const gnn_local_t *l, MPI_Request *req)
{
    tool_mpi_wait(req, l->nap_ns);
}

static void gnn_barrier(const gnn_local_t *l)
{
    MPI_Request req;

    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    gnn_mpi_wait(l, &req);
}

static void gnn_allreduce(const gnn_local_t *l, const void *in, void *out, int n,
                          MPI_Datatype type, MPI_Op op)
{
    MPI_Request req;

    MPI_Iallreduce(in, out, n, type, op, MPI_COMM_WORLD, &req);
    gnn_mpi_wait(l, &req);
}

/* The layer's collectives: blocking, or with -w nonblocking and completed with naps. */
static void gnn_alltoall(const gnn_local_t *l, const int *send, int *recv)
{
    MPI_Request req;

    if (l->nap_ns == 0) {
        MPI_Alltoall(send, 1, MPI_INT, recv, 1, MPI_INT, MPI_COMM_WORLD);
        return;
    }
    MPI_Ialltoall(send, 1, MPI_INT, recv, 1, MPI_INT, MPI_COMM_WORLD, &req);
    gnn_mpi_wait(l, &req);
}

static void gnn_alltoallv(const gnn_local_t *l, const void *send, const int *send_counts,
                          const int *send_displs, void *recv, const int *recv_counts,
                          const int *recv_displs, MPI_Datatype type)
{
    MPI_Request req;

    if (l->nap_ns == 0) {
        MPI_Alltoallv(send, send_counts, send_displs, type, recv, recv_counts, recv_displs, type,
                      MPI_COMM_WORLD);
        return;
    }
    MPI_Ialltoallv(send, send_counts, send_displs, type, recv, recv_counts, recv_displs, type,
                   MPI_COMM_WORLD, &req);
    gnn_mpi_wait(l, &req);
}

/* displs[r] = counts[0] + ... + counts[r - 1]; returns the total, or -1 above INT_MAX. */
static long gnn_displs(const gnn_local_t *l, const int *counts, int *displs)
{
    long total = 0;

    for (int r = 0; r < l->size; r++) {
        if (total > INT_MAX) return -1;
        displs[r] = (int)total;
        total += counts[r];
    }
    return total > INT_MAX ? -1 : total;
}

/* ---- Setup, untimed. ---- */

/* Sends every arc (u, v), u != v, to the owner of u; returns the arcs owned here. */
static void gnn_route_arcs(gnn_local_t *l, graph_edges_t *input, graph_edges_t *arcs)
{
    int *send_counts = gnn_alloc(l, (size_t)l->size, sizeof(int));
    int *send_displs = gnn_alloc(l, (size_t)l->size, sizeof(int));
    int *recv_counts = gnn_alloc(l, (size_t)l->size, sizeof(int));
    int *recv_displs = gnn_alloc(l, (size_t)l->size, sizeof(int));
    int *fill = gnn_alloc(l, (size_t)l->size, sizeof(int));
    MPI_Datatype arc_type;
    graph_edge_t *send;
    long nsend, nrecv;

    for (size_t e = 0; e < input->count; e++) {
        uint64_t u = input->edge[e].u, v = input->edge[e].v;
        if (u == v) continue;
        send_counts[graph_owner_of(u, l->size)]++;
        send_counts[graph_owner_of(v, l->size)]++;
    }
    MPI_Alltoall(send_counts, 1, MPI_INT, recv_counts, 1, MPI_INT, MPI_COMM_WORLD);
    nsend = gnn_displs(l, send_counts, send_displs);
    nrecv = gnn_displs(l, recv_counts, recv_displs);
    if (nsend < 0 || nrecv < 0) gnn_die(l, "routing the edges: too many for MPI's int counts",
                                        MR_ERR_LIMIT);
    send = gnn_alloc(l, (size_t)nsend, sizeof(*send));
    for (size_t e = 0; e < input->count; e++) {
        uint64_t u = input->edge[e].u, v = input->edge[e].v;
        int ou = graph_owner_of(u, l->size), ov = graph_owner_of(v, l->size);
        if (u == v) continue;
        send[send_displs[ou] + fill[ou]++] = (graph_edge_t){u, v};
        send[send_displs[ov] + fill[ov]++] = (graph_edge_t){v, u};
    }
    graph_edges_free(input);
    arcs->edge = gnn_alloc(l, (size_t)nrecv, sizeof(*arcs->edge));
    arcs->count = arcs->capacity = (size_t)nrecv;
    /* An arc is two uint64 without padding (graph_edges.h). */
    MPI_Type_contiguous(2, MPI_UINT64_T, &arc_type);
    MPI_Type_commit(&arc_type);
    MPI_Alltoallv(send, send_counts, send_displs, arc_type, arcs->edge, recv_counts, recv_displs,
                  arc_type, MPI_COMM_WORLD);
    MPI_Type_free(&arc_type);
    free(send);
    free(send_counts);
    free(send_displs);
    free(recv_counts);
    free(recv_displs);
    free(fill);
}

/* The halo: every remote neighbour once, by owner then id, and where each neighbour's row is. */
static void gnn_build_halo(gnn_local_t *l)
{
    size_t narcs = l->offs[l->nv], n = 0;
    /* (owner, id) pairs, so that graph_edge_compare() orders them by owner, then id. */
    graph_edge_t *remote = gnn_alloc(l, narcs, sizeof(*remote));

    for (size_t k = 0; k < narcs; k++) {
        int owner = graph_owner_of(l->adj[k], l->size);
        if (owner != l->rank) remote[n++] = (graph_edge_t){(uint64_t)owner, l->adj[k]};
    }
    qsort(remote, n, sizeof(*remote), graph_edge_compare);
    l->halo = gnn_alloc(l, n, sizeof(*l->halo));
    l->halo_offs = gnn_alloc(l, (size_t)l->size + 1, sizeof(*l->halo_offs));
    l->nhalo = 0;
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && remote[k].u == remote[k - 1].u && remote[k].v == remote[k - 1].v) continue;
        l->halo[l->nhalo++] = remote[k].v;
        l->halo_offs[remote[k].u + 1]++;
    }
    for (int r = 0; r < l->size; r++) l->halo_offs[r + 1] += l->halo_offs[r];
    free(remote);

    l->nbr_row = gnn_alloc(l, narcs, sizeof(*l->nbr_row));
    for (size_t k = 0; k < narcs; k++) {
        int owner = graph_owner_of(l->adj[k], l->size);
        long i;
        if (owner == l->rank) {
            /* Undirected: a neighbour owned here has this vertex as its own neighbour. */
            i = graph_search(l->ids, l->nv, l->adj[k]);
        } else {
            i = graph_search(l->halo + l->halo_offs[owner],
                             l->halo_offs[owner + 1] - l->halo_offs[owner], l->adj[k]);
            if (i >= 0) i += (long)(l->nv + l->halo_offs[owner]);
        }
        if (i < 0) gnn_die(l, "setup: a neighbour is neither owned here nor in the halo",
                           MR_ERR_PROTOCOL);
        l->nbr_row[k] = (size_t)i;
    }
}

/* The own vertices' vectors, and the serial reference of the sums and means. */
static void gnn_build_rows(gnn_local_t *l)
{
    size_t F = (size_t)l->features;

    l->rows = gnn_alloc(l, (l->nv + l->nhalo) * F, sizeof(float));
    l->sum = gnn_alloc(l, l->nv * F, sizeof(float));
    l->mean = gnn_alloc(l, l->nv * F, sizeof(float));
    l->ref_sum = gnn_alloc(l, l->nv * F, sizeof(float));
    l->ref_mean = gnn_alloc(l, l->nv * F, sizeof(float));
    for (size_t i = 0; i < l->nv; i++) {
        float degree = (float)(l->offs[i + 1] - l->offs[i]);
        for (size_t f = 0; f < F; f++) {
            float s = 0;
            l->rows[i * F + f] = gnn_feature(l->ids[i], (int)f);
            for (size_t k = l->offs[i]; k < l->offs[i + 1]; k++) s += gnn_feature(l->adj[k], (int)f);
            l->ref_sum[i * F + f] = s;
            l->ref_mean[i * F + f] = s / degree;
        }
    }
}

/* The counts of the collectives, and the buffers of every contender, sized once. */
static void gnn_build_exchange(gnn_local_t *l)
{
    int *ask_counts;
    long total;

    l->req_counts = gnn_alloc(l, (size_t)l->size, sizeof(int));
    l->req_displs = gnn_alloc(l, (size_t)l->size, sizeof(int));
    l->got_counts = gnn_alloc(l, (size_t)l->size, sizeof(int));
    l->got_displs = gnn_alloc(l, (size_t)l->size, sizeof(int));
    ask_counts = gnn_alloc(l, (size_t)l->size, sizeof(int));
    for (int r = 0; r < l->size; r++) {
        size_t n = l->halo_offs[r + 1] - l->halo_offs[r];
        if (n > INT_MAX) gnn_die(l, "setup: a halo too large for MPI's int counts", MR_ERR_LIMIT);
        l->req_counts[r] = (int)n;
    }
    MPI_Alltoall(l->req_counts, 1, MPI_INT, ask_counts, 1, MPI_INT, MPI_COMM_WORLD);
    if (gnn_displs(l, l->req_counts, l->req_displs) < 0 ||
        (total = gnn_displs(l, ask_counts, l->got_displs)) < 0) {
        gnn_die(l, "setup: a halo too large for MPI's int counts", MR_ERR_LIMIT);
    }
    l->asked = (size_t)total;
    l->peers = gnn_alloc(l, (size_t)l->size, sizeof(*l->peers));
    l->npeers = 0;
    for (int r = 0; r < l->size; r++) {
        if (l->req_counts[r] > 0 || ask_counts[r] > 0) l->peers[l->npeers++] = r;
    }
    free(ask_counts);
    l->asked_ids = gnn_alloc(l, l->asked, sizeof(*l->asked_ids));
    l->out_rows = gnn_alloc(l, l->asked * (size_t)l->features, sizeof(float));
    l->owed_cap = l->asked;
    l->owed = gnn_alloc(l, l->owed_cap, sizeof(*l->owed));
    l->cursor = gnn_alloc(l, (size_t)l->size, sizeof(*l->cursor));
    l->arrivals = gnn_alloc(l, l->nhalo, sizeof(*l->arrivals));
    MPI_Type_contiguous(l->features, MPI_FLOAT, &l->vector_type);
    MPI_Type_commit(&l->vector_type);
}

/*
 * The request datagrams, ids_per_request ids each at most, one per owner in
 * turn starting after this rank, so that the ranks do not all begin with the
 * same owner.
 */
static void gnn_build_chunks(gnn_local_t *l)
{
    size_t *done = gnn_alloc(l, (size_t)l->size, sizeof(size_t));
    size_t n = 0;
    bool more = true;

    for (int r = 0; r < l->size; r++) {
        size_t count = l->halo_offs[r + 1] - l->halo_offs[r];
        n += (count + l->ids_per_request - 1) / l->ids_per_request;
    }
    l->chunks = gnn_alloc(l, n, sizeof(*l->chunks));
    l->nchunks = 0;
    while (more) {
        more = false;
        for (int d = 1; d <= l->size; d++) {
            int owner = (l->rank + d) % l->size;
            size_t left = l->halo_offs[owner + 1] - l->halo_offs[owner] - done[owner];
            size_t count = left < l->ids_per_request ? left : l->ids_per_request;
            if (count == 0) continue;
            l->chunks[l->nchunks++] = (gnn_chunk_t){owner, l->halo_offs[owner] + done[owner], count};
            done[owner] += count;
            more = true;
        }
    }
    free(done);
}

/* The size of the graph and of the halo, over all ranks. */
static void gnn_describe(gnn_local_t *l)
{
    uint64_t degree_max = 0, hub = GRAPH_MAX_VERTEX_ID;
    uint64_t mine[3] = {l->nv, l->offs[l->nv], l->nhalo}, all[3];

    for (size_t i = 0; i < l->nv; i++) {
        uint64_t degree = l->offs[i + 1] - l->offs[i];
        if (degree > degree_max) {
            degree_max = degree;
            hub = l->ids[i];
        }
    }
    MPI_Allreduce(mine, all, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&degree_max, &l->max_degree, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&mine[2], &l->halo_max, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    /* Ids stay below 2^63, which MPICH's signed comparison of MPI_UINT64_T needs. */
    if (degree_max != l->max_degree) hub = GRAPH_MAX_VERTEX_ID;
    MPI_Allreduce(&hub, &l->hub, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    if (l->max_degree == 0) l->hub = 0; /* An empty graph has no hub. */
    l->vertices = all[0];
    l->edges = all[1] / 2;
    l->halo_total = all[2];
}

/* The number of nodes, as MPI's shared-memory split sees them. */
static int gnn_count_nodes(void)
{
    MPI_Comm node;
    int local, first, nodes;

    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    first = local == 0;
    MPI_Allreduce(&first, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_free(&node);
    return nodes;
}

/* Everything the layers need, from this rank's slice of the edges (freed). */
static void gnn_setup(gnn_local_t *l, graph_edges_t *input)
{
    graph_edges_t arcs = {0};
    uint64_t duplicates;

    gnn_route_arcs(l, input, &arcs);
    if (!graph_adjacency_build(&arcs, &l->nv, &l->ids, &l->offs, &l->adj, &duplicates)) {
        gnn_die(l, "setup", MR_ERR_NO_MEMORY);
    }
    graph_edges_free(&arcs);
    gnn_build_halo(l);
    gnn_build_rows(l);
    gnn_build_exchange(l);
    gnn_describe(l);
    l->mpi_nodes = gnn_count_nodes();
}

static void gnn_free(gnn_local_t *l)
{
    free(l->ids);
    free(l->offs);
    free(l->adj);
    free(l->halo);
    free(l->halo_offs);
    free(l->rows);
    free(l->nbr_row);
    free(l->sum);
    free(l->mean);
    free(l->ref_sum);
    free(l->ref_mean);
    free(l->req_counts);
    free(l->req_displs);
    free(l->got_counts);
    free(l->got_displs);
    free(l->asked_ids);
    free(l->peers);
    free(l->out_rows);
    free(l->chunks);
    free(l->owed);
    free(l->cursor);
    free(l->arrivals);
    if (l->vector_type != MPI_DATATYPE_NULL) MPI_Type_free(&l->vector_type);
}

/* ---- The layer's work, the same for every contender. ---- */

/* Forgets the previous layer, before the start barrier. */
static void gnn_reset(gnn_local_t *l)
{
    memset(l->rows + l->nv * (size_t)l->features, 0, l->nhalo * l->vector_bytes);
    memset(l->arrivals, 0, (l->nhalo > 0 ? l->nhalo : 1) * sizeof(*l->arrivals));
    memset(l->cursor, 0, (size_t)l->size * sizeof(*l->cursor));
    l->arrived = 0;
    l->bytes_received = l->bad_records = 0;
    l->owed_head = l->owed_tail = 0;
    l->handler_error = MR_OK;
}

/* Sums and means of the neighbours' vectors, in adjacency order. */
static void gnn_aggregate(gnn_local_t *l)
{
    size_t F = (size_t)l->features;

    for (size_t i = 0; i < l->nv; i++) {
        float *s = l->sum + i * F, *m = l->mean + i * F;
        float degree = (float)(l->offs[i + 1] - l->offs[i]);
        memset(s, 0, F * sizeof(*s));
        for (size_t k = l->offs[i]; k < l->offs[i + 1]; k++) {
            const float *row = l->rows + l->nbr_row[k] * F;
            for (size_t f = 0; f < F; f++) s[f] += row[f];
        }
        for (size_t f = 0; f < F; f++) m[f] = s[f] / degree;
    }
}

/* The row of vertex `id` owned here, or NULL (a bad request). */
static const float *gnn_own_row(gnn_local_t *l, uint64_t id)
{
    long i = graph_search(l->ids, l->nv, id);

    if (i < 0) {
        l->bad_records++;
        return NULL;
    }
    return l->rows + (size_t)i * (size_t)l->features;
}

/* Stores a vector that owner `source` sent for halo vertex `id`. */
static void gnn_store(gnn_local_t *l, int source, uint64_t id, const void *vector)
{
    size_t first = l->halo_offs[source];
    long h = graph_search(l->halo + first, l->halo_offs[source + 1] - first, id);

    if (h < 0) {
        l->bad_records++;
        return;
    }
    if (l->arrivals[first + (size_t)h]++ == 0) l->arrived++;
    memcpy(l->rows + (l->nv + first + (size_t)h) * (size_t)l->features, vector, l->vector_bytes);
}

/* ---- The messages of the MailRail contenders. ---- */

static size_t gnn_put_header(void *buf, uint32_t kind, size_t count)
{
    uint32_t header[2] = {kind, (uint32_t)count};

    memcpy(buf, header, sizeof(header));
    return GNN_HEADER;
}

/* The number of ids or records of a message of `kind`, each `record` bytes; -1 when malformed. */
static long gnn_get_header(gnn_local_t *l, const mr_message_t *m, uint32_t kind, size_t record)
{
    uint32_t header[2];

    if (m->length >= GNN_HEADER) memcpy(header, m->data, sizeof(header));
    if (m->length < GNN_HEADER || header[0] != kind ||
        m->length != GNN_HEADER + (size_t)header[1] * record) {
        l->bad_records++;
        return -1;
    }
    return header[1];
}

/* Fills a request datagram with the ids of chunk `c`; returns its length. */
static size_t gnn_fill_request(const gnn_local_t *l, const gnn_chunk_t *c, unsigned char *buf)
{
    size_t n = gnn_put_header(buf, GNN_REQUEST, c->count);

    memcpy(buf + n, l->halo + c->first, c->count * sizeof(uint64_t));
    return n + c->count * sizeof(uint64_t);
}

/* Record `r` of a reply: vertex `id` and its vector (zeros, and a bad record, when not here). */
static void gnn_put_record(gnn_local_t *l, unsigned char *buf, size_t r, uint64_t id)
{
    unsigned char *p = buf + GNN_HEADER + r * (sizeof(id) + l->vector_bytes);
    const float *row = gnn_own_row(l, id);

    memcpy(p, &id, sizeof(id));
    if (row != NULL) memcpy(p + sizeof(id), row, l->vector_bytes);
    else memset(p + sizeof(id), 0, l->vector_bytes);
}

/* Stores the vectors of a reply from `m->source`. */
static void gnn_take_reply(gnn_local_t *l, const mr_message_t *m)
{
    size_t record = sizeof(uint64_t) + l->vector_bytes;
    long count = gnn_get_header(l, m, GNN_REPLY, record);
    const unsigned char *p = (const unsigned char *)m->data + GNN_HEADER;

    if (m->source != l->rank) l->bytes_received += m->length;
    for (long r = 0; r < count; r++, p += record) {
        uint64_t id;
        memcpy(&id, p, sizeof(id));
        gnn_store(l, m->source, id, p + sizeof(id));
    }
}

/* ---- MailRail over datagrams. ---- */

/* Queues what a request asks for, so that its receive buffer goes back at once. */
static void gnn_take_request(gnn_local_t *l, const mr_message_t *m)
{
    long count = gnn_get_header(l, m, GNN_REQUEST, sizeof(uint64_t));
    const unsigned char *p = (const unsigned char *)m->data + GNN_HEADER;

    if (m->source != l->rank) l->bytes_received += m->length;
    if (count > 0 && l->owed_tail + (size_t)count > l->owed_cap) {
        /* Setup sized the queue for every request of a layer: only a bad request gets here. */
        size_t cap = 2 * (l->owed_tail + (size_t)count);
        gnn_owed_t *owed = realloc(l->owed, cap * sizeof(*owed));
        if (owed == NULL) gnn_die(l, "queueing a request", MR_ERR_NO_MEMORY);
        l->owed = owed;
        l->owed_cap = cap;
    }
    for (long i = 0; i < count; i++, p += sizeof(uint64_t)) {
        gnn_owed_t *o = &l->owed[l->owed_tail++];
        memcpy(&o->id, p, sizeof(o->id));
        o->dest = m->source;
    }
}

/*
 * Sends what this rank owes while mr_reserve() has buffers: each reply holds
 * as many records for one requester as fit. Returns true if it sent any.
 */
static bool gnn_serve(gnn_local_t *l)
{
    bool sent = false;

    while (l->owed_head < l->owed_tail) {
        unsigned char *buf;
        mr_status_t st = mr_reserve((void **)&buf);
        if (st == MR_AGAIN) break;
        if (st != MR_OK) gnn_die(l, "mr_reserve", st);
        int dest = l->owed[l->owed_head].dest;
        size_t n = 0;
        while (l->owed_head < l->owed_tail && l->owed[l->owed_head].dest == dest &&
               n < l->records_per_reply) {
            gnn_put_record(l, buf, n++, l->owed[l->owed_head++].id);
        }
        gnn_put_header(buf, GNN_REPLY, n);
        st = mr_send(buf, GNN_HEADER + n * (sizeof(uint64_t) + l->vector_bytes), dest);
        if (st != MR_OK) gnn_die(l, "mr_send", st);
        sent = true;
    }
    if (l->owed_head == l->owed_tail) l->owed_head = l->owed_tail = 0;
    return sent;
}

/* Receives everything there is, then serves what is owed. Returns true if anything happened. */
static bool gnn_progress_datagrams(gnn_local_t *l)
{
    mr_message_t m;
    mr_status_t st;
    bool busy = false;

    while ((st = mr_receive(&m)) == MR_OK) {
        uint32_t kind = 0;
        if (m.length >= sizeof(kind)) memcpy(&kind, m.data, sizeof(kind));
        if (kind == GNN_REQUEST) gnn_take_request(l, &m);
        else gnn_take_reply(l, &m);
        st = mr_release(m.data);
        if (st != MR_OK) gnn_die(l, "mr_release", st);
        busy = true;
    }
    if (st != MR_AGAIN) gnn_die(l, "mr_receive", st);
    return gnn_serve(l) || busy;
}

/* ---- MailRail through active-message handlers (+h). ---- */

/*
 * Answers a request from its handler: reply datagrams of records_per_reply
 * records, each reserved before it is filled. When mr_reserve() has no
 * buffer, returns MR_AGAIN and is called again later with the same message
 * (its source's messages wait behind it, mailrail.h): cursor[source]
 * remembers how many of its records were already sent, so that none is sent
 * twice, and the message waits parked, out of its receive slot.
 */
static mr_status_t gnn_on_request(const mr_message_t *m, void *arg)
{
    gnn_local_t *l = arg;
    long count = gnn_get_header(l, m, GNN_REQUEST, sizeof(uint64_t));
    const unsigned char *ids = (const unsigned char *)m->data + GNN_HEADER;
    size_t *done = &l->cursor[m->source];

    while ((long)*done < count) {
        unsigned char *buf;
        mr_status_t st = mr_reserve((void **)&buf);
        if (st == MR_AGAIN) return MR_AGAIN;
        if (st != MR_OK) {
            l->handler_error = st;
            break;
        }
        size_t n = 0;
        for (; n < l->records_per_reply && (long)*done < count; n++, (*done)++) {
            uint64_t id;
            memcpy(&id, ids + *done * sizeof(id), sizeof(id));
            gnn_put_record(l, buf, n, id);
        }
        gnn_put_header(buf, GNN_REPLY, n);
        st = mr_send_handler(buf, GNN_HEADER + n * (sizeof(uint64_t) + l->vector_bytes),
                             m->source, GNN_ON_REPLY);
        if (st != MR_OK) {
            mr_release(buf);
            l->handler_error = st;
            break;
        }
    }
    *done = 0;
    if (m->source != l->rank) l->bytes_received += m->length;
    return MR_OK;
}

static mr_status_t gnn_on_reply(const mr_message_t *m, void *arg)
{
    gnn_take_reply(arg, m);
    return MR_OK;
}

static bool gnn_progress_handlers(gnn_local_t *l)
{
    mr_status_t st = mr_poll();

    if (st < 0) gnn_die(l, "mr_poll", st);
    if (l->handler_error != MR_OK) gnn_die(l, "a handler's send", l->handler_error);
    return st == MR_OK;
}

/* ---- The layer of each contender. ---- */

/* Nothing to do: with -w, sleep until MailRail has news. */
static void gnn_idle(const gnn_local_t *l)
{
    mr_status_t st;

    if (l->wait_ms < 0) return;
    st = mr_wait(l->wait_ms);
    if (st != MR_OK && st != MR_AGAIN) gnn_die(l, "mr_wait", st);
}

static bool gnn_progress(gnn_local_t *l, bool handlers)
{
    return handlers ? gnn_progress_handlers(l) : gnn_progress_datagrams(l);
}

/*
 * One layer over MailRail: sends the requests as send buffers allow, serves
 * and receives in between, until every requested vector is here; then
 * aggregates.
 */
static void gnn_layer_mailrail(gnn_local_t *l, bool handlers)
{
    size_t next = 0;

    while (next < l->nchunks || l->arrived < l->nhalo) {
        bool busy = false;
        while (next < l->nchunks) {
            const gnn_chunk_t *c = &l->chunks[next];
            void *buf;
            mr_status_t st = mr_reserve(&buf);
            if (st == MR_AGAIN) break;
            if (st != MR_OK) gnn_die(l, "mr_reserve", st);
            size_t len = gnn_fill_request(l, c, buf);
            st = handlers ? mr_send_handler(buf, len, c->owner, GNN_ON_REQUEST)
                          : mr_send(buf, len, c->owner);
            if (st != MR_OK) gnn_die(l, handlers ? "mr_send_handler" : "mr_send", st);
            next++;
            busy = true;
        }
        busy |= gnn_progress(l, handlers);
        if (!busy) gnn_idle(l);
    }
    gnn_aggregate(l);
}

/*
 * Untimed: serves the other ranks until global quiescence. A rank with
 * replies still queued does not take part yet, so that quiescence cannot be
 * declared while it owes vectors that no message in flight accounts for.
 */
static void gnn_quiesce(gnn_local_t *l, bool handlers)
{
    for (;;) {
        bool busy = gnn_progress(l, handlers);
        if (l->owed_head < l->owed_tail) {
            if (!busy) gnn_idle(l);
            continue;
        }
        mr_status_t st = mr_quiesce();
        if (st == MR_OK) return;
        if (st != MR_AGAIN) gnn_die(l, "mr_quiesce", st);
        if (!busy) gnn_idle(l);
    }
}

/* One layer with MPI's collectives. */
static void gnn_layer_alltoallv(gnn_local_t *l)
{
    size_t F = (size_t)l->features;
    long total;

    gnn_alltoall(l, l->req_counts, l->got_counts);
    total = gnn_displs(l, l->got_counts, l->got_displs);
    if (total < 0 || (size_t)total > l->asked) {
        gnn_die(l, "alltoallv: more ids requested than setup counted", MR_ERR_PROTOCOL);
    }
    gnn_alltoallv(l, l->halo, l->req_counts, l->req_displs, l->asked_ids, l->got_counts,
                  l->got_displs, MPI_UINT64_T);
    for (size_t j = 0; j < (size_t)total; j++) {
        const float *row = gnn_own_row(l, l->asked_ids[j]);
        if (row != NULL) memcpy(l->out_rows + j * F, row, l->vector_bytes);
        else memset(l->out_rows + j * F, 0, l->vector_bytes);
    }
    /* The halo is in owner order: the vectors land in their rows directly. */
    gnn_alltoallv(l, l->out_rows, l->got_counts, l->got_displs, l->rows + l->nv * F,
                  l->req_counts, l->req_displs, l->vector_type);
    for (size_t h = 0; h < l->nhalo; h++) l->arrivals[h]++;
    l->arrived = l->nhalo;
    for (int r = 0; r < l->size; r++) {
        if (r == l->rank) continue;
        l->bytes_received += sizeof(int) + (uint64_t)l->got_counts[r] * sizeof(uint64_t) +
                             (uint64_t)l->req_counts[r] * l->vector_bytes;
    }
    gnn_aggregate(l);
}

/* One layer of contender `c`; returns this rank's seconds from the start barrier. */
static double gnn_layer(gnn_local_t *l, const tool_contender_t *c)
{
    double start;

    gnn_reset(l);
    gnn_barrier(l);
    start = tool_now();
    if (c->mpi) gnn_layer_alltoallv(l);
    else gnn_layer_mailrail(l, c->handlers);
    return tool_now() - start;
}

/* ---- Checks. ---- */

/*
 * Compares every sum and mean with the serial reference bit for bit and
 * checks that every requested vector arrived exactly once. Collective; every
 * rank prints its first wrong value, rank 0 the totals. True when all is well.
 */
static bool gnn_check(gnn_local_t *l, const char *name, const char *layer)
{
    size_t F = (size_t)l->features, n = l->nv * F;
    uint64_t mine[4] = {0, 0, l->bad_records, 0}, all[4];

    for (size_t h = 0; h < l->nhalo; h++) {
        if (l->arrivals[h] == 0) mine[0]++;
        else if (l->arrivals[h] > 1) mine[1]++;
    }
    for (size_t x = 0; x < 2 * n; x++) {
        const float *got = x < n ? &l->sum[x] : &l->mean[x - n];
        const float *want = x < n ? &l->ref_sum[x] : &l->ref_mean[x - n];
        if (memcmp(got, want, sizeof(*got)) == 0) continue;
        if (mine[3]++ == 0) {
            size_t i = (x % n) / F;
            fprintf(stderr, "mailrail_gnn: rank %d: %s, %s layer: vertex %llu feature %zu: %s "
                    "%.9g, the serial reference %.9g\n", l->rank, name, layer,
                    (unsigned long long)l->ids[i], x % F, x < n ? "sum" : "mean", (double)*got,
                    (double)*want);
        }
    }
    gnn_allreduce(l, mine, all, 4, MPI_UINT64_T, MPI_SUM);
    if (all[0] + all[1] + all[2] + all[3] == 0) return true;
    if (l->rank == 0) {
        fprintf(stderr, "mailrail_gnn: CHECK FAILED: %s, %s layer: %llu requested vectors "
                "missing, %llu arrived more than once, %llu bad requests or replies, %llu wrong "
                "values\n", name, layer, (unsigned long long)all[0], (unsigned long long)all[1],
                (unsigned long long)all[2], (unsigned long long)all[3]);
    }
    return false;
}

/* ---- Trials. ---- */

/* Fills the measurements of a checked layer; collective. */
static void gnn_measure(gnn_local_t *l, double seconds, gnn_result_t *out)
{
    struct {
        double bytes;
        int rank;
    } in = {(double)l->bytes_received, l->rank}, hottest;

    gnn_allreduce(l, &seconds, &out->seconds, 1, MPI_DOUBLE, MPI_MAX);
    gnn_allreduce(l, &in, &hottest, 1, MPI_DOUBLE_INT, MPI_MAXLOC);
    out->hottest = hottest.rank;
    out->hottest_bytes = hottest.bytes;
}

/* Rank 0, with -P: the port's counters, or -1s. */
static void gnn_probe(const gnn_options_t *o, const gnn_local_t *l, long long counters[3])
{
    counters[0] = counters[1] = counters[2] = -1;
    if (l->rank == 0 && o->port_command != NULL) {
        if (!tool_port_probe("mailrail_gnn", o->port_command, counters)) {
            counters[0] = counters[1] = counters[2] = -1;
        }
    }
}

static void gnn_port_delta(const long long before[3], const long long after[3], long long out[3])
{
    for (int i = 0; i < 3; i++) out[i] = before[i] >= 0 && after[i] >= 0 ? after[i] - before[i] : -1;
}

/* One trial of contender `c`: a warm-up layer, then the timed one, both checked. */
static void gnn_trial(const gnn_options_t *o, gnn_local_t *l, const tool_contender_t *c,
                      gnn_result_t *out)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    long long before[3], after[3];
    double seconds;
    mr_status_t st;

    if (!c->mpi) {
        setenv("MAILRAIL_FLOWCTL", c->policy, 1);
        st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) gnn_die(l, "mr_init_mpi", st);
        if (c->handlers) {
            if ((st = mr_handler_register(GNN_ON_REQUEST, gnn_on_request, l)) != MR_OK ||
                (st = mr_handler_register(GNN_ON_REPLY, gnn_on_reply, l)) != MR_OK) {
                gnn_die(l, "mr_handler_register", st);
            }
        }
        /* Every pair that will talk is connected now, untimed, the handlers registered. */
        if (tool_connect("mailrail_gnn", l->peers, l->npeers) != MR_OK) {
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        out->nodes = mr_node_count();
    } else {
        out->nodes = l->mpi_nodes;
    }
    gnn_layer(l, c);
    if (!c->mpi) gnn_quiesce(l, c->handlers);
    out->verified = gnn_check(l, c->name, "warm-up");

    gnn_probe(o, l, before);
    seconds = gnn_layer(l, c);
    if (!c->mpi) gnn_quiesce(l, c->handlers);
    else gnn_barrier(l); /* Every rank's traffic is over before the port is read. */
    gnn_probe(o, l, after);
    gnn_port_delta(before, after, out->port);
    out->verified = gnn_check(l, c->name, "timed") && out->verified;
    gnn_measure(l, seconds, out);

    if (!c->mpi) {
        if (!tool_invariants_hold("mailrail_gnn")) MPI_Abort(MPI_COMM_WORLD, 1);
        st = mr_finalize();
        if (st != MR_OK) gnn_die(l, "mr_finalize", st);
    }
}

/*
 * What fits in a MailRail message (its last byte carries the handler id of
 * +h, so both forms keep it free): a request's ids, a reply's records. Starts
 * MailRail once to learn the datagram size. False, on every rank, when a
 * vector does not fit.
 */
static bool gnn_fit_datagrams(const gnn_options_t *o, gnn_local_t *l)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    const char *policy = NULL;
    size_t datagram, cap, record = sizeof(uint64_t) + l->vector_bytes;
    mr_status_t st;

    for (int i = 0; i < o->ncontenders && policy == NULL; i++) {
        if (!o->contenders[i].mpi) policy = o->contenders[i].policy;
    }
    if (policy == NULL) return true;
    setenv("MAILRAIL_FLOWCTL", policy, 1);
    st = mr_init_mpi(&comm, sizeof(comm));
    if (st != MR_OK) gnn_die(l, "mr_init_mpi", st);
    datagram = mr_datagram_size();
    st = mr_finalize();
    if (st != MR_OK) gnn_die(l, "mr_finalize", st);
    cap = datagram - 1;
    if (cap < GNN_HEADER + record) {
        if (l->rank == 0) {
            fprintf(stderr, "mailrail_gnn: -F %d: a vector of %zu bytes with its 8-byte id and "
                    "the %d-byte header does not fit in a datagram of %zu bytes "
                    "(MAILRAIL_DATAGRAM_SIZE); use -F %zu or less, or larger datagrams\n",
                    o->features, l->vector_bytes, GNN_HEADER, datagram,
                    cap > GNN_HEADER + sizeof(uint64_t) ?
                        (cap - GNN_HEADER - sizeof(uint64_t)) / sizeof(float) : 0);
        }
        return false;
    }
    l->ids_per_request = (cap - GNN_HEADER) / sizeof(uint64_t);
    l->records_per_reply = (cap - GNN_HEADER) / record;
    gnn_build_chunks(l);
    return true;
}

/* ---- Options, output and main. ---- */

static int gnn_parse(int argc, char **argv, gnn_options_t *o, char *why, size_t len)
{
    const char *contenders = "alltoallv,none,rank,node,node+h";
    uint64_t scale = 0, factor = 16;
    int c;

    o->features = 128;
    o->trials = 3;
    o->wait_ms = 1;
    opterr = 0;
    while ((c = getopt(argc, argv, ":r:f:e:S:F:p:t:c:P:W:wqh")) != -1) {
        const char *what = ""; /* What a number must be, for when it is not. */
        bool ok = true;
        switch (c) {
        case 'r':
            ok = tool_parse_uint(optarg, 1, 40, &scale);
            what = "the R-MAT scale must be an integer from 1 to 40";
            o->use_rmat = true;
            break;
        case 'f': o->file = optarg; break;
        case 'e':
            ok = tool_parse_uint(optarg, 1, 1024, &factor);
            what = "the edge factor must be an integer from 1 to 1024";
            break;
        case 'S':
            ok = tool_parse_uint(optarg, 0, UINT64_MAX, &o->rmat.seed);
            o->seed_given = true;
            what = "the seed must be an integer from 0 to 2^64-1";
            break;
        case 'F':
            ok = tool_parse_int(optarg, 1, GNN_MAX_FEATURES, &o->features);
            what = "the number of features must be an integer from 1 to 1048576";
            break;
        case 'p': contenders = optarg; break;
        case 't':
            ok = tool_parse_int(optarg, 1, GNN_MAX_TRIALS, &o->trials);
            what = "the number of trials must be an integer from 1 to 64";
            break;
        case 'c': o->csv = optarg; break;
        case 'P': o->port_command = optarg; break;
        case 'w': o->wait = true; break;
        case 'W':
            o->wait = true;
            ok = tool_parse_int(optarg, 0, 60000, &o->wait_ms);
            what = "the longest sleep must be an integer from 0 to 60000 milliseconds";
            break;
        case 'q': o->quiet = true; break;
        case 'h': return -1;
        case ':': snprintf(why, len, "-%c needs a value", optopt); return -1;
        default: snprintf(why, len, "unknown option -%c", optopt); return -1;
        }
        if (!ok) {
            snprintf(why, len, "-%c %s: %s", c, optarg, what);
            return -1;
        }
    }
    o->rmat.scale = (int)scale;
    o->rmat.edge_factor = (int)factor;
    o->ncontenders = tool_parse_contenders(contenders, o->contenders, GNN_MAX_CONTENDERS);
    if (o->ncontenders < 0) {
        snprintf(why, len, "-p %s: a contender is alltoallv, a flow-control policy (none, rank, "
                 "node) or a policy with +h (node+h), at most %d of them", contenders,
                 GNN_MAX_CONTENDERS);
        return -1;
    }
    if (optind != argc) {
        snprintf(why, len, "unexpected argument '%s'", argv[optind]);
        return -1;
    }
    if ((o->file != NULL) == o->use_rmat) {
        snprintf(why, len, "give either -r SCALE or -f FILE");
        return -1;
    }
    return 0;
}

/* Rank 0 opens the CSV file (a header when new); false on every rank when it cannot. */
static bool gnn_open_csv(const gnn_options_t *o, const gnn_local_t *l, FILE **csv)
{
    int ok = 1;

    *csv = NULL;
    if (o->csv == NULL) return true;
    if (l->rank == 0) {
        *csv = fopen(o->csv, "a");
        if (*csv == NULL) {
            fprintf(stderr, "mailrail_gnn: -c %s: cannot open for appending: %s\n", o->csv,
                    strerror(errno));
            ok = 0;
        } else if (ftell(*csv) == 0) {
            fprintf(*csv, "contender,trial,ranks,nodes,vertices,edges,features,seconds,"
                          "hottest_rank,hottest_mib,port_bytes,port_packets,port_drops,"
                          "verified\n");
        }
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return ok;
}

static void gnn_print_header(const gnn_options_t *o, const gnn_local_t *l)
{
    if (o->quiet || l->rank != 0) return;
    printf("# mailrail_gnn: %d ranks, ", l->size);
    if (o->use_rmat) {
        printf("R-MAT scale %d, edge factor %d, seed %llu", o->rmat.scale, o->rmat.edge_factor,
               (unsigned long long)o->rmat.seed);
    } else {
        printf("%s", o->file);
    }
    printf(": %llu vertices, %llu edges, max degree %llu (vertex %llu); %d features (%zu B per "
           "vector)\n", (unsigned long long)l->vertices, (unsigned long long)l->edges,
           (unsigned long long)l->max_degree, (unsigned long long)l->hub, o->features,
           l->vector_bytes);
    printf("# halo: %llu vectors requested per layer in all (%.3f MiB), at most %llu by one "
           "rank; %d trial(s) per contender, interleaved%s\n",
           (unsigned long long)l->halo_total,
           (double)l->halo_total * (double)l->vector_bytes / 1048576.0,
           (unsigned long long)l->halo_max, o->trials, o->wait ? "; idle ranks sleep (-w)" : "");
    printf("# %-10s %5s %10s %7s %11s %8s", "contender", "trial", "seconds", "hottest",
           "hottest MiB", "verified");
    if (o->port_command != NULL) printf(" %12s %10s %8s", "port bytes", "packets", "drops");
    printf("\n");
    fflush(stdout);
}

static void gnn_report_trial(const gnn_options_t *o, const gnn_local_t *l, FILE *csv,
                             const tool_contender_t *c, int trial, const gnn_result_t *r)
{
    double mib = r->hottest_bytes / 1048576.0;

    if (l->rank != 0) return;
    if (!o->quiet) {
        printf("  %-10s %5d %10.6f %7d %11.4f %8s", c->name, trial, r->seconds, r->hottest, mib,
               r->verified ? "yes" : "NO");
        if (o->port_command != NULL) {
            printf(" %12lld %10lld %8lld", r->port[0], r->port[1], r->port[2]);
        }
        printf("\n");
        fflush(stdout);
    }
    if (csv != NULL) {
        fprintf(csv, "%s,%d,%d,%d,%llu,%llu,%d,%.6f,%d,%.4f,%lld,%lld,%lld,%d\n", c->name, trial,
                l->size, r->nodes, (unsigned long long)l->vertices, (unsigned long long)l->edges,
                o->features, r->seconds, r->hottest, mib, r->port[0], r->port[1], r->port[2],
                r->verified ? 1 : 0);
        fflush(csv);
    }
}

/* One line per contender; against alltoallv's median when it is a contender. */
static void gnn_summarize(const gnn_options_t *o, const gnn_local_t *l,
                          double secs[][GNN_MAX_TRIALS], const gnn_result_t last[])
{
    double base = 0;

    if (l->rank != 0) return;
    for (int i = 0; i < o->ncontenders; i++) {
        if (o->contenders[i].mpi) base = tool_median(secs[i], o->trials);
    }
    for (int i = 0; i < o->ncontenders; i++) {
        double min, median, max;
        tool_spread(secs[i], o->trials, &min, &median, &max);
        printf("mailrail_gnn: %s: median %.4f s per layer (min %.4f, max %.4f over %d trials), "
               "%.0f edges/s, hottest rank %d received %.3f MiB", o->contenders[i].name, median,
               min, max, o->trials, median > 0 ? (double)l->edges / median : 0.0,
               last[i].hottest, last[i].hottest_bytes / 1048576.0);
        if (base > 0) printf(", %.2f of alltoallv", median / base);
        printf("\n");
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    gnn_options_t o = {0};
    gnn_local_t l = {.vector_type = MPI_DATATYPE_NULL};
    graph_edges_t input = {0};
    static double secs[GNN_MAX_CONTENDERS][GNN_MAX_TRIALS];
    gnn_result_t last[GNN_MAX_CONTENDERS];
    char why[256] = "";
    FILE *csv = NULL;
    bool ok = true;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &l.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &l.size);
    if (gnn_parse(argc, argv, &o, why, sizeof(why)) != 0) {
        if (l.rank == 0) {
            if (why[0] != '\0') fprintf(stderr, "mailrail_gnn: %s\n", why);
            fprintf(stderr, "usage: mpiexec -n N mailrail_gnn (-r scale [-e factor] [-S seed] | "
                            "-f edges) [-F features] [-p alltoallv,none,rank,node,node+h] "
                            "[-t trials] [-c file.csv] [-P command] [-w | -W ms] [-q]\n");
        }
        MPI_Finalize();
        return 2;
    }
    /* A fresh R-MAT seed unless -S gave one: rank 0's, since every rank draws a slice. */
    if (o.use_rmat && !o.seed_given) {
        if (l.rank == 0) o.rmat.seed = tool_fresh_seed();
        MPI_Bcast(&o.rmat.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (o.quiet && l.rank == 0) {
            printf("# mailrail_gnn: R-MAT seed %llu\n", (unsigned long long)o.rmat.seed);
        }
    }
    l.features = o.features;
    l.vector_bytes = (size_t)o.features * sizeof(float);
    l.nap_ns = tool_mpi_nap_ns(o.wait, o.wait_ms);
    l.wait_ms = o.wait ? o.wait_ms : -1;
    if (!graph_load_edges("mailrail_gnn", o.file, o.use_rmat ? &o.rmat : NULL, l.rank, l.size,
                          &input)) {
        graph_edges_free(&input);
        MPI_Finalize();
        return 2;
    }
    gnn_setup(&l, &input);
    if (!gnn_fit_datagrams(&o, &l) || !gnn_open_csv(&o, &l, &csv)) {
        gnn_free(&l);
        MPI_Finalize();
        return 2;
    }
    gnn_print_header(&o, &l);

    /* Trial-major: every contender's trial k runs before any contender's trial k + 1. */
    for (int t = 0; t < o.trials && ok; t++) {
        for (int i = 0; i < o.ncontenders && ok; i++) {
            gnn_result_t r = {0};
            gnn_trial(&o, &l, &o.contenders[i], &r);
            gnn_report_trial(&o, &l, csv, &o.contenders[i], t, &r);
            secs[i][t] = r.seconds;
            last[i] = r;
            ok = r.verified;
        }
    }
    if (csv != NULL) fclose(csv);
    if (ok) {
        gnn_summarize(&o, &l, secs, last);
        if (l.rank == 0) printf("mailrail_gnn: every aggregated vector matches the serial reference\n");
    } else if (o.use_rmat && l.rank == 0) {
        fprintf(stderr, "mailrail_gnn: failed on the R-MAT graph of seed %llu (rerun with -S %llu)\n",
                (unsigned long long)o.rmat.seed, (unsigned long long)o.rmat.seed);
    }
    gnn_free(&l);
    MPI_Finalize();
    return ok ? 0 : 1;
}
