/*
 * mailrail_moe: one expert-parallel Mixture-of-Experts step, dispatch and
 * combine, as in DeepEP's and pplx-kernels' dispatch/combine, over MailRail
 * against what its users run today on CPU clusters, MPI_Alltoallv.
 *
 *   mpiexec -n P mailrail_moe [options]
 *     -T TOKENS      tokens per rank (default 4096)
 *     -H BYTES       bytes per token (default 7168: DeepSeek-V3's hidden size in FP8;
 *                    14336 for BF16)
 *     -k K           experts per token (default 8)
 *     -E EXPERTS     experts in all (default 256), E / P on each rank
 *     -z S           Zipf skew of the experts' popularity (default 1.0; 0 is uniform)
 *     --hot          the most popular experts on the last host (incast inside the
 *                    all-to-all); otherwise they are spread round robin over the ranks
 *     -r FILE        the routing from a router's trace: one line per token, its k
 *                    expert ids; token t of rank r takes line (r * T + t) mod lines
 *     -p CONTENDERS  comma-separated (default alltoallv,none,rank,node,node+h):
 *                    alltoallv, a flow-control policy, or a policy with +h (handlers)
 *     -t TRIALS      trials per contender, interleaved (default 3)
 *     --warmup N     untimed steps before each timed one (default 1)
 *     -s SEED        seed of the tokens and the routing (default 1)
 *     -c FILE        append one CSV row per contender and trial to FILE
 *     -P COMMAND     rank 0 runs COMMAND (with sh) before and after each timed step; it
 *                    prints "bytes packets drops" of the bottleneck (tools/fabric's
 *                    $FABRIC_PORT_COUNTERS); the differences go to the output and CSV
 *     -w             idle ranks sleep (mr_wait, 1 ms at most; MPI through
 *                    nonblocking collectives tested with naps) instead of spinning
 *     -W MS          -w, for at most MS milliseconds at a time
 *     --timeout S    a step that has not ended after S seconds fails, naming the
 *                    (token, expert) pairs still missing (default 600)
 *     --inject F     for the tests: rank 0 drops, duplicates or flips a byte of its
 *                    first result of token 0 in the timed step (drop, duplicate, flip),
 *                    which the checks must name
 *     -q             only the summary lines
 *
 * One step: every rank holds T tokens of H bytes, each routed to k distinct
 * experts; each (token, expert) pair sends the token to the expert's rank
 * (dispatch), the expert transforms it (moe_model.h), and its result goes
 * back (combine), where the token's rank sums the k results and checks every
 * byte against a serial reference it computes itself. Each pair must arrive
 * exactly once; every error names the token, the expert and the rank.
 *
 * The contenders, with the same tokens and routing:
 *   alltoallv  what a user codes today: pack the tokens by destination,
 *              MPI_Alltoall of the counts, MPI_Alltoallv of the tokens, the
 *              expert compute over what arrived, MPI_Alltoallv back, combine.
 *   POLICY     MailRail under that flow-control policy: a token (or, when it
 *              is longer than a datagram, each datagram-sized piece of it) goes
 *              in a message of its own with an 8-byte header; an expert's rank
 *              transforms it straight from the receive slot into a send buffer
 *              and sends it back as it arrives, so dispatch, compute and
 *              combine overlap. Set MAILRAIL_DATAGRAM_SIZE above H + 8 for one
 *              message per pair (each receive slot and send buffer is that
 *              large: docs/workloads.md gives the memory).
 *   POLICY+h   the same through active-message handlers.
 * Each trial of a MailRail contender initializes MailRail afresh (untimed),
 * runs the warm-up steps and one timed step. A step is timed on every rank
 * from a common barrier to the moment its own k results of every token have
 * arrived; the step's time is the largest. Quiescence (mr_quiesce) and the
 * checks follow, untimed.
 */
#include "mailrail.h"
#include "moe_model.h"
#include "tool_common.h"
#include "tool_mpi.h"

#include <getopt.h>
#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_MAX_CONTENDERS 8
#define MOE_MAX_TRIALS 64
/* A token travels in at most this many pieces: their arrivals are a 64-bit mask. */
#define MOE_MAX_PIECES 64
/* Active-message handler ids. */
#define MOE_H_DISPATCH 1
#define MOE_H_COMBINE 2
/* Faults that --inject makes rank 0 commit on its first result of token 0. */
enum { MOE_INJECT_NONE, MOE_INJECT_DROP, MOE_INJECT_DUPLICATE, MOE_INJECT_FLIP };
static const char *const moe_inject_names[] = {"none", "drop", "duplicate", "flip"};
/* How many missing pairs a timed-out step names. */
#define MOE_NAME_MISSING 8

/* The header in front of every piece, for all contenders. */
typedef struct moe_header {
    uint32_t token;   /* Index of the token on its rank. */
    uint16_t expert;
    uint8_t slot;     /* Which of the token's k experts. */
    uint8_t piece;    /* MOE_COMBINE_BIT for a result going back, and the piece index. */
} moe_header_t;
#define MOE_COMBINE_BIT 0x80u
#define MOE_HEADER ((size_t)sizeof(moe_header_t))

