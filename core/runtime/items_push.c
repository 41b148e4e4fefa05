/*
 * The item layer's send side: items copied into a datagram staged per
 * destination in a send-pool slot, sent when full, on a flush, or when the
 * pool runs short.
 */
#include "items.h"
#include "items_wire.h"

#include <string.h>

/*
 * Sends the datagram staged for `dest`: to the substrate, or to the
 * aggregator's own queue when `dest` is this rank. Counted as sent.
 */
__attribute__((noinline)) static mr_status_t items_send_staged(mr_items_t *a, int dest)
{
    items_stage_t *st = &a->stage[dest];
    uint8_t *base = st->end - rt.cfg.datagram_size;
    uint32_t slot = rt_send_slot(base);
    size_t length = (size_t)(st->pos - base);
    mr_status_t status = MR_OK;

    st->pos = st->end = NULL;
    if (dest == rt.rank) {
        rt_submit_local(slot, length, MR_KIND_ITEMS);
    } else {
        status = rt_submit(slot, length, dest, MR_KIND_ITEMS);
        /* The destination failed since the items were pushed: they are lost with it. */
        if (status != MR_OK) rt_send_free(slot);
    }
    return status;
}

/* Sends every staged datagram of an aggregator. */
void rt_items_flush(mr_items_t *a)
{
    for (int i = 0; i < a->nstaged; i++) {
        int dest = a->staged[i];
        a->listed[dest] = 0;
        if (a->stage[dest].pos != NULL) items_send_staged(a, dest);
    }
    a->nstaged = 0;
}

/*
 * Partly filled datagrams hold send slots, and with more destinations than
 * slots they may hold them all: sends the fullest datagram of any aggregator,
 * so that its slot frees up while the others go on filling.
 */
static void items_send_fullest(void)
{
    mr_items_t *best = NULL;
    int best_dest = -1;
    size_t best_fill = 0;

    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        mr_items_t *a = &rt_items_table[i];
        if (!a->live) continue;
        for (int k = 0; k < a->nstaged; k++) {
            const items_stage_t *st = &a->stage[a->staged[k]];
            size_t fill = st->pos == NULL ? 0 : rt.cfg.datagram_size - (size_t)(st->end - st->pos);
            if (fill > best_fill) {
                best = a;
                best_dest = a->staged[k];
                best_fill = fill;
            }
        }
    }
    if (best != NULL) items_send_staged(best, best_dest);
}

/* Starts a datagram for `dest` in a free send slot; MR_AGAIN when none is free. */
static mr_status_t items_stage_open(mr_items_t *a, int dest)
{
    uint32_t idx = rt_send_take();
    uint8_t *base;

    if (idx == MR_NIL) {
        items_send_fullest();
        return MR_AGAIN;
    }
    base = rt_send_buffer(idx);
    items_wire_hdr_encode(base, a->number, a->item_size);
    a->stage[dest].pos = base + ITEMS_WIRE_HDR_LEN;
    a->stage[dest].end = base + rt.cfg.datagram_size;
    if (!a->listed[dest]) {
        a->listed[dest] = 1;
        a->staged[a->nstaged++] = dest;
    }
    return MR_OK;
}

