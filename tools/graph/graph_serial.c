/*
 * The serial reference of the graph kernel.
 */
#include "graph_serial.h"

#include <stdlib.h>
#include <string.h>

/* Counts common entries of two sorted lists that are larger than `above`. */
static uint64_t serial_common_above(const uint64_t *a, size_t na, const uint64_t *b, size_t nb,
                                    uint64_t above)
{
    uint64_t common = 0;
    size_t i = 0, j = 0;

    while (i < na && j < nb) {
        if (a[i] < b[j]) i++;
        else if (a[i] > b[j]) j++;
        else {
            common += a[i] > above;
            i++;
            j++;
        }
    }
    return common;
}

/* Index of `id` in the sorted array `ids` of length n (it must be there). */
static size_t serial_find(const uint64_t *ids, size_t n, uint64_t id)
{
    size_t lo = 0, hi = n;
    while (lo + 1 < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ids[mid] <= id) lo = mid;
        else hi = mid;
    }
    return lo;
}

bool graph_serial_summary(const graph_edges_t *edges, graph_summary_t *out)
{
    graph_summary_t s = {.edges_read = edges->count};
    graph_edge_t *arcs = malloc((2 * edges->count + 1) * sizeof(*arcs));
    uint64_t *ids = NULL, *adj = NULL;
    size_t *offs = NULL, narcs = 0, nunique = 0, nv = 0;
    bool ok = false;

    if (arcs == NULL) goto out;
    /* Both directions of every edge but self loops, sorted, repeats removed. */
    for (size_t e = 0; e < edges->count; e++) {
        graph_edge_t x = edges->edge[e];
        if (x.u == x.v) {
            s.self_loops++;
            continue;
        }
        arcs[narcs++] = x;
        arcs[narcs++] = (graph_edge_t){x.v, x.u};
    }
    qsort(arcs, narcs, sizeof(*arcs), graph_edge_compare);
    for (size_t a = 0; a < narcs; a++) {
        if (nunique > 0 && arcs[nunique - 1].u == arcs[a].u && arcs[nunique - 1].v == arcs[a].v)
            continue;
        arcs[nunique++] = arcs[a];
    }
    /* Every repeat of an edge left two arcs behind, one per direction. */
    s.duplicate_edges = (narcs - nunique) / 2;
    s.edges = nunique / 2;

    ids = malloc((nunique + 1) * sizeof(*ids));
    offs = malloc((nunique + 2) * sizeof(*offs));
    adj = malloc((nunique + 1) * sizeof(*adj));
    if (ids == NULL || offs == NULL || adj == NULL) goto out;
    for (size_t a = 0; a < nunique; a++) {
        if (nv == 0 || ids[nv - 1] != arcs[a].u) {
            ids[nv] = arcs[a].u;
            offs[nv++] = a;
        }
        adj[a] = arcs[a].v;
    }
    offs[nv] = nunique;
    s.vertices = nv;
    for (size_t i = 0; i < nv; i++) {
        uint64_t degree = offs[i + 1] - offs[i];
        s.degree_checksum += graph_degree_term(ids[i], degree);
        if (degree > s.max_degree) {
            s.max_degree = degree;
            s.hub = ids[i];
        }
    }
    /* Triangles u < v < w: for every edge u < v, the common neighbours above v. */
    for (size_t i = 0; i < nv; i++) {
        for (size_t a = offs[i]; a < offs[i + 1]; a++) {
            uint64_t v = adj[a];
            if (v <= ids[i]) continue;
            size_t j = serial_find(ids, nv, v);
            s.triangles += serial_common_above(adj + offs[i], offs[i + 1] - offs[i],
                                               adj + offs[j], offs[j + 1] - offs[j], v);
        }
    }
    *out = s;
    ok = true;
out:
    free(adj);
    free(offs);
    free(ids);
    free(arcs);
    return ok;
}
