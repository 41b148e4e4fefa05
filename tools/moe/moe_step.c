/*
 * The step's bookkeeping, common to every contender of mailrail_moe
 * (moe_step.h).
 */
#include "moe_step.h"
#include "moe_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void moe_error(moe_rank_t *r, const char *fmt, ...)
{
    va_list ap;

    if (r->errors++ >= 10) return;
    fprintf(stderr, "mailrail_moe: rank %d: ", r->rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

long moe_nap_ns(const moe_options_t *o)
{
    return tool_mpi_nap_ns(o->wait, o->wait_ms);
}

void moe_allreduce(const moe_options_t *o, const void *in, void *out, int n, MPI_Datatype type,
                   MPI_Op op)
{
    MPI_Request req;

    MPI_Iallreduce(in, out, n, type, op, MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, moe_nap_ns(o));
}

void moe_barrier(const moe_options_t *o)
{
    MPI_Request req;

    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, moe_nap_ns(o));
}

/* ---- The step's bookkeeping, common to all contenders. ---- */

void moe_step_reset(moe_rank_t *r)
{
    size_t pairs = (size_t)r->o->tokens * r->o->k;

    memset(r->acc, 0, (size_t)r->o->tokens * r->o->hidden);
    memset(r->arrived, 0, pairs * sizeof(*r->arrived));
    r->pairs_done = 0;
    r->bytes_received = 0;
    r->errors = 0;
    r->parked_len = r->parked_head = 0;
    r->scratch_unsent = 0;
}

/* The bytes of piece `piece`: [offset, offset + length) of the token. */
size_t moe_piece(const moe_rank_t *r, unsigned piece, size_t *offset)
{
    size_t off = (size_t)piece * r->piece_bytes, h = r->o->hidden;

    *offset = off;
    return h - off < r->piece_bytes ? h - off : r->piece_bytes;
}

/*
 * An expert's work on one piece that arrived from `source`: checks that the
 * expert is this rank's, and writes the result (header and transformed bytes)
 * to out. Returns the result's length, or 0 for a message that breaks the
 * protocol.
 */
size_t moe_expert(moe_rank_t *r, const uint8_t *msg, size_t len, int source, uint8_t *out)
{
    moe_header_t h;
    size_t offset;

    if (len < MOE_HEADER) {
        moe_error(r, "a dispatch message of %zu bytes from rank %d", len, source);
        return 0;
    }
    memcpy(&h, msg, sizeof(h));
    if (h.expert >= r->o->experts || r->owner[h.expert] != r->rank || h.piece >= r->pieces ||
        moe_piece(r, h.piece, &offset) != len - MOE_HEADER) {
        moe_error(r, "token %u of rank %d for expert %u (piece %u, %zu bytes) is not for an "
                  "expert of this rank", h.token, source, h.expert, h.piece, len);
        return 0;
    }
    moe_expert_apply(h.expert, offset, msg + MOE_HEADER, out + MOE_HEADER, len - MOE_HEADER);
    h.piece |= MOE_COMBINE_BIT;
    memcpy(out, &h, sizeof(h));
    r->bytes_received += len;
    return len;
}

/* The combine of one piece of an expert's result, from `source`. */
void moe_combine(moe_rank_t *r, const uint8_t *msg, size_t len, int source)
{
    const moe_options_t *o = r->o;
    moe_header_t h;
    size_t offset;

    if (len < MOE_HEADER) {
        moe_error(r, "a combine message of %zu bytes from rank %d", len, source);
        return;
    }
    memcpy(&h, msg, sizeof(h));
    unsigned piece = h.piece & ~MOE_COMBINE_BIT;
    if (h.token >= o->tokens || h.slot >= o->k ||
        r->route[(size_t)h.token * o->k + h.slot] != h.expert) {
        moe_error(r, "a result for token %u, expert %u (slot %u) from rank %d: this rank did "
                  "not send that token to that expert", h.token, h.expert, h.slot, source);
        return;
    }
    if (source != r->owner[h.expert] || piece >= r->pieces ||
        moe_piece(r, piece, &offset) != len - MOE_HEADER) {
        moe_error(r, "token %u, expert %u: piece %u of %zu bytes came from rank %d; expert %u "
                  "is on rank %d", h.token, h.expert, piece, len - MOE_HEADER, source, h.expert,
                  r->owner[h.expert]);
        return;
    }
    uint64_t *seen = &r->arrived[(size_t)h.token * o->k + h.slot], bit = 1ull << piece;
    if (r->inject != MOE_INJECT_NONE && h.token == 0 && h.slot == 0 && piece == 0) {
        /* A fault on purpose (--inject): the checks must name this pair. */
        int fault = r->inject;
        r->inject = MOE_INJECT_NONE;
        if (fault == MOE_INJECT_DROP) return;
        if (fault == MOE_INJECT_DUPLICATE) moe_combine(r, msg, len, source);
        if (fault == MOE_INJECT_FLIP) r->acc[offset] ^= 0x20;
    }
    if (*seen & bit) {
        moe_error(r, "token %u, expert %u (rank %d): piece %u arrived twice", h.token, h.expert,
                  source, piece);
        return;
    }
    *seen |= bit;
    if (*seen == r->full_mask) r->pairs_done++;
    moe_accumulate(r->acc + (size_t)h.token * o->hidden + offset, msg + MOE_HEADER,
                   len - MOE_HEADER);
    r->bytes_received += len;
}

/* Checks the step on this rank: every pair arrived once, every byte as the reference says. */
bool moe_check(moe_rank_t *r, const char *contender)
{
    const moe_options_t *o = r->o;
    bool ok = r->errors == 0;
    int named = 0;

    for (uint64_t t = 0; t < o->tokens; t++) {
        for (unsigned j = 0; j < o->k; j++) {
            if (r->arrived[t * o->k + j] == r->full_mask) continue;
            ok = false;
            if (named++ < MOE_NAME_MISSING) {
                unsigned e = r->route[t * o->k + j];
                fprintf(stderr, "mailrail_moe: %s: rank %d: token %llu, expert %u (rank %d): "
                        "the result is missing (piece mask %#llx of %#llx)\n", contender,
                        r->rank, (unsigned long long)t, e, r->owner[e],
                        (unsigned long long)r->arrived[t * o->k + j],
                        (unsigned long long)r->full_mask);
            }
        }
        const uint8_t *got = r->acc + t * o->hidden, *want = r->reference + t * o->hidden;
        if (memcmp(got, want, o->hidden) == 0) continue;
        ok = false;
        if (named++ < MOE_NAME_MISSING) {
            size_t i = 0;
            while (got[i] == want[i]) i++;
            fprintf(stderr, "mailrail_moe: %s: rank %d: token %llu (experts", contender, r->rank,
                    (unsigned long long)t);
            for (unsigned j = 0; j < o->k; j++) {
                unsigned e = r->route[t * o->k + j];
                fprintf(stderr, " %u on rank %d", e, r->owner[e]);
            }
            fprintf(stderr, "): byte %zu of the combine is %u, the serial reference says %u\n", i,
                    got[i], want[i]);
        }
    }
    return ok;
}

/* Names the first pairs still missing when a step times out. */
void moe_name_missing(const moe_rank_t *r, const char *contender)
{
    const moe_options_t *o = r->o;
    int named = 0;

    for (size_t i = 0; i < (size_t)o->tokens * o->k && named < MOE_NAME_MISSING; i++) {
        if (r->arrived[i] == r->full_mask) continue;
        unsigned e = r->route[i];
        fprintf(stderr, "mailrail_moe: %s: rank %d: token %zu, expert %u (rank %d): no result "
                "after %.0f s\n", contender, r->rank, i / o->k, e, r->owner[e], o->timeout_s);
        named++;
    }
}

bool moe_set_pieces(moe_rank_t *r, size_t room)
{
    size_t h = r->o->hidden;

    if (room <= MOE_HEADER) return false;
    size_t piece = room - MOE_HEADER < h ? room - MOE_HEADER : h, pieces = (h + piece - 1) / piece;
    if (pieces > MOE_MAX_PIECES) return false;
    r->piece_bytes = piece;
    r->pieces = (unsigned)pieces;
    r->full_mask = pieces == 64 ? ~0ull : (1ull << pieces) - 1;
    return true;
}

/* A parked result: its destination and length, then its bytes. */
#define MOE_PARK_HEAD (sizeof(int) + sizeof(size_t))

uint8_t *moe_park_slot(moe_rank_t *r, size_t len)
{
    size_t need = MOE_PARK_HEAD + len;

    if (r->parked_len + need > r->parked_cap) {
        size_t cap = r->parked_cap ? 2 * r->parked_cap : 1 << 20;
        while (cap < r->parked_len + need) cap *= 2;
        uint8_t *p = realloc(r->parked, cap);
        if (p == NULL) return NULL;
        r->parked = p;
        r->parked_cap = cap;
    }
    return r->parked + r->parked_len + MOE_PARK_HEAD;
}

void moe_park_commit(moe_rank_t *r, size_t len, int dest)
{
    uint8_t *at = r->parked + r->parked_len;

    memcpy(at, &dest, sizeof(int));
    memcpy(at + sizeof(int), &len, sizeof(size_t));
    r->parked_len += MOE_PARK_HEAD + len;
}

bool moe_park_result(moe_rank_t *r, const uint8_t *result, size_t len, int dest)
{
    uint8_t *at = moe_park_slot(r, len);

    if (at == NULL) return false;
    memcpy(at, result, len);
    moe_park_commit(r, len, dest);
    return true;
}

bool moe_parked_peek(const moe_rank_t *r, const uint8_t **result, size_t *len, int *dest)
{
    if (r->parked_head == r->parked_len) return false;
    const uint8_t *at = r->parked + r->parked_head;
    memcpy(dest, at, sizeof(int));
    memcpy(len, at + sizeof(int), sizeof(size_t));
    *result = at + MOE_PARK_HEAD;
    return true;
}

void moe_parked_pop(moe_rank_t *r)
{
    size_t len;

    memcpy(&len, r->parked + r->parked_head + sizeof(int), sizeof(size_t));
    r->parked_head += MOE_PARK_HEAD + len;
    if (r->parked_head == r->parked_len) r->parked_head = r->parked_len = 0;
}

void moe_park_free(moe_rank_t *r)
{
    free(r->parked);
    r->parked = NULL;
    r->parked_cap = r->parked_len = r->parked_head = 0;
}

mr_status_t moe_idle(const moe_rank_t *r)
{
    mr_status_t st = r->o->wait ? mr_wait(r->o->wait_ms) : MR_OK;
    return st == MR_AGAIN ? MR_OK : st;
}

size_t moe_dispatch_record(const moe_rank_t *r, uint64_t *next, unsigned *piece, uint8_t *out,
                           int *dest)
{
    const moe_options_t *o = r->o;
    uint64_t t = *next / o->k;
    moe_header_t h = {.token = (uint32_t)t, .expert = r->route[*next],
                      .slot = (uint8_t)(*next % o->k), .piece = (uint8_t)*piece};
    size_t offset, len = moe_piece(r, *piece, &offset);

    memcpy(out, &h, sizeof(h));
    memcpy(out + MOE_HEADER, r->tokens + t * o->hidden + offset, len);
    *dest = r->owner[h.expert];
    if (++*piece == r->pieces) {
        *piece = 0;
        ++*next;
    }
    return MOE_HEADER + len;
}

mr_status_t moe_finish(moe_rank_t *r, bool handlers, moe_progress_t progress,
                       mr_status_t (*quiet)(moe_rank_t *r))
{
    mr_status_t st = MR_OK;

    while (st == MR_OK) {
        bool busy = false;
        if ((st = progress(r, handlers, &busy)) != MR_OK) break;
        /* Quiescence counts a released message as done: what it owes must have left. */
        if (r->parked_head < r->parked_len) {
            if (!busy) st = moe_idle(r);
            continue;
        }
        if ((st = quiet(r)) == MR_OK) break;
        if (st == MR_AGAIN) st = busy ? MR_OK : moe_idle(r);
    }
    return st;
}

mr_status_t moe_poll(bool *progress)
{
    mr_status_t st = mr_poll();

    if (st == MR_OK) *progress = true;
    return st == MR_AGAIN ? MR_OK : st;
}
