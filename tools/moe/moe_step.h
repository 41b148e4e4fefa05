/*
 * What the contenders of mailrail_moe share: the options, one rank's state,
 * the header of every token on the wire, and the step's bookkeeping (an
 * expert's work on a token, the combine, the checks). Each contender's step
 * lives in a file of its own: moe_alltoallv.c (MPI), moe_datagrams.c
 * (MailRail's datagrams and handlers), moe_items.c (the item layer, --pack).
 */
#ifndef MAILRAIL_MOE_STEP_H
#define MAILRAIL_MOE_STEP_H

#include "mailrail.h"
#include "tool_mpi.h"

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOE_MAX_CONTENDERS 8
#define MOE_MAX_TRIALS 64
/* A token travels in at most this many pieces: their arrivals are a 64-bit mask. */
#define MOE_MAX_PIECES 64
/* Active-message handler ids. */
#define MOE_H_DISPATCH 1
#define MOE_H_COMBINE 2

/* Faults that --inject makes rank 0 commit on its first result of token 0. */
enum { MOE_INJECT_NONE, MOE_INJECT_DROP, MOE_INJECT_DUPLICATE, MOE_INJECT_FLIP };
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
    bool seed_given;         /* -s; else rank 0 draws a fresh seed. */
    const char *csv;
    const char *port_command;
    bool wait;
    int wait_ms;
    double timeout_s;
    bool quiet;
    int inject;
    bool pack;             /* --pack: MailRail's items instead of a datagram per piece. */
} moe_options_t;

/* One rank's state, for the whole run. */
typedef struct moe_rank {
    const moe_options_t *o;
    int rank, size, nodes;
    uint16_t *route;       /* T x k expert ids of this rank's tokens. */
    int *owner;            /* E: the rank of each expert. */
    int *peers, npeers;    /* The ranks this one sends tokens to or gets tokens from. */
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
    /* --pack: the aggregators of the dispatch and the combine, and a result's room. */
    struct mr_items *dispatch_items, *combine_items;
    uint8_t *scratch;
    /* +h: the result in scratch that found no room (its length), for the retry of its item. */
    size_t scratch_unsent;
    /* Replies owed while no send buffer was free, in a growing arena. */
    uint8_t *parked;
    size_t parked_len, parked_cap, parked_head;
} moe_rank_t;

/* A protocol error: counted, and the first few printed with token, expert and rank. */
void moe_error(moe_rank_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How long idle ranks nap between tests of an MPI request (0: they spin). */
long moe_nap_ns(const moe_options_t *o);
void moe_allreduce(const moe_options_t *o, const void *in, void *out, int n, MPI_Datatype type,
                   MPI_Op op);
void moe_barrier(const moe_options_t *o);

/* Clears the step's combine, arrivals and counters. */
void moe_step_reset(moe_rank_t *r);

/*
 * Cuts tokens into pieces of at most `room` bytes with their header, for a
 * session whose messages hold `room` bytes. False when a token would take
 * more than MOE_MAX_PIECES of them (their arrivals are a 64-bit mask).
 */
bool moe_set_pieces(moe_rank_t *r, size_t room);

/* The bytes of piece `piece`: [*offset, *offset + returned length) of the token. */
size_t moe_piece(const moe_rank_t *r, unsigned piece, size_t *offset);

/*
 * An expert's work on one piece that arrived from `source`: checks that the
 * expert is this rank's, and writes the result (header and transformed bytes)
 * to out, which may be msg. Returns the result's length, or 0 for a message
 * that breaks the protocol.
 */
size_t moe_expert(moe_rank_t *r, const uint8_t *msg, size_t len, int source, uint8_t *out);

/* The combine of one piece of an expert's result, from `source`. */
void moe_combine(moe_rank_t *r, const uint8_t *msg, size_t len, int source);

/* Checks the step on this rank: every pair arrived once, every byte as the reference says. */
bool moe_check(moe_rank_t *r, const char *contender);

/* Names the first pairs still missing when a step times out. */
void moe_name_missing(const moe_rank_t *r, const char *contender);

/*
 * Results an expert owes while no send buffer is free, in order: room for
 * one of `len` bytes (NULL when out of memory), kept by moe_park_commit();
 * or a copy of one; the oldest, and dropping it once sent.
 */
uint8_t *moe_park_slot(moe_rank_t *r, size_t len);
void moe_park_commit(moe_rank_t *r, size_t len, int dest);
bool moe_park_result(moe_rank_t *r, const uint8_t *result, size_t len, int dest);
bool moe_parked_peek(const moe_rank_t *r, const uint8_t **result, size_t *len, int *dest);
void moe_parked_pop(moe_rank_t *r);
void moe_park_free(moe_rank_t *r);

/*
 * The dispatch in order, token by token, expert by expert, piece by piece:
 * writes the record of pair *next, piece *piece (header, then the token's
 * bytes) to out, advances both, and returns the record's length; *dest is the
 * expert's rank. Call while *next < T k.
 */
size_t moe_dispatch_record(const moe_rank_t *r, uint64_t *next, unsigned *piece, uint8_t *out,
                           int *dest);

/* One progress call of a MailRail step: whether anything happened, or an error. */
typedef mr_status_t (*moe_progress_t)(moe_rank_t *r, bool handlers, bool *progress);

/*
 * After this rank's own results arrived, untimed: serves the other ranks'
 * tokens, and once it owes no parked result calls `quiet` (mr_quiesce() or
 * mr_items_end_phase()) until every rank is done.
 */
mr_status_t moe_finish(moe_rank_t *r, bool handlers, moe_progress_t progress,
                       mr_status_t (*quiet)(moe_rank_t *r));

/* The handlers' progress: mr_poll(), *progress set when a handler ran or a send completed. */
mr_status_t moe_poll(bool *progress);

/* Sleeps in mr_wait() with -w, else returns at once (the caller spins). */
mr_status_t moe_idle(const moe_rank_t *r);

/* One step through MPI_Alltoallv both ways; returns this rank's seconds. */
double moe_step_alltoallv(moe_rank_t *r);
/* Frees what the baseline kept from step to step. */
void moe_alltoallv_free(moe_rank_t *r);

/*
 * After each mr_init(): cuts tokens into datagram-sized pieces and registers
 * the handlers of the +h contenders. MR_ERR_MESSAGE_TOO_LONG when a token
 * would take more than MOE_MAX_PIECES datagrams.
 */
mr_status_t moe_datagrams_open(moe_rank_t *r, bool handlers);
/*
 * One step over MailRail's datagrams (or handlers): this rank's seconds from
 * the barrier to its last result; quiescence follows, untimed.
 */
mr_status_t moe_step_datagrams(moe_rank_t *r, const tool_contender_t *c, double *seconds);

/*
 * --pack: the same over MailRail's item layer, tokens packed into datagrams.
 * moe_items_open() creates the two aggregators after each mr_init().
 */
mr_status_t moe_items_open(moe_rank_t *r, bool handlers);
mr_status_t moe_step_items(moe_rank_t *r, const tool_contender_t *c, double *seconds);
void moe_items_free(moe_rank_t *r);

#endif /* MAILRAIL_MOE_STEP_H */
