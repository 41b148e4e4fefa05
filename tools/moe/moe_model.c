/*
 * The model behind mailrail_moe: tokens, experts, routing and placement
 * (moe_model.h).
 */
#include "moe_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t moe_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void moe_token_bytes(uint64_t seed, int rank, uint64_t t, size_t offset, uint8_t *out, size_t len)
{
    uint64_t base = moe_mix(seed ^ ((uint64_t)(unsigned)rank << 40) ^ (t << 1));

    /* Byte i of the token is byte i % 8 of the word mix(base + i / 8). */
    for (size_t i = 0; i < len;) {
        size_t at = offset + i, word = at / 8, skip = at % 8;
        uint64_t w = moe_mix(base + word);
        uint8_t b[8];
        size_t n = 8 - skip < len - i ? 8 - skip : len - i;

        memcpy(b, &w, sizeof(b));
        memcpy(out + i, b + skip, n);
        i += n;
    }
}

void moe_expert_apply(unsigned e, size_t offset, const uint8_t *in, uint8_t *out, size_t len)
{
    uint8_t a = (uint8_t)(2 * (e % 128) + 1), b = (uint8_t)(e * 7 + (e >> 7) + (uint8_t)offset);

    for (size_t i = 0; i < len; i++) out[i] = (uint8_t)(in[i] * a + b + (uint8_t)i);
}

void moe_accumulate(uint8_t *acc, const uint8_t *in, size_t len)
{
    for (size_t i = 0; i < len; i++) acc[i] = (uint8_t)(acc[i] + in[i]);
}

/* A uniform double in [0, 1) from the generator state. */
static double moe_uniform(uint64_t *state)
{
    *state = moe_mix(*state);
    return (double)(*state >> 11) * 0x1.0p-53;
}

bool moe_routing_zipf(moe_routing_t *r, uint64_t tokens, unsigned k, unsigned experts, double s,
                      uint64_t seed)
{
    double *w = malloc(experts * sizeof(*w));
    bool *taken = calloc(experts, sizeof(*taken));
    uint64_t state = moe_mix(seed);
    double total = 0;

    r->tokens = tokens;
    r->k = k;
    r->experts = experts;
    r->route = malloc((tokens > 0 ? tokens : 1) * k * sizeof(*r->route));
    if (w == NULL || taken == NULL || r->route == NULL) {
        free(w);
        free(taken);
        moe_routing_free(r);
        return false;
    }
    for (unsigned q = 0; q < experts; q++) total += w[q] = pow((double)q + 1.0, -s);
    /*
     * Without replacement: each draw walks the weights of the experts not yet
     * taken, O(E) per draw, exact whatever the skew.
     */
    for (uint64_t t = 0; t < tokens; t++) {
        double left = total;
        uint16_t *row = r->route + t * k;
        for (unsigned j = 0; j < k; j++) {
            double u = moe_uniform(&state) * left;
            unsigned q = 0, last = 0;
            for (; q < experts; q++) {
                if (taken[q]) continue;
                last = q;
                if (u < w[q]) break;
                u -= w[q];
            }
            if (q == experts) q = last; /* Rounding left u past the end. */
            taken[q] = true;
            left -= w[q];
            row[j] = (uint16_t)q;
        }
        for (unsigned j = 0; j < k; j++) taken[row[j]] = false;
    }
    free(w);
    free(taken);
    return true;
}

void moe_routing_free(moe_routing_t *r)
{
    free(r->route);
    r->route = NULL;
    r->tokens = 0;
}

/* Appends one row to r->route, growing it; false when out of memory. */
static bool moe_routing_push(moe_routing_t *r, const uint16_t *row, uint64_t *cap)
{
    if (r->tokens == *cap) {
        uint64_t grown = *cap ? 2 * *cap : 1024;
        uint16_t *p = realloc(r->route, grown * r->k * sizeof(*p));
        if (p == NULL) return false;
        r->route = p;
        *cap = grown;
    }
    memcpy(r->route + r->tokens * r->k, row, r->k * sizeof(*row));
    r->tokens++;
    return true;
}

