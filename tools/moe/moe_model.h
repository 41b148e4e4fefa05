/*
 * The model behind mailrail_moe, apart from any communication: the tokens,
 * the experts' transform, the routing of tokens to experts (Zipf popularity or
 * a router's trace in a file) and the placement of experts on ranks. Every
 * function is deterministic, so that all contenders of a trial see the same
 * routing and every rank can compute the serial reference of its own tokens.
 */
#ifndef MAILRAIL_MOE_MODEL_H
#define MAILRAIL_MOE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Expert ids travel in 16 bits. */
#define MOE_MAX_EXPERTS 65535
#define MOE_MAX_K 64

/* Fills the `len` bytes of token `t` of rank `rank` that start at `offset`. */
void moe_token_bytes(uint64_t seed, int rank, uint64_t t, size_t offset, uint8_t *out, size_t len);

/*
 * Expert `e`'s transform of the token bytes in[0..len) that start at byte
 * `offset` of the token, into out (which may be in): a different bijection per
 * expert and per position, one multiply-add per byte, so that it touches every
 * byte without hiding the communication.
 */
void moe_expert_apply(unsigned e, size_t offset, const uint8_t *in, uint8_t *out, size_t len);

/* acc[i] += in[i], modulo 256: the combine of one expert's result. */
void moe_accumulate(uint8_t *acc, const uint8_t *in, size_t len);

/*
 * A routing: for each of `tokens` tokens, `k` distinct expert ids below
 * `experts`, row-major (route[t * k + j]).
 */
typedef struct moe_routing {
    uint64_t tokens;
    unsigned k, experts;
    uint16_t *route;
} moe_routing_t;

/*
 * Draws the routing of one rank's tokens: each token picks k distinct
 * experts, expert q with probability proportional to 1 / (q + 1)^s (Zipf;
 * s = 0 is uniform), so expert 0 is the most popular. Returns false when out
 * of memory.
 */
bool moe_routing_zipf(moe_routing_t *r, uint64_t tokens, unsigned k, unsigned experts, double s,
                      uint64_t seed);

/*
 * Reads a router's trace: one line per token, its k expert ids separated by
 * spaces or commas; blank lines and lines starting with '#' are skipped. With
 * k = 0 the first line sets k. On error returns false and writes a message
 * naming the file and the line to `why`: an id out of range or repeated on
 * its line, a line with another number of ids, junk, an empty file.
 */
bool moe_routing_read(moe_routing_t *r, const char *path, unsigned k, unsigned experts, char *why,
                      size_t why_len);

void moe_routing_free(moe_routing_t *r);

/*
 * The popularity order of the experts in routings[0..n): order[q] is the
 * q-th most chosen expert (ties by id). For a Zipf routing that is close to
 * the identity.
 */
void moe_popularity(const moe_routing_t *r, unsigned *order);

/*
 * Places E experts on P ranks, E / P each (E a multiple of P): owner[e] is
 * the rank of expert e. The experts go in popularity order (`order`) round
 * robin over the ranks (spread), or, with `hot`, first onto the `nhot` ranks
 * listed in hot_ranks (the last host's) until each holds E / P, then round
 * robin over the others: the incast inside the all-to-all.
 */
void moe_place(unsigned experts, int ranks, const unsigned *order, bool hot, const int *hot_ranks,
               int nhot, int *owner);

#endif /* MAILRAIL_MOE_MODEL_H */
