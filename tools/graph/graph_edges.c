/*
 * Edge sources for the graph kernel: text and binary edge lists, and R-MAT.
 */
#include "graph_edges.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Text is read in chunks of this size; a line this long or longer is an error. */
#define EDGES_CHUNK (1u << 20)

/* Fills *error; `line` and `offset` as in graph_error_t. */
static void edges_fail(graph_error_t *error, uint64_t line, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void edges_fail(graph_error_t *error, uint64_t line, uint64_t offset, const char *fmt, ...)
{
    va_list ap;

    error->line = line;
    error->offset = offset;
    va_start(ap, fmt);
    vsnprintf(error->reason, sizeof(error->reason), fmt, ap);
    va_end(ap);
}

bool graph_edges_push(graph_edges_t *edges, uint64_t u, uint64_t v)
{
    if (edges->count == edges->capacity) {
        size_t capacity = edges->capacity ? 2 * edges->capacity : 1024;
        graph_edge_t *grown = realloc(edges->edge, capacity * sizeof(*grown));
        if (grown == NULL) return false;
        edges->edge = grown;
        edges->capacity = capacity;
    }
    edges->edge[edges->count].u = u;
    edges->edge[edges->count].v = v;
    edges->count++;
    return true;
}

void graph_edges_free(graph_edges_t *edges)
{
    free(edges->edge);
    memset(edges, 0, sizeof(*edges));
}

int graph_edge_compare(const void *a, const void *b)
{
    const graph_edge_t *x = a, *y = b;
    if (x->u != y->u) return x->u < y->u ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

/* Opens `path` for reading and returns its size; -1 with *error filled on failure. */
static int edges_open(const char *path, uint64_t *size, graph_error_t *error)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        edges_fail(error, 0, 0, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        edges_fail(error, 0, 0, "not a regular file");
        close(fd);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

/* Reads exactly `len` bytes at `offset`; false on a short read or an error. */
static bool edges_pread(int fd, void *buf, size_t len, uint64_t offset)
{
    size_t done = 0;

    errno = 0; /* A short read leaves errno 0, so that callers can tell it from an error. */
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += (size_t)n;
    }
    return true;
}

bool graph_file_is_binary(const char *path)
{
    char magic[GRAPH_BINARY_MAGIC_LEN];
    graph_error_t ignored;
    uint64_t size;
    int fd = edges_open(path, &size, &ignored);
    bool binary;

    if (fd < 0) return false;
    binary = size >= GRAPH_BINARY_MAGIC_LEN && edges_pread(fd, magic, sizeof(magic), 0) &&
             memcmp(magic, GRAPH_BINARY_MAGIC, GRAPH_BINARY_MAGIC_LEN) == 0;
    close(fd);
    return binary;
}

/*
 * The first line start at or after `pos`: `pos` itself when it is 0 or follows
 * a newline, else the byte after the next newline, else `size`.
 */
static bool edges_line_start(int fd, uint64_t size, uint64_t pos, uint64_t *start)
{
    char buf[4096];

    if (pos == 0 || pos >= size) {
        *start = pos < size ? pos : size;
        return true;
    }
    for (uint64_t at = pos - 1; at < size;) {
        size_t want = size - at < sizeof(buf) ? (size_t)(size - at) : sizeof(buf);
        if (!edges_pread(fd, buf, want, at)) return false;
        char *nl = memchr(buf, '\n', want);
        if (nl != NULL) {
            *start = at + (uint64_t)(nl - buf) + 1;
            return true;
        }
        at += want;
    }
    *start = size;
    return true;
}

bool graph_text_slice(const char *path, int part, int parts, graph_text_slice_t *slice,
                      graph_error_t *error)
{
    uint64_t size, begin, end;
    int fd = edges_open(path, &size, error);
    bool ok;

    if (fd < 0) return false;
    /* size * part may overflow for huge files; split the product. */
    uint64_t lo = size / (uint64_t)parts * (uint64_t)part +
                  size % (uint64_t)parts * (uint64_t)part / (uint64_t)parts;
    uint64_t hi = size / (uint64_t)parts * (uint64_t)(part + 1) +
                  size % (uint64_t)parts * (uint64_t)(part + 1) / (uint64_t)parts;
    ok = edges_line_start(fd, size, lo, &begin) && edges_line_start(fd, size, hi, &end);
    close(fd);
    if (!ok) {
        edges_fail(error, 0, 0, "read error: %s", errno ? strerror(errno) : "short read");
        return false;
    }
    slice->begin = begin;
    slice->end = end < begin ? begin : end;
    return true;
}

/*
 * Parses one vertex id at *p (digits only, at most GRAPH_MAX_VERTEX_ID) and
 * advances *p past it. On failure fills `reason` and returns false.
 */
static bool edges_parse_id(const char **p, const char *end, uint64_t *id, char *reason,
                           size_t reason_len)
{
    const char *s = *p, *tok = s;
    uint64_t value = 0;
    int toklen;

    while (tok < end && *tok != ' ' && *tok != '\t') tok++;
    toklen = (int)(tok - s) > 40 ? 40 : (int)(tok - s);
    if (s < end && *s == '-') {
        snprintf(reason, reason_len, "negative vertex id '%.*s'", toklen, s);
        return false;
    }
    if (s == end || *s < '0' || *s > '9') {
        snprintf(reason, reason_len, "'%.*s' is not a vertex id (expected a non-negative integer)",
                 toklen, s);
        return false;
    }
    for (; s < end && *s >= '0' && *s <= '9'; s++) {
        uint64_t digit = (uint64_t)(*s - '0');
        if (value > (GRAPH_MAX_VERTEX_ID - digit) / 10) {
            snprintf(reason, reason_len, "vertex id '%.*s' is larger than %lld", toklen, *p,
                     (long long)GRAPH_MAX_VERTEX_ID);
            return false;
        }
        value = value * 10 + digit;
    }
    if (s < end && *s != ' ' && *s != '\t') {
        snprintf(reason, reason_len, "'%.*s' is not a vertex id (expected a non-negative integer)",
                 toklen, *p);
        return false;
    }
    *id = value;
    *p = s;
    return true;
}

static const char *edges_skip_blanks(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* Parses one line (without its newline). Returns false with `reason` filled. */
static bool edges_parse_line(const char *p, const char *end, graph_edges_t *edges, char *reason,
                             size_t reason_len)
{
    uint64_t u, v;

    /* CRLF files are fine; a carriage return elsewhere means CR-only line ends. */
    if (end > p && end[-1] == '\r') end--;
    for (const char *c = p; c < end; c++) {
        if (*c == '\r') {
            snprintf(reason, reason_len, "carriage return inside the line (CR-only line endings "
                                         "are not supported)");
            return false;
        }
    }
    p = edges_skip_blanks(p, end);
    if (p == end || *p == '#' || *p == '%') return true;
    if (!edges_parse_id(&p, end, &u, reason, reason_len)) return false;
    p = edges_skip_blanks(p, end);
    if (p == end) {
        snprintf(reason, reason_len, "one column: expected two vertex ids 'u v'");
        return false;
    }
    if (!edges_parse_id(&p, end, &v, reason, reason_len)) return false;
    if (!graph_edges_push(edges, u, v)) {
        snprintf(reason, reason_len, "out of memory after %zu edges", edges->count);
        return false;
    }
    return true;
}

bool graph_text_read(const char *path, const graph_text_slice_t *slice, graph_edges_t *edges,
                     uint64_t *lines, graph_error_t *error)
{
    uint64_t size, at = slice->begin, line = 0;
    char *buf = malloc(EDGES_CHUNK);
    size_t held = 0;
    int fd = -1;
    bool ok = false;

    if (buf == NULL) {
        edges_fail(error, 0, 0, "out of memory");
        goto out;
    }
    fd = edges_open(path, &size, error);
    if (fd < 0) goto out;
    if (slice->end > size) {
        edges_fail(error, 0, 0, "the file shrank while being read");
        goto out;
    }
    for (;;) {
        size_t want = EDGES_CHUNK - held;
        if (slice->end - at < want) want = (size_t)(slice->end - at);
        if (want > 0 && !edges_pread(fd, buf + held, want, at)) {
            edges_fail(error, line + 1, 0, "read error: %s", errno ? strerror(errno) : "short read");
            goto out;
        }
        at += want;
        held += want;
        bool last = at == slice->end;
        char *p = buf, *end = buf + held;
        for (;;) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            if (nl == NULL && !(last && p < end)) break;
            char *stop = nl != NULL ? nl : end;
            line++;
            if (stop - p >= (ptrdiff_t)EDGES_CHUNK) {
                /* Only a last line without a newline gets here: refuse it like the others. */
                edges_fail(error, line, 0, "line of %u bytes or more", EDGES_CHUNK);
                goto out;
            }
            if (!edges_parse_line(p, stop, edges, error->reason, sizeof(error->reason))) {
                error->line = line;
                error->offset = 0;
                goto out;
            }
            p = nl != NULL ? nl + 1 : end;
        }
        held = (size_t)(end - p);
        if (last) break;
        if (held == EDGES_CHUNK) {
            edges_fail(error, line + 1, 0, "line of %u bytes or more", EDGES_CHUNK);
            goto out;
        }
        memmove(buf, p, held);
    }
    ok = true;
out:
    *lines = line;
    if (fd >= 0) close(fd);
    free(buf);
    return ok;
}

bool graph_binary_read(const char *path, int part, int parts, graph_edges_t *edges,
                       uint64_t *total, graph_error_t *error)
{
    unsigned char header[GRAPH_BINARY_HEADER_LEN], *buf = NULL;
    uint64_t size, count, first, last;
    int fd = edges_open(path, &size, error);
    bool ok = false;

    if (fd < 0) return false;
    if (size < GRAPH_BINARY_HEADER_LEN || !edges_pread(fd, header, sizeof(header), 0) ||
        memcmp(header, GRAPH_BINARY_MAGIC, GRAPH_BINARY_MAGIC_LEN) != 0) {
        edges_fail(error, 0, 0, "not a MailRail binary edge list (no %s header)",
                   GRAPH_BINARY_MAGIC);
        goto out;
    }
    count = graph_get_le64(header + GRAPH_BINARY_MAGIC_LEN);
    if (count > (size - GRAPH_BINARY_HEADER_LEN) / 16 ||
        size != GRAPH_BINARY_HEADER_LEN + count * 16) {
        edges_fail(error, 0, GRAPH_BINARY_MAGIC_LEN,
                   "the header announces %llu edges but the file holds %llu bytes of edges",
                   (unsigned long long)count, (unsigned long long)(size - GRAPH_BINARY_HEADER_LEN));
        goto out;
    }
    first = count / (uint64_t)parts * (uint64_t)part +
            count % (uint64_t)parts * (uint64_t)part / (uint64_t)parts;
    last = count / (uint64_t)parts * (uint64_t)(part + 1) +
           count % (uint64_t)parts * (uint64_t)(part + 1) / (uint64_t)parts;
    buf = malloc(EDGES_CHUNK);
    if (buf == NULL) {
        edges_fail(error, 0, 0, "out of memory");
        goto out;
    }
    for (uint64_t e = first; e < last;) {
        uint64_t n = last - e < EDGES_CHUNK / 16 ? last - e : EDGES_CHUNK / 16;
        uint64_t offset = GRAPH_BINARY_HEADER_LEN + e * 16;
        if (!edges_pread(fd, buf, (size_t)n * 16, offset)) {
            edges_fail(error, 0, offset, "read error: %s", errno ? strerror(errno) : "short read");
            goto out;
        }
        for (uint64_t k = 0; k < n; k++) {
            uint64_t u = graph_get_le64(buf + 16 * k), v = graph_get_le64(buf + 16 * k + 8);
            if (u > GRAPH_MAX_VERTEX_ID || v > GRAPH_MAX_VERTEX_ID) {
                edges_fail(error, 0, offset + 16 * k, "vertex id larger than %lld",
                           (long long)GRAPH_MAX_VERTEX_ID);
                goto out;
            }
            if (!graph_edges_push(edges, u, v)) {
                edges_fail(error, 0, offset + 16 * k, "out of memory");
                goto out;
            }
        }
        e += n;
    }
    *total = count;
    ok = true;
out:
    free(buf);
    close(fd);
    return ok;
}

uint64_t graph_rmat_edges(const graph_rmat_t *rmat)
{
    return (uint64_t)rmat->edge_factor << rmat->scale;
}

bool graph_rmat_generate(const graph_rmat_t *rmat, uint64_t first, uint64_t count,
                         graph_edges_t *edges)
{
    /* The Graph500 quadrant probabilities, compared with a uniform draw in [0, 1). */
    const double a = 0.57, b = 0.19, c = 0.19;

    /* Ids must stay below 2^63 (GRAPH_MAX_VERTEX_ID). */
    if (rmat->scale < 1 || rmat->scale > 62) return false;

    for (uint64_t i = first; i < first + count; i++) {
        uint64_t u = 0, v = 0, state = graph_mix64(rmat->seed ^ graph_mix64(i + 1));
        for (int level = 0; level < rmat->scale; level++) {
            state = graph_mix64(state + 0x9e3779b97f4a7c15ull);
            double r = (double)(state >> 11) * 0x1.0p-53;
            u <<= 1;
            v <<= 1;
            if (r < a) {
            } else if (r < a + b) {
                v |= 1;
            } else if (r < a + b + c) {
                u |= 1;
            } else {
                u |= 1;
                v |= 1;
            }
        }
        if (!graph_edges_push(edges, u, v)) return false;
    }
    return true;
}
