/*
 * libFuzzer target: a batch of small messages (substrates/common/mr_batch.h),
 * which the MPI and UCX substrates take apart for every batch a peer sends.
 * The input is one batch.
 *
 * The properties checked: the frame reader never reads past the batch (it
 * sees an exact copy, for ASan); every frame lies inside the batch, right
 * after its header, and frames follow each other without gaps; a refusal
 * is MR_ERR_PROTOCOL and leaves the offset and outputs untouched; the frames
 * read before the end or a refusal, packed again by the batcher, read back
 * the same (kinds, lengths, payloads; the padding may differ: the batcher
 * writes zeros, the reader ignores it).
 */
#include "mr_batch.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *batch = malloc(size ? size : 1);
    mr__batcher_t b;
    size_t off = 0;
    int r;

    memcpy(batch, data, size);
    /* One batch big enough for anything read back; the first message to rank 0 leaves alone. */
    if (mr__batcher_init(&b, 1, 1, size + 2 * MR_FRAME_HDR, size + 8) != MR_OK) abort();
    if (mr__batcher_add(&b, 0, MR_KIND_DATA, NULL, 0) != MR__BATCH_ALONE) abort();
    for (;;) {
        const uint8_t *payload = (const uint8_t *)1;
        size_t len = 12345, before = off;
        unsigned kind = 7;

        r = mr__batch_frame_next(size ? batch : NULL, size, &off, &kind, &payload, &len);
        if (r != 1) {
            if (r != 0 && r != MR_ERR_PROTOCOL) abort();
            if (off != before || (r == 0 && off != size)) abort();
            if (payload != (const uint8_t *)1 || len != 12345 || kind != 7) abort();
            break;
        }
        if (payload != batch + before + MR_FRAME_HDR ||
            off != before + mr_frame_size(len) || off > size ||
            (kind != MR_KIND_DATA && kind != MR_KIND_ITEMS && kind != MR_KIND_HANDLER)) {
            abort();
        }
        mr__batch_add_t how = mr__batcher_add(&b, 0, kind, payload, len);
        if (how == MR__BATCH_FULL) break; /* Too many frames, or another kind: enough checked. */
        if (how != MR__BATCH_ADDED) abort();
    }
    mr__batch_t *again = mr__batcher_detach(&b, 0);
    if (again != NULL) {
        size_t a = 0, o = 0;
        if (again->used > off) abort();
        for (;;) {
            const uint8_t *p1, *p2;
            size_t l1, l2;
            unsigned k1, k2;
            int r2 = mr__batch_frame_next(again->data, again->used, &a, &k2, &p2, &l2);
            if (r2 == 0) break;
            if (r2 != 1 || mr__batch_frame_next(batch, size, &o, &k1, &p1, &l1) != 1) abort();
            if (k1 != k2 || l1 != l2 || memcmp(p1, p2, l1) != 0) abort();
        }
    }
    mr__batcher_fini(&b);
    free(batch);
    return 0;
}
