/*
 * Coalescing small messages into one transport message. Internal, shared by
 * the substrate plugins that use it (MPI, UCX). docs/architecture.md,
 * "Coalescing small messages" under the MPI substrate, has the why.
 *
 * The rule: the first message to a rank after a progress call leaves alone,
 * at once, so a lone message (a ping-pong, a request) is never held back.
 * Further messages of at most max_frame bytes to that rank before the next
 * progress call are packed into a batch, which leaves when it is full or at
 * the next progress call. Every message keeps its own credit, receive slot
 * and completion: a batch only saves the transport's per-message cost.
 *
 * The wire form of a batch: frames back to back, each a 4-byte little-endian
 * header (bits 0-29 the payload length, bit 31 set for MR_KIND_ITEMS, bit 30
 * for MR_KIND_HANDLER) and the payload. The transport tells batches from single messages itself (MPI:
 * a reserved tag; UCX: a kind in the header).
 */
#ifndef MR_BATCH_H
#define MR_BATCH_H

#include "mr_substrate.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MR__BATCH_FRAME_HDR 4u
#define MR__BATCH_ITEMS_BIT UINT32_C(0x80000000)
#define MR__BATCH_HANDLER_BIT UINT32_C(0x40000000)
#define MR__BATCH_KIND_BITS (MR__BATCH_ITEMS_BIT | MR__BATCH_HANDLER_BIT)
/* Frames per batch at most, which bounds the memory kept for completions. */
#define MR__BATCH_MAX_FRAMES 256u

typedef struct mr__batch {
    uint8_t *data;             /* cap bytes of frames. */
    size_t used;
    unsigned nframes;
    int dest;                  /* -1 while free. */
    void **cookies;            /* send()'s cookie of each frame, for its completion. */
    struct mr__batch *next_free;
} mr__batch_t;

typedef struct mr__batcher {
    size_t max_frame;          /* Largest payload packed; 0: coalescing is off. */
    size_t cap;                /* Bytes of frames per batch. */
    unsigned nbatches;
    mr__batch_t *batches;
    uint8_t *memory;           /* The batches' data, in one allocation. */
    mr__batch_t *free_list;
    mr__batch_t **open;        /* Per rank: the batch being filled, or NULL. */
    int *open_ranks;           /* The ranks with one, in no order. */
    unsigned nopen;
    uint32_t *last_epoch;      /* Per rank: the epoch of the last message that left alone. */
    uint32_t epoch;            /* Progress calls so far. */
    uint64_t added;            /* Messages packed so far (mr_stats_t.messages_coalesced). */
} mr__batcher_t;

/*
 * Sets up `nbatches` batches of at most `cap` bytes of frames for `nranks`
 * ranks; messages of at most `max_bytes` are packed (clipped to what a batch
 * holds; 0 turns coalescing off and allocates nothing).
 */
mr_status_t mr__batcher_init(mr__batcher_t *b, int nranks, unsigned nbatches, size_t cap,
                             size_t max_bytes);
void mr__batcher_fini(mr__batcher_t *b);

/* What mr__batcher_add() did with a message. */
typedef enum {
    MR__BATCH_ALONE,           /* Not packed: the caller sends it as a message of its own. */
    MR__BATCH_ADDED,           /* Packed: it completes with its batch. */
    MR__BATCH_FULL             /* The rank's open batch has no room: send it, then add again. */
} mr__batch_add_t;

mr__batch_add_t mr__batcher_add(mr__batcher_t *b, int dest, unsigned kind, const void *data,
                                size_t length, void *cookie);

/*
 * The rule for a rank with no batch open: true, and noted, for the first
 * message to `dest` since the last progress call, which leaves alone.
 */
static inline bool mr__batcher_first_in_epoch(mr__batcher_t *b, int dest)
{
    if (b->last_epoch[dest] == b->epoch) return false;
    b->last_epoch[dest] = b->epoch;
    return true;
}

/*
 * The coalescing step of a substrate's send(), for a message with immediate
 * `imm`: packs it when it may (sets *packed: the send is accepted, and
 * completes with its batch). Otherwise, before the caller sends it alone,
 * sends the rank's open batch, so that the message does not overtake it.
 * `send_batch(ctx, dest)` sends the open batch of `dest`; when it refuses,
 * that status is returned and nothing was done with the message.
 * mr__batcher_route() below; this is the part that is not inline.
 */
mr_status_t mr__batcher_route_slow(mr__batcher_t *b, int dest, unsigned kind, uint32_t imm,
                                   const void *data, size_t length, void *cookie,
                                   mr_status_t (*send_batch)(void *ctx, int dest), void *ctx,
                                   bool *packed);

/* The coalescing step of send(), as described above. */
static inline mr_status_t mr__batcher_route(mr__batcher_t *b, int dest, unsigned kind,
                                            uint32_t imm, const void *data, size_t length,
                                            void *cookie,
                                            mr_status_t (*send_batch)(void *ctx, int dest),
                                            void *ctx, bool *packed)
{
    /* Inline, the common cases: coalescing is off, or a message leaves alone, no batch open. */
    *packed = false;
    if (b->max_frame == 0) return MR_OK;
    if (b->open[dest] == NULL &&
        (imm != 0 || length > b->max_frame || mr__batcher_first_in_epoch(b, dest))) {
        return MR_OK;
    }
    return mr__batcher_route_slow(b, dest, kind, imm, data, length, cookie, send_batch, ctx,
                                  packed);
}

/* Takes the open batch of `dest` (NULL if none) off the open list, to send it. */
mr__batch_t *mr__batcher_detach(mr__batcher_t *b, int dest);

/* A batch that was sent (or given up) is free again. */
void mr__batcher_release(mr__batcher_t *b, mr__batch_t *batch);

/*
 * A batch was sent or given up: runs send_complete() for each of its
 * messages (inside progress() only) and frees it. Returns how many.
 */
int mr__batcher_complete(mr__batcher_t *b, mr__batch_t *batch, const mr_substrate_upcalls_t *up,
                         void *core);

/* Adds the messages packed so far to a substrate's mr_stats_t, when it has the field. */
static inline void mr__batcher_stats(const mr__batcher_t *b, mr_stats_t *stats)
{
    if (stats->size >= offsetof(mr_stats_t, messages_coalesced) + sizeof(uint64_t)) {
        stats->messages_coalesced += b->added;
    }
}

/* A progress call starts: the next message to every rank leaves alone again. */
static inline void mr__batcher_next_epoch(mr__batcher_t *b)
{
    b->epoch++;
}

/*
 * Reads the frame at *offset of a received batch of `length` bytes. Returns
 * 1 and the frame (advancing *offset), 0 at the end, or MR_ERR_PROTOCOL when
 * the frames do not add up to the batch.
 */
int mr__batch_frame_next(const uint8_t *batch, size_t length, size_t *offset, unsigned *kind,
                         const uint8_t **payload, size_t *payload_len);

#endif /* MR_BATCH_H */
