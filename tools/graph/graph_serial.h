/*
 * What the graph kernel computes, and a serial reference computation of it.
 *
 * The graph is taken as undirected and simple: self loops are dropped, and an
 * edge given several times (in either direction) counts once.
 */
#ifndef GRAPH_SERIAL_H
#define GRAPH_SERIAL_H

#include "graph_edges.h"

typedef struct graph_summary {
    uint64_t edges_read;       /* Lines or records, self loops and repeats included. */
    uint64_t self_loops;
    uint64_t duplicate_edges;  /* Repeats of an edge already given. */
    uint64_t vertices;         /* Vertices with at least one edge. */
    uint64_t edges;            /* Edges of the simple graph. */
    uint64_t max_degree;
    uint64_t hub;              /* The vertex of maximum degree (the smallest id on ties). */
    uint64_t degree_checksum;  /* Sum over vertices of graph_mix64(id) x degree, mod 2^64. */
    uint64_t triangles;
} graph_summary_t;

/* The checksum term of one vertex. */
static inline uint64_t graph_degree_term(uint64_t id, uint64_t degree)
{
    return graph_mix64(id ^ 0x5bd1e9955bd1e995ull) * degree;
}

/*
 * Computes the summary of the whole edge list on one process. It counts
 * triangles u < v < w by id with sorted-list intersections, a different
 * method from the distributed kernel's degree-ordered wedge checks, so that
 * the two check each other. Returns false when memory runs out.
 */
bool graph_serial_summary(const graph_edges_t *edges, graph_summary_t *out);

#endif /* GRAPH_SERIAL_H */
