/*
 * What the distributed graph tools (mailrail_graph, mailrail_gnn) share on
 * top of graph_edges.h: who owns a vertex, loading this rank's slice of the
 * edges with the errors agreed over all ranks, and sorted adjacency lists.
 * Unlike graph_edges.h this part uses MPI; it is the tools' own, not part of
 * MailRail's API, and is not installed.
 */
#ifndef GRAPH_DIST_H
#define GRAPH_DIST_H

#include "graph_edges.h"

#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The rank that owns vertex `id` among `size`: by hash, so that hubs spread over ranks. */
static inline int graph_owner_of(uint64_t id, int size)
{
    return (int)(graph_mix64(id) % (uint64_t)size);
}

/* Index of `key` in the sorted array a[0..n), or -1. */
static inline long graph_search(const uint64_t *a, size_t n, uint64_t key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && a[lo] == key ? (long)lo : -1;
}

/*
 * Agrees on the first error over all ranks of MPI_COMM_WORLD: every rank
 * prints it as `tool`, naming `source` and the line (or offset). `line` is
 * the failing line counted over the whole file, 0 when the error is not about
 * a line. Collective. Returns true when no rank failed.
 */
static inline bool graph_agree_input(const char *tool, int rank, const char *source, bool ok,
                                     uint64_t line, const graph_error_t *error)
{
    struct {
        long key;
        int rank;
    } mine = {ok ? LONG_MAX : (long)line, rank}, first;
    graph_error_t shared;

    MPI_Allreduce(&mine, &first, 1, MPI_LONG_INT, MPI_MINLOC, MPI_COMM_WORLD);
    if (first.key == LONG_MAX) return true;
    if (rank == first.rank) shared = *error;
    MPI_Bcast(&shared, sizeof(shared), MPI_BYTE, first.rank, MPI_COMM_WORLD);
    shared.reason[sizeof(shared.reason) - 1] = '\0';
    if (first.key > 0) {
        fprintf(stderr, "%s: rank %d: %s:%ld: %s\n", tool, rank, source, first.key, shared.reason);
    } else if (shared.offset > 0) {
        fprintf(stderr, "%s: rank %d: %s: offset %llu: %s\n", tool, rank, source,
                (unsigned long long)shared.offset, shared.reason);
    } else {
        fprintf(stderr, "%s: rank %d: %s: %s\n", tool, rank, source, shared.reason);
    }
    return false;
}

/*
 * Loads this rank's slice of the edges into *out: of the R-MAT graph `rmat`
 * when it is not NULL, else of `file` (text or binary). Collective over
 * MPI_COMM_WORLD. Returns false on every rank after an error, which every
 * rank has printed as `tool`, naming the file and the line.
 */
static inline bool graph_load_edges(const char *tool, const char *file, const graph_rmat_t *rmat,
                                    int rank, int size, graph_edges_t *out)
{
    graph_error_t error = {0};
    uint64_t lines = 0, before = 0, total;
    bool ok;

    if (rmat != NULL) {
        uint64_t m = graph_rmat_edges(rmat);
        uint64_t first = m / (uint64_t)size * (uint64_t)rank +
                         m % (uint64_t)size * (uint64_t)rank / (uint64_t)size;
        uint64_t next = m / (uint64_t)size * (uint64_t)(rank + 1) +
                        m % (uint64_t)size * (uint64_t)(rank + 1) / (uint64_t)size;
        ok = graph_rmat_generate(rmat, first, next - first, out);
        if (!ok) snprintf(error.reason, sizeof(error.reason), "out of memory");
        return graph_agree_input(tool, rank, "R-MAT generator", ok, 0, &error);
    }
    if (graph_file_is_binary(file)) {
        ok = graph_binary_read(file, rank, size, out, &total, &error);
        return graph_agree_input(tool, rank, file, ok, 0, &error);
    }
    graph_text_slice_t slice;
    ok = graph_text_slice(file, rank, size, &slice, &error) &&
         graph_text_read(file, &slice, out, &lines, &error);
    MPI_Exscan(&lines, &before, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) before = 0;
    return graph_agree_input(tool, rank, file, ok, error.line > 0 ? before + error.line : 0,
                             &error);
}

/*
 * Builds sorted adjacency lists without repeats from arcs (u, v), u owned
 * here: the nv vertices that have an arc, sorted, in ids[0..nv); the
 * neighbours of ids[i] in adj[offs[i] .. offs[i + 1]), sorted. Sorts the arcs
 * in place and leaves them otherwise untouched; sets *duplicates to the arcs
 * that repeated another. The arrays are malloc()ed (never NULL on success);
 * the caller frees them. Returns false when memory runs out (nothing is then
 * allocated).
 */
static inline bool graph_adjacency_build(graph_edges_t *arcs, size_t *nv, uint64_t **ids,
                                         size_t **offs, uint64_t **adj, uint64_t *duplicates)
{
    graph_edge_t *a = arcs->edge;
    size_t n = 0, count = 0;

    qsort(a, arcs->count, sizeof(*a), graph_edge_compare);
    for (size_t k = 0; k < arcs->count; k++) {
        if (n == 0 || a[n - 1].u != a[k].u || a[n - 1].v != a[k].v) n++;
    }
    *ids = malloc((n + 1) * sizeof(**ids));
    *offs = malloc((n + 2) * sizeof(**offs));
    *adj = malloc((n + 1) * sizeof(**adj));
    if (*ids == NULL || *offs == NULL || *adj == NULL) {
        free(*ids);
        free(*offs);
        free(*adj);
        *ids = *adj = NULL;
        *offs = NULL;
        return false;
    }
    n = 0;
    for (size_t k = 0; k < arcs->count; k++) {
        if (n > 0 && a[k].u == (*ids)[count - 1] && a[k].v == (*adj)[n - 1]) continue;
        if (count == 0 || (*ids)[count - 1] != a[k].u) {
            (*ids)[count] = a[k].u;
            (*offs)[count++] = n;
        }
        (*adj)[n++] = a[k].v;
    }
    (*offs)[count] = n;
    *nv = count;
    *duplicates = arcs->count - n;
    return true;
}

#endif /* GRAPH_DIST_H */