bool moe_routing_read(moe_routing_t *r, const char *path, unsigned k, unsigned experts, char *why,
                      size_t why_len)
{
    FILE *f = fopen(path, "r");
    char line[65536];
    uint64_t cap = 0;
    unsigned long lineno = 0;
    bool ok = true;

    memset(r, 0, sizeof(*r));
    r->experts = experts;
    r->k = k;
    if (f == NULL) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return false;
    }
    while (ok && fgets(line, sizeof(line), f) != NULL) {
        uint16_t row[MOE_MAX_K];
        unsigned n = 0;
        char *p = line;

        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            snprintf(why, why_len, "%s:%lu: the line is too long", path, lineno);
            ok = false;
            break;
        }
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0') continue;
        while (ok) {
            while (*p == ' ' || *p == '\t' || *p == ',') p++;
            if (*p == '\n' || *p == '\r' || *p == '\0') break;
            char *end;
            errno = 0;
            unsigned long id = strtoul(p, &end, 10);
            if (end == p || *p == '-' || *p == '+' || errno != 0 ||
                (*end != ' ' && *end != '\t' && *end != ',' && *end != '\n' && *end != '\r' &&
                 *end != '\0')) {
                snprintf(why, why_len, "%s:%lu: '%.*s' is not an expert id", path, lineno,
                         (int)strcspn(p, " \t,\r\n"), p);
                ok = false;
            } else if (id >= experts) {
                snprintf(why, why_len, "%s:%lu: expert %lu is out of range (-E %u: ids 0 to %u)",
                         path, lineno, id, experts, experts - 1);
                ok = false;
            } else if (n == MOE_MAX_K) {
                snprintf(why, why_len, "%s:%lu: more than %d experts", path, lineno, MOE_MAX_K);
                ok = false;
            } else {
                for (unsigned j = 0; j < n && ok; j++) {
                    if (row[j] == id) {
                        snprintf(why, why_len, "%s:%lu: expert %lu appears twice: a token picks "
                                 "each expert at most once", path, lineno, id);
                        ok = false;
                    }
                }
                row[n++] = (uint16_t)id;
            }
            p = end;
        }
        if (!ok) break;
        if (r->k == 0) r->k = n;
        if (n != r->k) {
            snprintf(why, why_len, "%s:%lu: %u experts, expected %u (-k, or the first line)", path,
                     lineno, n, r->k);
            ok = false;
        } else if (!moe_routing_push(r, row, &cap)) {
            snprintf(why, why_len, "%s:%lu: out of memory", path, lineno);
            ok = false;
        }
    }
    if (ok && ferror(f)) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        ok = false;
    }
    fclose(f);
    if (ok && r->tokens == 0) {
        snprintf(why, why_len, "%s: no routing line", path);
        ok = false;
    }
    if (!ok) moe_routing_free(r);
    return ok;
}

static const uint64_t *moe_sort_counts;

static int moe_compare_popularity(const void *a, const void *b)
{
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    if (moe_sort_counts[x] != moe_sort_counts[y]) return moe_sort_counts[x] > moe_sort_counts[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void moe_popularity(const moe_routing_t *r, unsigned *order)
{
    uint64_t *counts = calloc(r->experts, sizeof(*counts));

    for (unsigned e = 0; e < r->experts; e++) order[e] = e;
    if (counts == NULL) return; /* The identity: still a valid order. */
    for (uint64_t i = 0; i < r->tokens * r->k; i++) counts[r->route[i]]++;
    moe_sort_counts = counts;
    qsort(order, r->experts, sizeof(*order), moe_compare_popularity);
    moe_sort_counts = NULL;
    free(counts);
}

void moe_place(unsigned experts, int ranks, const unsigned *order, bool hot, const int *hot_ranks,
               int nhot, int *owner)
{
    unsigned per = experts / (unsigned)ranks, q = 0;

    if (hot && nhot > 0 && nhot < ranks) {
        bool *is_hot = calloc((size_t)ranks, sizeof(*is_hot));
        int *others = malloc((size_t)ranks * sizeof(*others)), nothers = 0;
        if (is_hot != NULL && others != NULL) {
            for (int i = 0; i < nhot; i++) is_hot[hot_ranks[i]] = true;
            for (int i = 0; i < ranks; i++) {
                if (!is_hot[i]) others[nothers++] = i;
            }
            for (; q < per * (unsigned)nhot; q++) owner[order[q]] = hot_ranks[q % (unsigned)nhot];
            for (unsigned i = 0; q < experts; q++, i++) owner[order[q]] = others[i % (unsigned)nothers];
        }
        free(is_hot);
        free(others);
        if (q == experts) return;
        q = 0; /* Out of memory: spread instead. */
    }
    for (; q < experts; q++) owner[order[q]] = (int)(q % (unsigned)ranks);
}