typedef struct moe_options {
    uint64_t tokens;
    size_t hidden;
    unsigned k, experts;
    double skew;
    bool hot;
    const char *routing_file;
    tool_contender_t contenders[MOE_MAX_CONTENDERS];
    int ncontenders;
    int trials, warmup;
    uint64_t seed;
    const char *csv;
    const char *port_command;
    bool wait;
    int wait_ms;
    double timeout_s;
    bool quiet;
    int inject;
} moe_options_t;

/* One rank's state, for the whole run. */
typedef struct moe_rank {
    const moe_options_t *o;
    int rank, size, nodes;
    uint16_t *route;       /* T x k expert ids of this rank's tokens. */
    int *owner;            /* E: the rank of each expert. */
    uint8_t *tokens;       /* T x H: this rank's tokens. */
    uint8_t *reference;    /* T x H: the combine, computed serially. */
    uint8_t *acc;          /* T x H: the combine of the current step. */
    uint64_t *arrived;     /* T x k: pieces of each pair's result that arrived. */
    uint64_t pairs_done;   /* Pairs whose every piece arrived. */
    uint64_t bytes_received;
    uint64_t errors;       /* Messages that broke the protocol; the first few are printed. */
    /* MailRail contenders: the datagram pieces of this session. */
    size_t piece_bytes;
    unsigned pieces;
    uint64_t full_mask;
    /* The baseline's buffers, kept from step to step as an application would. */
    uint8_t *a2a_send, *a2a_recv;
    size_t a2a_send_cap, a2a_recv_cap;
    /* --inject: the fault this rank injects into its next combine, for the tests. */
    int inject;
    /* Replies owed while no send buffer was free, in a growing arena. */
    uint8_t *parked;
    size_t parked_len, parked_cap, parked_head;
} moe_rank_t;