/* Why a push is refused, logged; MR_OK when it is acceptable. */
static mr_status_t items_push_check(const mr_items_t *a, const void *item, size_t length,
                                    int dest)
{
    if (dest < 0 || dest >= rt.size) {
        mr_error("mr_items_push(): destination %d is not in [0, %d).", dest, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    if (length > a->max_item) {
        mr_error("mr_items_push(): an item of %zu bytes; this aggregator takes at most %zu.",
                 length, a->max_item);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    if (a->item_size != 0 && length != a->item_size) {
        mr_error("mr_items_push(): an item of %zu bytes; this aggregator takes items of %u.",
                 length, a->item_size);
        return MR_ERR_INVALID_PARAM;
    }
    if (item == NULL && length > 0) {
        mr_error("mr_items_push(): the item pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    return rt.peer[dest] == PEER_OK ? MR_OK : MR_ERR_PEER_FAILED;
}

/*
 * Copies an item with moves the compiler inlines: a library call would make
 * the push's fast path save registers on every call.
 */
static inline void items_copy(uint8_t *to, const void *item, size_t length)
{
    const uint8_t *from = item;
    size_t k = 0;

    switch (length) {
    case 4: memcpy(to, from, 4); return;
    case 8: memcpy(to, from, 8); return;
    case 16: memcpy(to, from, 16); return;
    default: break;
    }
    for (; k + 8 <= length; k += 8) memcpy(to + k, from + k, 8);
    for (; k < length; k++) to[k] = from[k];
}

/* Every push the fast path does not take: checks, and a new datagram when needed. */
static __attribute__((noinline)) mr_status_t items_push_slow(mr_items_t *a, const void *item,
                                                             size_t length, int dest)
{
    items_stage_t *st;
    mr_status_t status;

    RT_ITEMS_CHECK_SEND("mr_items_push()", a);
    status = items_push_check(a, item, length, dest);
    if (status != MR_OK) return status;
    st = &a->stage[dest];
    size_t need = length + (a->item_size == 0 ? items_wire_len_size(length) : 0);
    if (st->pos != NULL && need > (size_t)(st->end - st->pos)) {
        status = items_send_staged(a, dest);
        if (status != MR_OK) return status;
    }
    if (st->pos == NULL) {
        status = items_stage_open(a, dest);
        if (status != MR_OK) return status;
    }
    if (a->item_size == 0) st->pos = items_wire_len_put(st->pos, length);
    if (length > 0) items_copy(st->pos, item, length);
    st->pos += length;
    rt.stats.items_pushed++;
    /* Full: no item of this size fits any more, so send it now. */
    if (a->item_size != 0 ? (size_t)(st->end - st->pos) < length : st->pos == st->end) {
        return items_send_staged(a, dest);
    }
    return MR_OK;
}

mr_status_t mr_items_push(mr_items_t *a, const void *item, size_t length, int dest)
{
    /*
     * The common case, kept small so that it needs no stack frame: a
     * fixed-size item for a live destination whose datagram is open, which
     * always has room for one more (a full one leaves at once).
     */
    if (RT_LIVE() && rt_items_valid(a) &&
        length == a->item_size && length != 0 &&
        item != NULL && (unsigned)dest < (unsigned)rt.size) {
        items_stage_t *st = &a->stage[dest];
        uint8_t *pos = st->pos;
        if (pos != NULL && rt.peer[dest] == PEER_OK) {
            items_copy(pos, item, length);
            st->pos = pos += length;
            rt.stats.items_pushed++;
            if ((size_t)(st->end - pos) < length) return items_send_staged(a, dest);
            return MR_OK;
        }
    }
    return items_push_slow(a, item, length, dest);
}

/*
 * The run of mr_items_push_many(): fixed-size items, staged while their
 * destination's datagram is open (the common case), the rest through the
 * slow path. Inlined with a constant length where it matters (8 bytes).
 */
__attribute__((always_inline)) static inline size_t
items_push_run(mr_items_t *a, const uint8_t *item, size_t count, const int *dests, size_t length,
               mr_status_t *status)
{
    const unsigned nranks = (unsigned)rt.size;
    uint64_t fast = 0;
    size_t k = 0;

    *status = MR_OK;
    for (; k < count; k++, item += length) {
        unsigned dest = (unsigned)dests[k];
        items_stage_t *st;
        if (dest < nranks && (st = &a->stage[dest])->pos != NULL && rt.peer[dest] == PEER_OK) {
            items_copy(st->pos, item, length);
            st->pos += length;
            fast++;
            if ((size_t)(st->end - st->pos) < length) {
                *status = items_send_staged(a, (int)dest);
                if (*status != MR_OK) {
                    k++; /* Pushed; its datagram was lost with its failed destination. */
                    break;
                }
            }
            continue;
        }
        *status = items_push_slow(a, item, length, (int)dest);
        if (*status != MR_OK) break;
    }
    rt.stats.items_pushed += fast;
    return k;
}

mr_status_t mr_items_push_many(mr_items_t *a, const void *data, size_t count, const int *dests,
                               size_t *pushed)
{
    RT_ITEMS_CHECK_SEND("mr_items_push_many()", a);
    if (pushed == NULL || (count > 0 && (data == NULL || dests == NULL)) || a->item_size == 0) {
        mr_error("mr_items_push_many(): %s.", a->item_size == 0
                     ? "the aggregator takes variable-size items; push them one by one"
                     : "NULL output, items or destinations");
        return MR_ERR_INVALID_PARAM;
    }
    mr_status_t status;
    *pushed = a->item_size == 8 ? items_push_run(a, data, count, dests, 8, &status)
                                : items_push_run(a, data, count, dests, a->item_size, &status);
    return status;
}

mr_status_t mr_items_flush(mr_items_t *a)
{
    RT_ITEMS_CHECK_SEND("mr_items_flush()", a);
    rt_items_flush(a);
    return MR_OK;
}

void rt_items_flush_all(void)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (rt_items_table[i].live) rt_items_flush(&rt_items_table[i]);
    }
}

