/*
 * MailRail items: fine-grained messages, aggregated.
 *
 * Graph codes, histograms and Mixture-of-Experts dispatch send millions of
 * items of a few bytes each. An aggregator packs the items pushed to each
 * rank densely into datagrams (mailrail.h), sends them through the same send
 * pool, flow control and substrate as mr_send(), and hands the received
 * items out one by one or in batches, zero copy. Items to oneself never
 * touch the substrate. docs/items.md has a complete example.
 *
 * The cycle of a phase:
 *
 *     mr_items_t *a;
 *     mr_items_create(sizeof(uint64_t), &a);
 *     for (each item) {
 *         while (mr_items_push(a, &item, sizeof item, owner(item)) == MR_AGAIN)
 *             drain(a);                     // backpressure: pull, then retry
 *     }
 *     do {
 *         drain(a);                         // while (mr_items_pull(a, &it) == MR_OK) ...
 *     } while (mr_items_end_phase(a) == MR_AGAIN);
 *     mr_items_destroy(a);
 *
 * An item handler may push further items (a traversal's next frontier); the
 * phase ends only when those have been pulled too.
 *
 * Aggregators are matched between ranks by the order of creation: the n-th
 * aggregator a rank creates sends to the n-th of every other rank, so every
 * rank creates (and destroys) its aggregators in the same order, with the
 * same item size. Items that reach a rank before it has created their
 * aggregator wait for it. At most MR_ITEMS_MAX exist at once.
 *
 * Order: items one rank pushes to another through one aggregator are pulled
 * there in the order they were pushed (their datagrams keep mr_send()'s
 * per-destination order); items from different sources interleave in
 * arrival order. Like the rest of MailRail, call these functions from one
 * thread (mailrail.h, "Threads").
 */
#ifndef MAILRAIL_ITEMS_H
#define MAILRAIL_ITEMS_H

#include "mailrail.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Aggregators alive at once, per process. */
#define MR_ITEMS_MAX 16

/* The item size that makes an aggregator take items of any length. */
#define MR_ITEMS_VARIABLE 0

typedef struct mr_items mr_items_t;

/* One received item. */
typedef struct mr_item {
    const void *data; /* Inside a received datagram: valid until the next pull,
                         mr_items_end_phase() or mr_items_destroy() on the same
                         aggregator. Not aligned for variable-size items. */
    size_t length;    /* In bytes. */
    int source;       /* Rank that pushed it. */
} mr_item_t;

/*
 * Creates an aggregator of items of `item_size` bytes each, or of any length
 * from 0 to mr_items_max_size() with MR_ITEMS_VARIABLE. No communication:
 * but a rank's datagrams reach the aggregator created in the same position
 * on the other ranks, so create them in the same order everywhere.
 *
 * Fixed-size items are packed back to back after an 8-byte datagram header:
 * items whose size is a multiple of 8 start 8-byte aligned. Variable-size
 * items take one to three more bytes for their length.
 *
 * Returns:
 *   MR_OK                    *items is the new aggregator.
 *   MR_ERR_MESSAGE_TOO_LONG  `item_size` does not fit a datagram with its header
 *                            (mr_datagram_size() - 8 bytes at most).
 *   MR_ERR_LIMIT             MR_ITEMS_MAX aggregators exist: destroy one first.
 *   MR_ERR_NO_MEMORY         the staging table could not be allocated.
 *   MR_ERR_INVALID_PARAM     `items` is NULL.
 *   MR_ERR_NOT_INITIALIZED   called before mr_init() or after mr_finalize().
 * *items is written only on MR_OK.
 */
MR_API mr_status_t mr_items_create(size_t item_size, mr_items_t **items);

/*
 * Destroys an aggregator. Items still staged, in flight to it, or not yet
 * pulled are discarded, and a warning gives their number: end the phase
 * first. Items that reach it later are dropped with a warning.
 * mr_finalize() destroys the aggregators that are left.
 *
 * Returns MR_OK, MR_ERR_INVALID_PARAM (not a live aggregator) or
 * MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_items_destroy(mr_items_t *items);

/* The largest item an aggregator takes, or 0 when `items` is not valid. */
MR_API size_t mr_items_max_size(const mr_items_t *items);

/*
 * Copies an item of `length` bytes into the datagram staged for rank `dest`.
 * A datagram that is full is sent at once; the others leave on
 * mr_items_flush() or mr_items_end_phase(). Never blocks.
 *
 * Returns:
 *   MR_OK                    the item will be delivered once.
 *   MR_AGAIN                 backpressure: no send buffer is free for `dest`'s
 *                            next datagram. The fullest partly filled datagram
 *                            (of any aggregator) is sent to free one. Pull
 *                            (which makes progress) and push the item again.
 *                            Datagrams fill best with more send slots
 *                            (MAILRAIL_SEND_SLOTS) than destinations.
 *   MR_ERR_INVALID_RANK      `dest` is not in [0, mr_size()).
 *   MR_ERR_MESSAGE_TOO_LONG  `length` is larger than mr_items_max_size().
 *   MR_ERR_INVALID_PARAM     `length` differs from a fixed item size, `item` is
 *                            NULL with a nonzero length, or `items` is not valid.
 *   MR_ERR_PEER_FAILED       rank `dest` has failed.
 *   MR_ERR_NOT_INITIALIZED   called before mr_init() or after mr_finalize().
 */