static int moe_rank0_printf(const moe_rank_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int moe_rank0_printf(const moe_rank_t *r, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (r->rank != 0) return 0;
    va_start(ap, fmt);
    n = vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    return n;
}

/* A protocol error: counted, and the first few printed with token, expert and rank. */
static void moe_error(moe_rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void moe_error(moe_rank_t *r, const char *fmt, ...)
{
    va_list ap;

    if (r->errors++ >= 10) return;
    fprintf(stderr, "mailrail_moe: rank %d: ", r->rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static long moe_nap_ns(const moe_options_t *o)
{
    return o->wait ? (long)o->wait_ms * 1000000L : 0;
}

static void moe_allreduce(const moe_options_t *o, const void *in, void *out, int n,
                          MPI_Datatype type, MPI_Op op)
{
    MPI_Request req;

    MPI_Iallreduce(in, out, n, type, op, MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, moe_nap_ns(o));
}

static void moe_barrier(const moe_options_t *o)
{
    MPI_Request req;

    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, moe_nap_ns(o));
}

/* ---- The step's bookkeeping, common to all contenders. ---- */

static void moe_step_reset(moe_rank_t *r)
{
    size_t pairs = (size_t)r->o->tokens * r->o->k;

    memset(r->acc, 0, (size_t)r->o->tokens * r->o->hidden);
    memset(r->arrived, 0, pairs * sizeof(*r->arrived));
    r->pairs_done = 0;
    r->bytes_received = 0;
    r->errors = 0;
    r->parked_len = r->parked_head = 0;
}

/* The bytes of piece `piece`: [offset, offset + length) of the token. */
static size_t moe_piece(const moe_rank_t *r, unsigned piece, size_t *offset)
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
static size_t moe_expert(moe_rank_t *r, const uint8_t *msg, size_t len, int source, uint8_t *out)
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
static void moe_combine(moe_rank_t *r, const uint8_t *msg, size_t len, int source)
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
static bool moe_check(moe_rank_t *r, const char *contender)
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

/* ---- The baseline: MPI_Alltoallv both ways. ---- */

/* *buf with room for `len` bytes, grown when needed; stops the job when out of memory. */
static uint8_t *moe_buffer(uint8_t **buf, size_t *cap, size_t len)
{
    if (len > *cap || *buf == NULL) {
        free(*buf);
        *buf = malloc(len + 1);
        *cap = len;
        if (*buf == NULL) {
            fprintf(stderr, "mailrail_moe: out of memory for %zu bytes of MPI buffers\n", len);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return *buf;
}

/*
 * One step through MPI: returns this rank's seconds. Records of header and
 * token, packed by destination in the order of the tokens; the results come
 * back in the same places.
 */
static double moe_step_alltoallv(moe_rank_t *r)
{
    const moe_options_t *o = r->o;
    size_t rec = MOE_HEADER + o->hidden, pairs = (size_t)o->tokens * o->k;
    int p = r->size;
    int *scount = calloc((size_t)p * 4, sizeof(int)), *sdispl = scount + p,
        *rcount = scount + 2 * p, *rdispl = scount + 3 * p;
    size_t *fill = calloc((size_t)p, sizeof(size_t));
    MPI_Datatype record;
    MPI_Request req;
    long nap = moe_nap_ns(o);

    MPI_Type_contiguous((int)rec, MPI_BYTE, &record);
    MPI_Type_commit(&record);
    r->piece_bytes = o->hidden;
    r->pieces = 1;
    r->full_mask = 1;
    moe_barrier(o);
    double start = tool_now();

    for (size_t i = 0; i < pairs; i++) scount[r->owner[r->route[i]]]++;
    for (int d = 1; d < p; d++) sdispl[d] = sdispl[d - 1] + scount[d - 1];
    uint8_t *send = moe_buffer(&r->a2a_send, &r->a2a_send_cap, pairs * rec);
    for (uint64_t t = 0; t < o->tokens; t++) {
        for (unsigned j = 0; j < o->k; j++) {
            moe_header_t h = {.token = (uint32_t)t, .expert = r->route[t * o->k + j],
                              .slot = (uint8_t)j};
            int d = r->owner[h.expert];
            uint8_t *at = send + ((size_t)sdispl[d] + fill[d]++) * rec;
            memcpy(at, &h, sizeof(h));
            memcpy(at + MOE_HEADER, r->tokens + t * o->hidden, o->hidden);
        }
    }
    MPI_Ialltoall(scount, 1, MPI_INT, rcount, 1, MPI_INT, MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, nap);
    size_t nrecv = 0;
    for (int d = 0; d < p; d++) {
        rdispl[d] = (int)nrecv;
        nrecv += (size_t)rcount[d];
    }
    uint8_t *recv = moe_buffer(&r->a2a_recv, &r->a2a_recv_cap, nrecv * rec);
    MPI_Ialltoallv(send, scount, sdispl, record, recv, rcount, rdispl, record, MPI_COMM_WORLD,
                   &req);
    tool_mpi_wait(&req, nap);
    /* The experts, in place, source by source. */
    for (int d = 0; d < p; d++) {
        for (int i = 0; i < rcount[d]; i++) {
            uint8_t *at = recv + ((size_t)rdispl[d] + (size_t)i) * rec;
            if (moe_expert(r, at, rec, d, at) != rec) memset(at, 0xff, MOE_HEADER);
        }
    }
    MPI_Ialltoallv(recv, rcount, rdispl, record, send, scount, sdispl, record, MPI_COMM_WORLD,
                   &req);
    tool_mpi_wait(&req, nap);
    for (int d = 0; d < p; d++) {
        for (int i = 0; i < scount[d]; i++) moe_combine(r, send + ((size_t)sdispl[d] + (size_t)i) * rec, rec, d);
    }
    double seconds = tool_now() - start;

    free(scount);
    free(fill);
    MPI_Type_free(&record);
    return seconds;
}

/* ---- MailRail: datagrams or handlers. ---- */

/* Keeps a result that found no free send buffer, to send when one frees up. */
static bool moe_park(moe_rank_t *r, const uint8_t *msg, size_t len, int source)
{
    size_t need = sizeof(int) + sizeof(size_t) + len;

    if (r->parked_len + need > r->parked_cap) {
        size_t cap = r->parked_cap ? 2 * r->parked_cap : 1 << 20;
        while (cap < r->parked_len + need) cap *= 2;
        uint8_t *p = realloc(r->parked, cap);
        if (p == NULL) return false;
        r->parked = p;
        r->parked_cap = cap;
    }
    uint8_t *at = r->parked + r->parked_len;
    memcpy(at, &source, sizeof(int));
    memcpy(at + sizeof(int), &len, sizeof(size_t));
    len = moe_expert(r, msg, len, source, at + sizeof(int) + sizeof(size_t));
    if (len > 0) r->parked_len += need;
    return true;
}

/* Sends the parked results while send buffers are free. */
static mr_status_t moe_unpark(moe_rank_t *r)
{
    while (r->parked_head < r->parked_len) {
        uint8_t *at = r->parked + r->parked_head;
        int dest;
        size_t len;
        void *buf;

        memcpy(&dest, at, sizeof(int));
        memcpy(&len, at + sizeof(int), sizeof(size_t));
        mr_status_t st = mr_reserve(&buf);
        if (st != MR_OK) return st == MR_AGAIN ? MR_OK : st;
        memcpy(buf, at + sizeof(int) + sizeof(size_t), len);
        if ((st = mr_send(buf, len, dest)) != MR_OK) {
            mr_release(buf);
            return st;
        }
        r->parked_head += sizeof(int) + sizeof(size_t) + len;
    }
    r->parked_len = r->parked_head = 0;
    return MR_OK;
}

/* Receives what arrived: dispatch pieces are answered, results combined. */
static mr_status_t moe_drain(moe_rank_t *r, bool *progress)
{
    mr_message_t m;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        const uint8_t *msg = m.data;
        *progress = true;
        if (m.length >= MOE_HEADER && (msg[7] & MOE_COMBINE_BIT)) {
            moe_combine(r, msg, m.length, m.source);
        } else {
            void *buf;
            /* Replies go in order: behind any parked one. */
            if (r->parked_head == r->parked_len && (st = mr_reserve(&buf)) == MR_OK) {
                size_t len = moe_expert(r, msg, m.length, m.source, buf);
                st = len > 0 ? mr_send(buf, len, m.source) : MR_OK;
                if (len == 0 || st != MR_OK) mr_release(buf);
            } else if (st == MR_OK || st == MR_AGAIN) {
                st = moe_park(r, msg, m.length, m.source) ? MR_OK : MR_ERR_NO_MEMORY;
            }
            if (st != MR_OK) {
                mr_release(m.data);
                return st;
            }
        }
        if ((st = mr_release(m.data)) != MR_OK) return st;
    }
    return st == MR_AGAIN ? MR_OK : st;
}

static mr_status_t moe_on_dispatch(const mr_message_t *m, void *arg)
{
    moe_rank_t *r = arg;
    void *buf;
    mr_status_t st = mr_reserve(&buf);

    if (st != MR_OK) return st; /* MR_AGAIN: called again later with the same message. */
    size_t len = moe_expert(r, m->data, m->length, m->source, buf);
    st = len > 0 ? mr_send_handler(buf, len, m->source, MOE_H_COMBINE) : MR_OK;
    if (len == 0 || st != MR_OK) mr_release(buf);
    return st;
}

static mr_status_t moe_on_combine(const mr_message_t *m, void *arg)
{
    moe_combine(arg, m->data, m->length, m->source);
    return MR_OK;
}

/* Progress once: whether anything happened, or an error. */
static mr_status_t moe_progress(moe_rank_t *r, bool handlers, bool *progress)
{
    mr_status_t st;

    if (handlers) {
        st = mr_poll();
        if (st == MR_OK) *progress = true;
        return st == MR_AGAIN ? MR_OK : st;
    }
    if ((st = moe_unpark(r)) != MR_OK) return st;
    return moe_drain(r, progress);
}

static mr_status_t moe_idle(const moe_rank_t *r)
{
    mr_status_t st = r->o->wait ? mr_wait(r->o->wait_ms) : MR_OK;
    return st == MR_AGAIN ? MR_OK : st;
}

/* Names the first pairs still missing when a step times out. */
static void moe_name_missing(const moe_rank_t *r, const char *contender)
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

/*
 * One step over MailRail: dispatch every piece, answer and combine as they
 * come. Returns this rank's seconds through *seconds, from the barrier to its
 * last result; quiescence follows, untimed.
 */
static mr_status_t moe_step_mailrail(moe_rank_t *r, const tool_contender_t *c, double *seconds)
{
    const moe_options_t *o = r->o;
    uint64_t pairs = o->tokens * o->k, next = 0;
    unsigned piece = 0;
    mr_status_t st = MR_OK;

    moe_barrier(o);
    double start = tool_now();
    while (st == MR_OK && r->pairs_done < pairs) {
        bool progress = false;
        /*
         * Results owed to other ranks first, so that the experts' replies do
         * not wait behind this rank's own dispatch for send buffers; then
         * pieces of the dispatch while send buffers are free.
         */
        st = moe_progress(r, c->handlers, &progress);
        for (int burst = 0; st == MR_OK && r->parked_head == r->parked_len && next < pairs &&
                            burst < 64; burst++) {
            void *buf;
            if ((st = mr_reserve(&buf)) != MR_OK) break;
            uint64_t t = next / o->k;
            unsigned j = (unsigned)(next % o->k);
            moe_header_t h = {.token = (uint32_t)t, .expert = r->route[next], .slot = (uint8_t)j,
                              .piece = (uint8_t)piece};
            size_t offset, len = moe_piece(r, piece, &offset);
            memcpy(buf, &h, sizeof(h));
            memcpy((uint8_t *)buf + MOE_HEADER, r->tokens + t * o->hidden + offset, len);
            int dest = r->owner[h.expert];
            st = c->handlers ? mr_send_handler(buf, MOE_HEADER + len, dest, MOE_H_DISPATCH)
                             : mr_send(buf, MOE_HEADER + len, dest);
            if (st != MR_OK) {
                mr_release(buf);
                break;
            }
            progress = true;
            if (++piece == r->pieces) {
                piece = 0;
                next++;
            }
        }
        if (st == MR_AGAIN) st = MR_OK;
        if (st == MR_OK && !progress) {
            if (tool_now() - start > o->timeout_s) {
                moe_name_missing(r, c->name);
                st = MR_ERR_TIMEOUT;
                break;
            }
            st = moe_idle(r);
        }
    }
    *seconds = tool_now() - start;
    /* Untimed: serve the other ranks' tokens until every rank is done. */
    while (st == MR_OK) {
        bool progress = false;
        if ((st = moe_progress(r, c->handlers, &progress)) != MR_OK) break;
        if (r->parked_head < r->parked_len) {
            if (!progress) st = moe_idle(r);
            continue;
        }
        if ((st = mr_quiesce()) == MR_OK) break;
        if (st == MR_AGAIN) st = progress ? MR_OK : moe_idle(r);
    }
    return st;
}

/* ---- Trials. ---- */

/* What one trial of one contender measured, the same on every rank. */
typedef struct moe_trial {
    double seconds;
    int hottest_rank;
    double hottest_mib;
    long long port[3];
    bool verified;
    int nodes;
} moe_trial_t;

/* Runs `steps` untimed steps and one timed step of `c`; false when MailRail failed. */
static bool moe_run_steps(moe_rank_t *r, const tool_contender_t *c, double *seconds,
                          bool *verified, long long port[3])
{
    const moe_options_t *o = r->o;
    long long before[3];
    bool ok = true, probed = false, all_checked = true;

    for (int s = 0; s <= o->warmup && ok; s++) {
        bool timed = s == o->warmup;
        moe_step_reset(r);
        if (timed && r->rank == 0) r->inject = o->inject;
        if (timed) probed = r->rank == 0 && o->port_command != NULL &&
                            tool_port_probe("mailrail_moe", o->port_command, before);
        if (c->mpi) {
            *seconds = moe_step_alltoallv(r);
        } else {
            mr_status_t st = moe_step_mailrail(r, c, seconds);
            if (st != MR_OK) {
                fprintf(stderr, "mailrail_moe: %s: rank %d: %s\n", c->name, r->rank,
                        mr_status_string(st));
                ok = false;
            }
        }
        if (timed && probed && tool_port_probe("mailrail_moe", o->port_command, port)) {
            for (int i = 0; i < 3; i++) port[i] -= before[i];
        } else if (timed) {
            for (int i = 0; i < 3; i++) port[i] = -1;
        }
        all_checked = moe_check(r, c->name) && all_checked;
    }
    *verified = ok && all_checked;
    return ok;
}

/* One trial of one contender; fills *out identically on every rank. */
static bool moe_trial(moe_rank_t *r, const tool_contender_t *c, moe_trial_t *out)
{
    const moe_options_t *o = r->o;
    MPI_Comm comm = MPI_COMM_WORLD;
    double seconds = 0;
    bool verified = false, ran = true;

    out->nodes = r->nodes;
    if (!c->mpi) {
        setenv("MAILRAIL_FLOWCTL", c->policy, 1);
        mr_status_t st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) {
            fprintf(stderr, "mailrail_moe: %s: rank %d: mr_init: %s\n", c->name, r->rank,
                    mr_status_string(st));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        r->piece_bytes = mr_datagram_size() - MOE_HEADER - (c->handlers ? 1 : 0);
        if (r->piece_bytes > o->hidden) r->piece_bytes = o->hidden;
        r->pieces = (unsigned)((o->hidden + r->piece_bytes - 1) / r->piece_bytes);
        r->full_mask = r->pieces == 64 ? ~0ull : (1ull << r->pieces) - 1;
        mr_handler_register(MOE_H_DISPATCH, moe_on_dispatch, r);
        mr_handler_register(MOE_H_COMBINE, moe_on_combine, r);
        out->nodes = mr_node_count();
    }
    ran = moe_run_steps(r, c, &seconds, &verified, out->port);
    if (!c->mpi) {
        if (!tool_invariants_hold("mailrail_moe")) verified = false;
        if (ran && mr_finalize() != MR_OK) verified = false;
        if (!ran) MPI_Abort(MPI_COMM_WORLD, 1); /* Peers may wait for this rank forever. */
    }
    /* The step's time, its verdict and the rank that received the most. */
    int mine_ok = verified, all_ok = 0;
    moe_allreduce(o, &seconds, &out->seconds, 1, MPI_DOUBLE, MPI_MAX);
    moe_allreduce(o, &mine_ok, &all_ok, 1, MPI_INT, MPI_MIN);
    struct { double bytes; int rank; } mine = {(double)r->bytes_received, r->rank}, hottest;
    moe_allreduce(o, &mine, &hottest, 1, MPI_DOUBLE_INT, MPI_MAXLOC);
    out->hottest_rank = hottest.rank;
    out->hottest_mib = hottest.bytes / 1048576.0;
    out->verified = all_ok != 0;
    return out->verified;
}

/* ---- Set-up: options, routing, placement, the reference. ---- */

static void moe_usage(void)
{
    fprintf(stderr, "usage: mpiexec -n P mailrail_moe [-T tokens] [-H bytes] [-k K] [-E experts] "
            "[-z skew] [--hot] [-r routing-file] [-p alltoallv,none,rank,node,node+h] "
            "[-t trials] [--warmup N] [-s seed] [-c file.csv] [-P command] [-w | -W ms] "
            "[--timeout s] [-q]\n");
}

/* Parses the options; returns false (rank 0 says why) on a bad one. */
static bool moe_parse(int argc, char **argv, moe_options_t *o, int rank)
{
    static const struct option longs[] = {{"hot", no_argument, NULL, 'o'},
                                          {"warmup", required_argument, NULL, 'u'},
                                          {"timeout", required_argument, NULL, 'x'},
                                          {"inject", required_argument, NULL, 'i'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    const char *contenders = "alltoallv,none,rank,node,node+h";
    uint64_t v;
    bool ok = true;
    int c;

    *o = (moe_options_t){.tokens = 4096, .hidden = 7168, .k = 8, .experts = 256, .skew = 1.0,
                         .trials = 3, .warmup = 1, .seed = 1, .wait_ms = 1, .timeout_s = 600};
    bool k_given = false;
    while ((c = getopt_long(argc, argv, "T:H:k:E:z:r:p:t:s:c:P:W:wqh", longs, NULL)) != -1) {
        char *end = NULL;
        const char *what = NULL;
        switch (c) {
        case 'T': if (!tool_parse_uint(optarg, 1, UINT32_MAX, &o->tokens)) what = "-T takes 1 to 4294967295 tokens"; break;
        case 'H': if (!tool_parse_uint(optarg, 1, SIZE_MAX / 2, &v)) what = "-H takes a size of at least 1 byte"; else o->hidden = (size_t)v; break;
        case 'k': if (!tool_parse_unsigned(optarg, &o->k) || o->k < 1 || o->k > MOE_MAX_K) what = "-k takes 1 to 64 experts per token"; k_given = true; break;
        case 'E': if (!tool_parse_unsigned(optarg, &o->experts) || o->experts < 1 || o->experts > MOE_MAX_EXPERTS) what = "-E takes 1 to 65535 experts"; break;
        case 'z': o->skew = strtod(optarg, &end); if (end == optarg || *end != '\0' || !(o->skew >= 0 && o->skew <= 10)) what = "-z takes a skew from 0 to 10"; break;
        case 'o': o->hot = true; break;
        case 'r': o->routing_file = optarg; break;
        case 'p': contenders = optarg; break;
        case 't': if (!tool_parse_int(optarg, 1, MOE_MAX_TRIALS, &o->trials)) what = "-t takes 1 to 64 trials"; break;
        case 'u': if (!tool_parse_int(optarg, 0, 100, &o->warmup)) what = "--warmup takes 0 to 100 steps"; break;
        case 's': if (!tool_parse_uint(optarg, 0, UINT64_MAX, &o->seed)) what = "-s takes an unsigned seed"; break;
        case 'c': o->csv = optarg; break;
        case 'P': o->port_command = optarg; break;
        case 'w': o->wait = true; break;
        case 'W': o->wait = true; if (!tool_parse_int(optarg, 0, 60000, &o->wait_ms)) what = "-W takes 0 to 60000 ms"; break;
        case 'x': o->timeout_s = strtod(optarg, &end); if (end == optarg || *end != '\0' || !(o->timeout_s > 0)) what = "--timeout takes a positive number of seconds"; break;
        case 'q': o->quiet = true; break;
        case 'i':
            o->inject = -1;
            for (int f = 0; f < 4; f++) {
                if (strcmp(optarg, moe_inject_names[f]) == 0) o->inject = f;
            }
            if (o->inject < 0) what = "--inject takes none, drop, duplicate or flip";
            break;
        default: what = ""; break;
        }
        if (what != NULL) {
            if (rank == 0 && *what) fprintf(stderr, "mailrail_moe: %s\n", what);
            ok = false;
        }
    }
    if (ok && optind < argc) {
        if (rank == 0) fprintf(stderr, "mailrail_moe: unexpected argument '%s'\n", argv[optind]);
        ok = false;
    }
    if (ok && (o->ncontenders = tool_parse_contenders(contenders, o->contenders, MOE_MAX_CONTENDERS)) < 0) {
        if (rank == 0) fprintf(stderr, "mailrail_moe: -p %s: give alltoallv or a flow-control "
                               "policy (none, rank, node), optionally with +h, comma-separated\n",
                               contenders);
        ok = false;
    }
    if (ok && o->routing_file != NULL && !k_given) o->k = 0; /* The file's first line says. */
    return ok;
}

/* Checks the sizes against each other and the job; rank 0 says what is wrong. */
static bool moe_check_sizes(const moe_options_t *o, int size, int rank)
{
    const char *why = NULL;
    char buf[256];

    if (o->experts % (unsigned)size != 0) {
        snprintf(buf, sizeof(buf), "-E %u is not a multiple of the %d ranks: each rank holds "
                 "E / P experts", o->experts, size);
        why = buf;
    } else if (o->k > o->experts) {
        snprintf(buf, sizeof(buf), "-k %u exceeds -E %u: a token picks k distinct experts", o->k,
                 o->experts);
        why = buf;
    } else if ((size_t)o->tokens * o->k > (size_t)INT_MAX) {
        snprintf(buf, sizeof(buf), "-T %llu x -k %u pairs exceed what MPI counts (%d)",
                 (unsigned long long)o->tokens, o->k, INT_MAX);
        why = buf;
    } else if (o->hidden > (size_t)INT_MAX - MOE_HEADER) {
        snprintf(buf, sizeof(buf), "-H %zu is larger than an MPI record can be", o->hidden);
        why = buf;
    }
    if (why != NULL && rank == 0) fprintf(stderr, "mailrail_moe: %s\n", why);
    return why == NULL;
}

/*
 * The routing of this rank's tokens: drawn with the seed, or rows of the file
 * that rank 0 read and everybody received. Also the experts' popularity
 * order. Returns false (rank 0 says why) on a bad file.
 */
static bool moe_route(moe_rank_t *r, moe_options_t *o, unsigned *order)
{
    moe_routing_t file = {0};
    char why[512] = "";
    unsigned long long head[2] = {0, 0};

    r->route = malloc((size_t)o->tokens * (o->k ? o->k : MOE_MAX_K) * sizeof(*r->route));
    if (o->routing_file == NULL) {
        moe_routing_t mine = {0};
        if (!moe_routing_zipf(&mine, o->tokens, o->k, o->experts, o->skew,
                              o->seed * 0x100000001B3ull + (uint64_t)r->rank)) {
            fprintf(stderr, "mailrail_moe: rank %d: out of memory\n", r->rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        memcpy(r->route, mine.route, (size_t)o->tokens * o->k * sizeof(*r->route));
        moe_routing_free(&mine);
        for (unsigned e = 0; e < o->experts; e++) order[e] = e;
        return true;
    }
    if (r->rank == 0) {
        if (moe_routing_read(&file, o->routing_file, o->k, o->experts, why, sizeof(why))) {
            head[0] = file.tokens;
            head[1] = file.k;
        } else {
            fprintf(stderr, "mailrail_moe: -r %s\n", why);
        }
    }
    MPI_Bcast(head, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (head[0] == 0) return false;
    o->k = (unsigned)head[1];
    if (r->rank != 0) {
        file.tokens = head[0];
        file.k = o->k;
        file.experts = o->experts;
        file.route = malloc(file.tokens * file.k * sizeof(*file.route));
    }
    MPI_Bcast(file.route, (int)(file.tokens * file.k), MPI_UINT16_T, 0, MPI_COMM_WORLD);
    for (uint64_t t = 0; t < o->tokens; t++) {
        uint64_t line = ((uint64_t)r->rank * o->tokens + t) % file.tokens;
        memcpy(r->route + t * o->k, file.route + line * o->k, o->k * sizeof(*r->route));
    }
    moe_popularity(&file, order);
    moe_routing_free(&file);
    return true;
}

/* The hosts as MailRail sees them (MAILRAIL_RANKS_PER_NODE, or the host names). */
static int moe_hosts(moe_rank_t *r, int **last_host, int *nlast)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    mr_status_t st;

    setenv("MAILRAIL_FLOWCTL", "none", 1);
    if ((st = mr_init_mpi(&comm, sizeof(comm))) != MR_OK) {
        fprintf(stderr, "mailrail_moe: rank %d: mr_init: %s\n", r->rank, mr_status_string(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int nodes = mr_node_count(), last = mr_node_of(r->size - 1);
    *last_host = malloc((size_t)r->size * sizeof(int));
    *nlast = 0;
    for (int i = 0; i < r->size; i++) {
        if (mr_node_of(i) == last) (*last_host)[(*nlast)++] = i;
    }
    mr_finalize();
    return nodes;
}

static void moe_print_setup(const moe_rank_t *r, int nlast)
{
    const moe_options_t *o = r->o;
    size_t bytes = (size_t)o->tokens * o->k * o->hidden;

    moe_rank0_printf(r, "# mailrail_moe: %d ranks on %d host(s), %llu tokens of %zu B per rank, "
                     "k=%u of E=%u experts (%u per rank), ", r->size, r->nodes,
                     (unsigned long long)o->tokens, o->hidden, o->k, o->experts,
                     o->experts / (unsigned)r->size);
    if (o->routing_file != NULL) moe_rank0_printf(r, "routing from %s", o->routing_file);
    else moe_rank0_printf(r, "Zipf s=%.2f", o->skew);
    moe_rank0_printf(r, ", experts %s; %.1f MiB dispatched per rank per step; %d trial(s), "
                     "%d warm-up step(s)\n",
                     o->hot ? (nlast < r->size ? "hot on the last host" :
                                                 "spread (--hot: one host only)")
                            : "spread",
                     (double)bytes / 1048576.0, o->trials, o->warmup);
}

int main(int argc, char **argv)
{
    moe_options_t o;
    moe_rank_t r = {.o = &o};
    int status = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    if (!moe_parse(argc, argv, &o, r.rank)) {
        if (r.rank == 0) moe_usage();
        MPI_Finalize();
        return 2;
    }
    if (!moe_check_sizes(&o, r.size, r.rank)) {
        MPI_Finalize();
        return 2;
    }
    unsigned *order = malloc(o.experts * sizeof(*order));
    if (!moe_route(&r, &o, order) || !moe_check_sizes(&o, r.size, r.rank)) {
        free(order);
        free(r.route);
        MPI_Finalize();
        return 2;
    }
    int *last_host, nlast;
    r.nodes = moe_hosts(&r, &last_host, &nlast);
    r.owner = malloc(o.experts * sizeof(*r.owner));
    moe_place(o.experts, r.size, order, o.hot, last_host, nlast, r.owner);
    free(order);
    free(last_host);

    /* This rank's tokens and the serial reference of their combine. */
    size_t tbytes = (size_t)o.tokens * o.hidden;
    r.tokens = malloc(tbytes + 1);
    r.reference = calloc(tbytes + 1, 1);
    r.acc = malloc(tbytes + 1);
    r.arrived = malloc((size_t)o.tokens * o.k * sizeof(*r.arrived));
    uint8_t *scratch = malloc(o.hidden);
    if (r.tokens == NULL || r.reference == NULL || r.acc == NULL || r.arrived == NULL ||
        scratch == NULL) {
        fprintf(stderr, "mailrail_moe: rank %d: out of memory for %zu bytes of tokens\n", r.rank,
                tbytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (uint64_t t = 0; t < o.tokens; t++) {
        uint8_t *tok = r.tokens + t * o.hidden;
        moe_token_bytes(o.seed, r.rank, t, 0, tok, o.hidden);
        for (unsigned j = 0; j < o.k; j++) {
            moe_expert_apply(r.route[t * o.k + j], 0, tok, scratch, o.hidden);
            moe_accumulate(r.reference + t * o.hidden, scratch, o.hidden);
        }
    }
    free(scratch);
    moe_print_setup(&r, nlast);

    FILE *csv = NULL;
    if (r.rank == 0 && o.csv != NULL) {
        csv = fopen(o.csv, "a");
        if (csv == NULL) perror(o.csv);
        else if (ftell(csv) == 0) {
            fprintf(csv, "contender,trial,ranks,nodes,tokens,hidden,k,experts,skew,hot,routing,"
                         "seconds,tokens_per_s,hottest_rank,hottest_mib,port_bytes,port_packets,"
                         "port_drops,verified\n");
        }
    }
    if (!o.quiet) {
        moe_rank0_printf(&r, "# %-10s %5s %10s %14s %8s %12s %12s %10s\n", "contender", "trial",
                         "seconds", "tokens/s", "hottest", "hottest MiB", "port bytes",
                         "port drops");
    }
    double secs[MOE_MAX_CONTENDERS][MOE_MAX_TRIALS];
    moe_trial_t last[MOE_MAX_CONTENDERS];
    long long drops[MOE_MAX_CONTENDERS][MOE_MAX_TRIALS];
    for (int k = 0; k < o.trials && status == 0; k++) {
        for (int c = 0; c < o.ncontenders && status == 0; c++) {
            moe_trial_t t = {0};
            const tool_contender_t *ct = &o.contenders[c];
            if (!moe_trial(&r, ct, &t)) {
                moe_rank0_printf(&r, "mailrail_moe: %s trial %d failed the check\n", ct->name, k);
                status = 1;
                break;
            }
            secs[c][k] = t.seconds;
            drops[c][k] = t.port[2];
            last[c] = t;
            double rate = (double)o.tokens * r.size / t.seconds;
            if (!o.quiet) {
                moe_rank0_printf(&r, "  %-10s %5d %10.4f %14.0f %8d %12.1f %12lld %10lld\n",
                                 ct->name, k, t.seconds, rate, t.hottest_rank, t.hottest_mib,
                                 t.port[0], t.port[2]);
            }
            if (csv != NULL) {
                fprintf(csv, "%s,%d,%d,%d,%llu,%zu,%u,%u,%.2f,%d,%s,%.6f,%.0f,%d,%.3f,%lld,%lld,"
                        "%lld,1\n", ct->name, k, r.size, t.nodes, (unsigned long long)o.tokens,
                        o.hidden, o.k, o.experts, o.routing_file ? 0.0 : o.skew, o.hot,
                        o.routing_file ? "file" : "zipf", t.seconds, rate, t.hottest_rank,
                        t.hottest_mib, t.port[0], t.port[1], t.port[2]);
                fflush(csv);
            }
        }
    }
    if (status == 0 && r.rank == 0) {
        int base = -1;
        for (int c = 0; c < o.ncontenders; c++) {
            if (o.contenders[c].mpi && base < 0) base = c;
        }
        double base_median = 0, lo, hi;
        if (base >= 0) {
            double copy[MOE_MAX_TRIALS];
            memcpy(copy, secs[base], (size_t)o.trials * sizeof(double));
            tool_spread(copy, o.trials, &lo, &base_median, &hi);
        }
        for (int c = 0; c < o.ncontenders; c++) {
            double median;
            tool_spread(secs[c], o.trials, &lo, &median, &hi);
            printf("mailrail_moe: %s: median %.4f s per step (min %.4f, max %.4f over %d "
                   "trials), %.0f tokens/s, hottest rank %d received %.1f MiB", o.contenders[c].name,
                   median, lo, hi, o.trials, (double)o.tokens * r.size / median,
                   last[c].hottest_rank, last[c].hottest_mib);
            if (base >= 0) printf(", %.2f of alltoallv", median / base_median);
            if (drops[c][0] >= 0) {
                long long sum = 0;
                for (int k = 0; k < o.trials; k++) sum += drops[c][k];
                printf(", %lld port drops per step", sum / o.trials);
            }
            printf("\n");
        }
        printf("mailrail_moe: every token's combine matches the serial reference\n");
        fflush(stdout);
    }
    if (csv != NULL) fclose(csv);
    free(r.route);
    free(r.owner);
    free(r.tokens);
    free(r.reference);
    free(r.acc);
    free(r.arrived);
    free(r.parked);
    free(r.a2a_send);
    free(r.a2a_recv);
    MPI_Finalize();
    return status;
}
