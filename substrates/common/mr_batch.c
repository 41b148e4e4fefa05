/*
 * Coalescing small messages into one transport message (mr_batch.h).
 */
#include "mr_batch.h"

#include <stdlib.h>
#include <string.h>

mr_status_t mr__batcher_init(mr__batcher_t *b, int nranks, unsigned nbatches, size_t cap,
                             size_t max_bytes)
{
    memset(b, 0, sizeof(*b));
    if (max_bytes == 0 || nbatches == 0 || cap < MR_FRAME_HDR + MR_FRAME_ALIGN ||
        nranks <= 0) {
        return MR_OK; /* Off. */
    }
    b->cap = cap;
    /* The largest payload whose frame, padding included, fits a batch. */
    size_t fits = (cap - MR_FRAME_HDR) & ~(size_t)(MR_FRAME_ALIGN - 1);
    b->max_frame = max_bytes < fits ? max_bytes : fits;
    b->nbatches = nbatches;
    b->batches = calloc(nbatches, sizeof(*b->batches));
    b->memory = malloc((size_t)nbatches * cap);
    b->open = calloc((size_t)nranks, sizeof(*b->open));
    b->win = calloc((size_t)nranks, sizeof(*b->win));
    b->open_ranks = malloc((size_t)nranks * sizeof(*b->open_ranks));
    b->last_epoch = calloc((size_t)nranks, sizeof(*b->last_epoch));
    if (b->batches == NULL || b->memory == NULL || b->open == NULL || b->win == NULL || b->open_ranks == NULL ||
        b->last_epoch == NULL) {
        mr__batcher_fini(b);
        return MR_ERR_NO_MEMORY;
    }
    for (unsigned i = nbatches; i-- > 0;) {
        mr__batch_t *batch = &b->batches[i];
        batch->data = b->memory + (size_t)i * cap;
        batch->dest = -1;
        batch->next_free = b->free_list;
        b->free_list = batch;
    }
    b->epoch = 1; /* last_epoch starts at 0: no rank has had a message yet. */
    return MR_OK;
}

void mr__batcher_fini(mr__batcher_t *b)
{
    free(b->batches);
    free(b->memory);
    free(b->open);
    free(b->win);
    free(b->open_ranks);
    free(b->last_epoch);
    memset(b, 0, sizeof(*b));
}

mr__batch_add_t mr__batcher_add(mr__batcher_t *b, int dest, unsigned kind, const void *data,
                                size_t length)
{
    mr__batch_t *batch;

    if (length > b->max_frame) return MR__BATCH_ALONE; /* Also when coalescing is off. */
    if (b->open[dest] == NULL) {
        /*
         * The first message since the last progress call leaves at once, and
         * so does one when no batch is free (noted as the first as well).
         */
        if (mr__batcher_first_in_epoch(b, dest) || b->free_list == NULL) {
            b->last_epoch[dest] = b->epoch;
            return MR__BATCH_ALONE;
        }
        batch = b->free_list;
        b->free_list = batch->next_free;
        batch->dest = dest;
        b->open[dest] = batch;
        b->open_ranks[b->nopen++] = dest;
        b->win[dest] = (mr_append_window_t){.pos = batch->data, .room = (uint32_t)b->cap,
                                            .frames = MR__BATCH_MAX_FRAMES,
                                            .kind = (uint16_t)kind};
    }
    return mr_append_window_put(&b->win[dest], kind, data, length) ? MR__BATCH_ADDED
                                                                    : MR__BATCH_FULL;
}

mr_status_t mr__batcher_route_slow(mr__batcher_t *b, int dest, unsigned kind, uint32_t imm,
                                   const void *data, size_t length,
                                   mr_status_t (*send_batch)(void *ctx, int dest), void *ctx,
                                   bool *packed)
{
    mr_status_t st;

    *packed = false;
    if (imm == 0) {
        /* Credits ride on a message of their own: only a message without any is packed. */
        mr__batch_add_t how = mr__batcher_add(b, dest, kind, data, length);
        if (how == MR__BATCH_FULL) {
            st = send_batch(ctx, dest);
            if (st != MR_OK) return st;
            how = mr__batcher_add(b, dest, kind, data, length);
        }
        if (how == MR__BATCH_ADDED) {
            *packed = true;
            return MR_OK;
        }
    }
    return b->open[dest] != NULL ? send_batch(ctx, dest) : MR_OK;
}

mr__batch_t *mr__batcher_detach(mr__batcher_t *b, int dest)
{
    mr__batch_t *batch = b->open[dest];

    if (batch == NULL) return NULL;
    batch->used = mr__batcher_used(b, dest);
    batch->nframes = MR__BATCH_MAX_FRAMES - b->win[dest].frames;
    b->added += batch->nframes;
    b->win[dest] = (mr_append_window_t){0};
    b->open[dest] = NULL;
    for (unsigned i = 0; i < b->nopen; i++) {
        if (b->open_ranks[i] == dest) {
            b->open_ranks[i] = b->open_ranks[--b->nopen];
            break;
        }
    }
    return batch;
}

void mr__batcher_release(mr__batcher_t *b, mr__batch_t *batch)
{
    batch->dest = -1;
    batch->next_free = b->free_list;
    b->free_list = batch;
}

int mr__batch_frame_next(const uint8_t *batch, size_t length, size_t *offset, unsigned *kind,
                         const uint8_t **payload, size_t *payload_len)
{
    size_t off = *offset, size;
    uint32_t hdr = 0;

    if (off == length) return 0;
    size = mr_frame_read(batch + off, length - off, &hdr);
    if (size == 0) return MR_ERR_PROTOCOL;
    switch (hdr & MR_FRAME_KIND_BITS) {
    case 0: *kind = MR_KIND_DATA; break;
    case MR_FRAME_ITEMS_BIT: *kind = MR_KIND_ITEMS; break;
    case MR_FRAME_HANDLER_BIT: *kind = MR_KIND_HANDLER; break;
    default: return MR_ERR_PROTOCOL;
    }
    *payload = batch + off + MR_FRAME_HDR;
    *payload_len = hdr & ~MR_FRAME_KIND_BITS;
    *offset = off + size;
    return 1;
}

size_t mr__batch_frames_from(const uint8_t *batch, size_t length, size_t offset)
{
    size_t frames = 0, payload_len;
    const uint8_t *payload;
    unsigned kind;

    while (mr__batch_frame_next(batch, length, &offset, &kind, &payload, &payload_len) == 1) {
        frames++;
    }
    return frames;
}
