/*
 * Edge sources for the graph kernel: SNAP-style text edge lists, the compact
 * binary form, and the Graph500 R-MAT generator. Each reads or generates one
 * rank's slice of the edges, so that all ranks load a graph in parallel.
 *
 * This module knows nothing about MPI or MailRail: the kernel combines the
 * slices, and the tests use it on one process as the serial reference does.
 */
#ifndef GRAPH_EDGES_H
#define GRAPH_EDGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest vertex id: ids are non-negative and fit in a signed 64-bit integer. */
#define GRAPH_MAX_VERTEX_ID INT64_MAX

/* The binary form: this magic, a little-endian uint64 edge count, then pairs of uint64. */
#define GRAPH_BINARY_MAGIC "MRGRAPH1"
#define GRAPH_BINARY_MAGIC_LEN 8
#define GRAPH_BINARY_HEADER_LEN 16

typedef struct graph_edge {
    uint64_t u, v;
} graph_edge_t;

/* A growable array of edges. */
typedef struct graph_edges {
    graph_edge_t *edge;
    size_t count, capacity;
} graph_edges_t;

/*
 * Why reading failed. `line` is the 1-based line of a text file (0 when the
 * error is not about one line, or the file is binary); `offset` is the byte
 * offset of the problem in a binary file.
 */
typedef struct graph_error {
    uint64_t line;
    uint64_t offset;
    char reason[160];
} graph_error_t;

/* One rank's part of a text file: the byte range of whole lines [begin, end). */
typedef struct graph_text_slice {
    uint64_t begin, end;
} graph_text_slice_t;

/* Appends one edge; false when memory runs out. */
bool graph_edges_push(graph_edges_t *edges, uint64_t u, uint64_t v);

void graph_edges_free(graph_edges_t *edges);

/* Orders edges by u, then v: a qsort() comparator. */
int graph_edge_compare(const void *a, const void *b);

/* True when the file starts with GRAPH_BINARY_MAGIC. */
bool graph_file_is_binary(const char *path);

/*
 * Finds the lines of slice `part` of `parts` of a text file: the lines whose
 * first byte lies in [size * part / parts, size * (part + 1) / parts), so that
 * every line belongs to exactly one slice. Returns false and fills *error when
 * the file cannot be read.
 */
bool graph_text_slice(const char *path, int part, int parts, graph_text_slice_t *slice,
                      graph_error_t *error);

/*
 * Parses the lines of a slice, appends their edges and counts the lines into
 * *lines. A line is `u v` (more columns are ignored, as in SNAP's temporal
 * lists), blank, or a comment starting with '#' or '%'. On the first
 * malformed line it stops, fills *error with the reason and the line's
 * 1-based number within the slice (the caller adds the lines of the slices
 * before it), and returns false; *lines then counts the lines up to that one.
 */
bool graph_text_read(const char *path, const graph_text_slice_t *slice, graph_edges_t *edges,
                     uint64_t *lines, graph_error_t *error);

/*
 * Reads edges [count * part / parts, count * (part + 1) / parts) of a binary
 * file, and the total edge count into *total. Returns false and fills *error
 * for a bad header, a size that does not match the count, or an id above
 * GRAPH_MAX_VERTEX_ID.
 */
bool graph_binary_read(const char *path, int part, int parts, graph_edges_t *edges,
                       uint64_t *total, graph_error_t *error);

/* R-MAT parameters: 2^scale vertices, edge_factor x 2^scale edges. */
typedef struct graph_rmat {
    int scale;
    int edge_factor;
    uint64_t seed;
} graph_rmat_t;

/* The number of edges an R-MAT graph has. */
uint64_t graph_rmat_edges(const graph_rmat_t *rmat);

/*
 * Generates edges [first, first + count) of an R-MAT graph with the Graph500
 * parameters a = 0.57, b = 0.19, c = 0.19. Edge i depends only on the seed and
 * i, so the graph is the same for any number of ranks. Returns false when
 * memory runs out or the scale is not within 1 to 62.
 */
bool graph_rmat_generate(const graph_rmat_t *rmat, uint64_t first, uint64_t count,
                         graph_edges_t *edges);

/* The binary form's 64-bit little-endian fields. */
static inline void graph_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t graph_get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A 64-bit mixer (splitmix64's finalizer), used for ownership and checksums. */
static inline uint64_t graph_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#endif /* GRAPH_EDGES_H */
