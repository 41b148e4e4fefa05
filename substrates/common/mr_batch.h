/*
 * Coalescing small messages into one transport message. Internal, shared by
 * the substrate plugins that use it (MPI, UCX). docs/substrate-mpi.md,
 * "Coalescing small messages", has the why.
 *
 * The rule: the first message to a rank after a progress call leaves alone,
 * at once, so a lone message (a ping-pong, a request) is never held back.
 * Further messages of at most max_frame bytes to that rank before the next
 * progress call are packed into a batch, which leaves when it is full or at
 * the next progress call. A batch holds messages of one kind; a message of
 * another kind sends the open batch first. A packed message is copied: its
 * send buffer is free at once (send() returns MR_SUBSTRATE_SENT), and no
 * completion follows. Every message keeps its own credit; the receiver takes
 * a batch of data messages in one receive slot (MR_KIND_BATCH).
 *
 * The wire form of a batch: frames back to back (mr_substrate.h). The
 * transport tells batches from single messages itself (MPI: a reserved tag;
 * UCX: a kind in the header).
 */
#ifndef MR_BATCH_H
#define MR_BATCH_H

#include "mr_substrate.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Frames per batch at most: the messages one receive slot can hold at once. */
#define MR__BATCH_MAX_FRAMES 256u

typedef struct mr__batch {
    uint8_t *data;             /* cap bytes of frames. */
    size_t used;               /* Bytes of frames, and frames, set when it is detached; */
    unsigned nframes;          /* while open, its rank's window says (mr__batcher_used()). */
    int dest;                  /* -1 while free. */
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
    /*
     * Per rank: where the open batch takes its next frame, what kind, and how
     * many more (kind 0 when none is open). The core appends through these
     * too (mr_append_window_t, the substrate's append_windows()).
     */
    mr_append_window_t *win;
    int *open_ranks;           /* The ranks with one, in no order. */
    unsigned nopen;
    uint32_t *last_epoch;      /* Per rank: the epoch of the last message that left alone. */
    uint32_t epoch;            /* Progress calls so far. */
    uint64_t added;            /* Messages packed in batches detached so far. */
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
    MR__BATCH_ADDED,           /* Packed: copied into the batch, done. */
    MR__BATCH_FULL             /* The rank's open batch has no room: send it, then add again. */
} mr__batch_add_t;

mr__batch_add_t mr__batcher_add(mr__batcher_t *b, int dest, unsigned kind, const void *data,
                                size_t length);

/*
 * Packs a message without credits into the open batch of `dest` when there
 * is one of its kind with room: the common case of a stream, inline.
 */
static inline bool mr__batcher_append(mr__batcher_t *b, int dest, unsigned kind, const void *data,
                                      size_t length)
{
    return b->max_frame != 0 && length <= b->max_frame &&
           mr_append_window_put(&b->win[dest], kind, data, length);
}

/* The bytes of frames in the open batch of `dest`. */
static inline size_t mr__batcher_used(const mr__batcher_t *b, int dest)
{
    return (size_t)(b->win[dest].pos - b->open[dest]->data);
}

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
 * `imm`: packs it when it may (sets *packed: the send is done, its buffer
 * free). Otherwise, before the caller sends it alone,
 * sends the rank's open batch, so that the message does not overtake it.
 * `send_batch(ctx, dest)` sends the open batch of `dest`; when it refuses,
 * that status is returned and nothing was done with the message.
 * mr__batcher_route() below; this is the part that is not inline.
 */
mr_status_t mr__batcher_route_slow(mr__batcher_t *b, int dest, unsigned kind, uint32_t imm,
                                   const void *data, size_t length,
                                   mr_status_t (*send_batch)(void *ctx, int dest), void *ctx,
                                   bool *packed);

/* The coalescing step of send(), as described above. */
static inline mr_status_t mr__batcher_route(mr__batcher_t *b, int dest, unsigned kind,
                                            uint32_t imm, const void *data, size_t length,
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
    return mr__batcher_route_slow(b, dest, kind, imm, data, length, send_batch, ctx, packed);
}

/*
 * Takes the open batch of `dest` (NULL if none) off the open list, to send
 * it, with its bytes and frames counted (used, nframes), and closes its window.
 */
mr__batch_t *mr__batcher_detach(mr__batcher_t *b, int dest);

/* A batch that was sent (or given up) is free again. */
void mr__batcher_release(mr__batcher_t *b, mr__batch_t *batch);


/* Adds the messages packed so far to a substrate's mr_stats_t, when it has the field. */
static inline void mr__batcher_stats(const mr__batcher_t *b, mr_stats_t *stats)
{
    if (stats->size >= offsetof(mr_stats_t, messages_coalesced) + sizeof(uint64_t)) {
        uint64_t added = b->added;
        for (unsigned i = 0; i < b->nopen; i++) {
            added += MR__BATCH_MAX_FRAMES - b->win[b->open_ranks[i]].frames;
        }
        stats->messages_coalesced += added;
    }
}

/* The substrate's append_windows(): the batcher's windows, or NULL when coalescing is off. */
static inline mr_append_window_t *mr__batcher_windows(mr__batcher_t *b, size_t *max_frame)
{
    *max_frame = b->max_frame;
    return b->max_frame != 0 ? b->win : NULL;
}

/* A progress call starts: the next message to every rank leaves alone again. */
static inline void mr__batcher_next_epoch(mr__batcher_t *b)
{
    b->epoch++;
}

/*
 * Whether a received batch holds data messages (a batch holds one kind: its
 * first frame's header says which): the substrate delivers it whole, as
 * MR_KIND_BATCH; otherwise frame by frame (mr__batch_frame_next()).
 */
static inline bool mr__batch_is_data(const uint8_t *batch, size_t length)
{
    return length >= MR_FRAME_HDR && (batch[3] & (MR_FRAME_KIND_BITS >> 24)) == 0;
}

/*
 * Reads the frame at *offset of a received batch of `length` bytes. Returns
 * 1 and the frame (advancing *offset), 0 at the end, or MR_ERR_PROTOCOL when
 * the frames do not add up to the batch.
 */
int mr__batch_frame_next(const uint8_t *batch, size_t length, size_t *offset, unsigned *kind,
                         const uint8_t **payload, size_t *payload_len);

/*
 * The frames of a received batch from `offset` on, as far as they add up: for
 * counting the messages a held batch stands for (the substrates' held()).
 */
size_t mr__batch_frames_from(const uint8_t *batch, size_t length, size_t offset);

#endif /* MR_BATCH_H */