MR_API mr_status_t mr_items_push(mr_items_t *items, const void *item, size_t length, int dest);

/*
 * Pushes `count` items of the aggregator's fixed size, packed back to back at
 * `data`, the k-th to rank dests[k], in order: what `count` calls of
 * mr_items_push() would do, with the checks made once per call and per
 * datagram instead of per item (the bulk path of a histogram or an edge
 * exchange). Sets *pushed to how many went in.
 *
 * Returns MR_OK (all of them), MR_AGAIN (backpressure, as for mr_items_push():
 * make progress and push the rest, from data + *pushed items on), or the
 * error of mr_items_push() for the item at *pushed, those before it pushed;
 * MR_ERR_INVALID_PARAM also for a NULL `pushed`, NULL `data` or `dests` with a
 * nonzero count, or an aggregator of variable-size items.
 */
MR_API mr_status_t mr_items_push_many(mr_items_t *items, const void *data, size_t count,
                                      const int *dests, size_t *pushed);

/*
 * Makes progress like mr_receive() and returns the next received item, zero
 * copy. Items from one datagram come in the order they were pushed.
 *
 * Returns:
 *   MR_OK                    *item holds an item.
 *   MR_AGAIN                 no item now.
 *   MR_ERR_PEER_FAILED       a peer failed (once per failed peer, as mr_receive()).
 *   MR_ERR_PROTOCOL          a datagram did not match this aggregator (a rank
 *                            created aggregators in another order or with another
 *                            size) or was malformed: the log says which, and its
 *                            items are discarded. Later calls go on.
 *   MR_ERR_TRANSPORT         the substrate failed locally.
 *   MR_ERR_INVALID_PARAM     `item` is NULL, or `items` is not valid.
 *   MR_ERR_NOT_INITIALIZED   called before mr_init() or after mr_finalize().
 * *item is written only on MR_OK.
 */
MR_API mr_status_t mr_items_pull(mr_items_t *items, mr_item_t *item);

/*
 * Like mr_items_pull(), for up to `max` items at once, all from one datagram
 * (so possibly fewer than are waiting). *count is set to the number of items
 * written to out[], 1 or more on MR_OK, 0 otherwise. All of them stay valid
 * until the next pull on this aggregator.
 */
MR_API mr_status_t mr_items_pull_batch(mr_items_t *items, mr_item_t *out, size_t max,
                                       size_t *count);

/*
 * For fixed-size items: the received items of one datagram that are not yet
 * pulled, as one array of *count items of the aggregator's size from rank
 * *source, starting at *data. The fastest way to consume items: no per-item
 * call. The array stays valid until the next pull on this aggregator.
 * Returns what mr_items_pull() does, and MR_ERR_INVALID_PARAM for a
 * variable-size aggregator or a NULL output. The outputs are written only
 * on MR_OK.
 */
MR_API mr_status_t mr_items_pull_block(mr_items_t *items, const void **data, size_t *count,
                                       int *source);

/*
 * Sends every partly filled datagram of this aggregator now (items to
 * oneself become pullable). Needs no send buffer, so it never returns
 * MR_AGAIN.
 *
 * Returns MR_OK, MR_ERR_INVALID_PARAM or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_items_flush(mr_items_t *items);

/*
 * Called with each item of an aggregator that has a handler. Returns MR_OK
 * when done with it, or MR_AGAIN to be called again later with the same item
 * (the rest of its datagram waits, in its receive slot). Any other status is
 * logged and counts as done. `item` is valid until the handler returns.
 */
typedef mr_status_t (*mr_item_handler_t)(const mr_item_t *item, void *arg);

/*
 * Gives an aggregator a handler (NULL: none, pulls again): its items then run
 * through it in progress (mr_poll(), mr_receive(), mr_wait(), mr_quiesce(),
 * mr_items_end_phase()), in arrival order, instead of being pulled; the
 * pulls return MR_ERR_INVALID_PARAM. Inside an item handler, as inside a
 * message handler (mailrail.h), only sends and pushes are allowed. A
 * datagram counts as received for quiescence when the handler of its last
 * item returns. Returns MR_OK, MR_ERR_INVALID_PARAM (not a live aggregator),
 * MR_ERR_IN_HANDLER or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_items_handler(mr_items_t *items, mr_item_handler_t handler, void *arg);

/*
 * Ends a phase. Collective and non-blocking, like mr_quiesce(), which it
 * includes: call it repeatedly, pulling in between, until it returns MR_OK.
 * It flushes every aggregator on each call. MR_OK means that every item
 * pushed by any rank before, on any aggregator, and every item pushed in
 * reaction to those, has been pulled, and every datagram sent with mr_send()
 * has been returned by mr_receive(). All ranks see MR_OK in the same round.
 *
 * Returns MR_OK, MR_AGAIN, and the errors of mr_quiesce() and of
 * MR_ERR_INVALID_PARAM for an invalid aggregator.
 */
MR_API mr_status_t mr_items_end_phase(mr_items_t *items);

#ifdef __cplusplus
}
#endif

#endif /* MAILRAIL_ITEMS_H */
