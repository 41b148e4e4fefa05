/*
 * Aggregators (mailrail_items.h): items packed into datagrams per
 * destination on the send side, and handed out zero copy on the receive
 * side. docs/items.md describes the design; items_wire.h the layout.
 *
 * A staged datagram is a send-pool slot, so credits and the send pool govern
 * items exactly as they govern mr_send(). A datagram to oneself never leaves
 * its send slot: it waits in the aggregator's own queue until pulled.
 * Quiescence counts a datagram as sent when it leaves staging and as
 * received only when its last item has been pulled, so that an item handler
 * that pushes more keeps the phase open.
 */
#include "items_wire.h"
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

/* Where the items for one destination are being staged. */
typedef struct items_stage {
    uint8_t *pos;       /* Next free byte, or NULL when nothing is staged. */
    uint8_t *end;       /* End of the datagram. */
} items_stage_t;

/* Aligned to a power of two, so that checking a handle takes no division. */
struct __attribute__((aligned(128))) mr_items {
    bool live;
    uint8_t id;              /* Its place in items_table and items_arrivals. */
    uint16_t number;         /* The order of its creation: what peers address. */
    uint32_t item_size;      /* 0: variable. */
    size_t max_item;
    items_stage_t *stage;    /* Per destination. */
    int *staged;             /* Destinations with a staged datagram (maybe sent since). */
    uint8_t *listed;         /* Per destination: in staged[]. */
    int nstaged;

    /* The datagram being pulled: a receive slot, or a send slot when to oneself. */
    uint32_t cur;
    bool cur_self;
    int cur_source;
    const uint8_t *pos, *end;

    uint32_t self_head, self_tail;   /* Datagrams to oneself, linked by rt_send_t.next. */
    unsigned pulls;                  /* Datagrams taken, to pace progress. */
};

/* Aggregators live here, so that a handle is checked without dereferencing it. */
static mr_items_t items_table[MR_ITEMS_MAX];
/* Item datagrams that arrived, per place in items_table. */
static rt_queue_t items_arrivals[MR_ITEMS_MAX];
/* Item datagrams for aggregators this rank has not created yet. */
static rt_queue_t items_future;
/* Aggregators created since mr_init(): the next one's number. */
static uint16_t items_created;

static bool items_valid(const mr_items_t *a)
{
    uintptr_t off = (uintptr_t)a - (uintptr_t)items_table;

    return a != NULL && off < sizeof(items_table) && off % sizeof(*a) == 0 && a->live;
}

#define ITEMS_CHECK(fn, a)                                                                   \
    do {                                                                                     \
        RT_CHECK_READY(fn);                                                                  \
        if (!items_valid(a)) {                                                               \
            mr_error("%s: %p is not a live aggregator from mr_items_create().", fn,          \
                     (const void *)(a));                                                     \
            return MR_ERR_INVALID_PARAM;                                                     \
        }                                                                                    \
    } while (0)

void rt_items_init(void)
{
    memset(items_table, 0, sizeof(items_table));
    for (int i = 0; i < MR_ITEMS_MAX; i++) items_arrivals[i].head = items_arrivals[i].tail = MR_NIL;
    items_future.head = items_future.tail = MR_NIL;
    items_created = 0;
}

/* The live aggregator created as `number`, or NULL. */
static mr_items_t *items_by_number(uint16_t number)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (items_table[i].live && items_table[i].number == number) return &items_table[i];
    }
    return NULL;
}

/* ---- Receiving ------------------------------------------------------------------------ */

/*
 * Queues an item datagram for the aggregator it names: a live one, or one
 * this rank has yet to create. One created and destroyed here already gets
 * nothing: its items are dropped with a warning.
 */
void rt_items_arrived(uint32_t idx, int source, size_t length)
{
    const uint8_t *data = rt.recvs[idx].data;
    uint16_t number = length >= ITEMS_WIRE_HDR_LEN ? mr__get_le16(data) : 0;
    mr_items_t *a = length >= ITEMS_WIRE_HDR_LEN ? items_by_number(number) : NULL;

    if (a != NULL) {
        rt_queue_push(&items_arrivals[a->id], idx, source, length);
    } else if (length >= ITEMS_WIRE_HDR_LEN && (int16_t)(number - items_created) >= 0) {
        rt_queue_push(&items_future, idx, source, length);
    } else {
        if (length < ITEMS_WIRE_HDR_LEN) {
            mr_error("Rank %d sent an item datagram of %zu bytes, shorter than its header; it "
                     "is dropped.", source, length);
        } else {
            mr_warn("Rank %d sent items to aggregator %u, which this rank has destroyed; they "
                    "are dropped.", source, number);
        }
        rt.stats.messages_received++;
        rt_recv_release(idx);
    }
}

/* Moves the datagrams that came early for a new aggregator into its queue. */
static void items_adopt_early(mr_items_t *a)
{
    rt_queue_t keep = {MR_NIL, MR_NIL};

    for (uint32_t idx; (idx = rt_queue_pop(&items_future)) != MR_NIL;) {
        const uint8_t *data = rt.recvs[idx].data;
        rt_queue_t *q = mr__get_le16(data) == a->number ? &items_arrivals[a->id] : &keep;
        rt_queue_push(q, idx, rt.recvs[idx].source, rt.recvs[idx].length);
    }
    items_future = keep;
}

/* Counts the current datagram as received and gives its slot back. */
static void items_release_current(mr_items_t *a)
{
    if (a->cur == MR_NIL) return;
    if (a->cur_self) {
        rt.stats.messages_received++;
        rt.stats.bytes_received += rt.sends[a->cur].length;
        rt_send_free(a->cur);
    } else {
        rt.stats.messages_received++;
        rt.stats.bytes_received += rt.recvs[a->cur].length;
        rt_recv_release(a->cur);
    }
    a->cur = MR_NIL;
    a->pos = a->end = NULL;
}

/* Checks a datagram's header against the aggregator; logs a mismatch. */
static bool items_header_ok(const mr_items_t *a, const uint8_t *data, size_t length, int source)
{
    items_wire_hdr_t h;

    if (!items_wire_hdr_decode(data, length, &h)) {
        mr_error("Rank %d sent a malformed datagram of %zu bytes to aggregator %u; its items "
                 "are dropped.", source, length, a->number);
        return false;
    }
    if (h.number != a->number || h.item_size != a->item_size) {
        mr_error("Rank %d sent items of size %u to aggregator %u, which takes items of size %u "
                 "here (0: variable); create aggregators in the same order, with the same "
                 "sizes, on every rank. Its items are dropped.", source, h.item_size, h.number,
                 a->item_size);
        return false;
    }
    return true;
}

/* Takes the next datagram from the network or from oneself; no progress. */
static mr_status_t items_take(mr_items_t *a)
{
    rt_queue_t *q = &items_arrivals[a->id];
    const uint8_t *data;
    size_t length;
    int source;

    /* Both waiting: alternate, so that neither starves the other. */
    bool self = a->self_head != MR_NIL && (q->head == MR_NIL || (a->pulls & 1));
    if (self) {
        a->cur = a->self_head;
        a->self_head = rt.sends[a->cur].next;
        if (a->self_head == MR_NIL) a->self_tail = MR_NIL;
        data = mr__pool_slot(&rt.send_pool, a->cur);
        length = rt.sends[a->cur].length;
        source = rt.rank;
    } else {
        a->cur = rt_queue_pop(q);
        if (a->cur == MR_NIL) return MR_AGAIN;
        rt.recvs[a->cur].state = RECV_ITEMS;
        data = rt.recvs[a->cur].data;
        length = rt.recvs[a->cur].length;
        source = rt.recvs[a->cur].source;
    }
    a->cur_self = self;
    a->cur_source = source;
    a->pulls++;
    if (!items_header_ok(a, data, length, source)) {
        items_release_current(a);
        return MR_ERR_PROTOCOL;
    }
    a->pos = data + ITEMS_WIRE_HDR_LEN;
    a->end = data + length;
    return MR_OK;
}

/*
 * Makes sure the current datagram has an item left: releases an exhausted
 * one and takes the next, making progress when none is waiting (and every
 * 16 datagrams while they are, so that credits and sends keep moving).
 */
static mr_status_t items_ready(mr_items_t *a)
{
    mr_status_t status;

    if (a->pos != a->end) return MR_OK;
    items_release_current(a);
    bool waiting = items_arrivals[a->id].head != MR_NIL || a->self_head != MR_NIL;
    if (!waiting || (a->pulls & 15) == 0) {
        int events = rt_progress(0);
        if (events < 0) return (mr_status_t)events;
        if (rt_report_failure()) return MR_ERR_PEER_FAILED;
    }
    status = items_take(a);
    if (status == MR_AGAIN) {
        rt_idle();
        return MR_AGAIN;
    }
    rt.idle_polls = 0;
    /* A datagram may hold no item (a flush of nothing sends none, but a peer may). */
    return status == MR_OK && a->pos == a->end ? MR_AGAIN : status;
}

/* The next item of the current datagram, which has one. */
static mr_status_t items_next(mr_items_t *a, mr_item_t *item)
{
    const uint8_t *data = a->pos;
    size_t length = a->item_size;

    if (length != 0) {
        a->pos += length;
    } else {
        a->pos = items_wire_var_next(a->pos, a->end, &data, &length);
        if (a->pos == NULL) {
            mr_error("Rank %d sent a malformed variable-size item to aggregator %u; the rest "
                     "of its datagram is dropped.", a->cur_source, a->number);
            items_release_current(a);
            return MR_ERR_PROTOCOL;
        }
    }
    item->data = data;
    item->length = length;
    item->source = a->cur_source;
    rt.stats.items_pulled++;
    return MR_OK;
}

mr_status_t mr_items_pull(mr_items_t *a, mr_item_t *item)
{
    mr_status_t status;

    ITEMS_CHECK("mr_items_pull()", a);
    if (item == NULL) {
        mr_error("mr_items_pull(): the item pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    status = items_ready(a);
    return status == MR_OK ? items_next(a, item) : status;
}

mr_status_t mr_items_pull_batch(mr_items_t *a, mr_item_t *out, size_t max, size_t *count)
{
    mr_status_t status;
    size_t n = 0;

    ITEMS_CHECK("mr_items_pull_batch()", a);
    if (out == NULL || count == NULL || max == 0) {
        mr_error("mr_items_pull_batch(): NULL output or a maximum of 0 items.");
        return MR_ERR_INVALID_PARAM;
    }
    *count = 0;
    status = items_ready(a);
    while (status == MR_OK && n < max && a->pos != a->end) {
        status = items_next(a, &out[n]);
        if (status == MR_OK) n++;
    }
    /* A malformed item ends the batch; the items before it are good. */
    if (n > 0) status = MR_OK;
    *count = n;
    return status;
}

mr_status_t mr_items_pull_block(mr_items_t *a, const void **data, size_t *count, int *source)
{
    mr_status_t status;

    ITEMS_CHECK("mr_items_pull_block()", a);
    if (a->item_size == 0 || data == NULL || count == NULL || source == NULL) {
        mr_error("mr_items_pull_block(): %s.", a->item_size == 0
                     ? "the aggregator takes variable-size items; use mr_items_pull_batch()"
                     : "an output pointer is NULL");
        return MR_ERR_INVALID_PARAM;
    }
    status = items_ready(a);
    if (status != MR_OK) return status;
    size_t n = (size_t)(a->end - a->pos) / a->item_size;
    *data = a->pos;
    *count = n;
    *source = a->cur_source;
    a->pos = a->end;
    rt.stats.items_pulled += n;
    return MR_OK;
}

/* ---- Sending -------------------------------------------------------------------------- */

/*
 * Sends the datagram staged for `dest`: to the substrate, or to the
 * aggregator's own queue when `dest` is this rank. Counted as sent.
 */
static mr_status_t items_send_staged(mr_items_t *a, int dest)
{
    items_stage_t *st = &a->stage[dest];
    uint8_t *base = st->end - rt.cfg.datagram_size;
    uint32_t idx = mr__pool_index(&rt.send_pool, base);
    size_t length = (size_t)(st->pos - base);
    mr_status_t status = MR_OK;

    st->pos = st->end = NULL;
    if (dest == rt.rank) {
        rt.sends[idx].state = SEND_LOCAL;
        rt.sends[idx].length = (uint32_t)length;
        rt.sends[idx].next = MR_NIL;
        if (a->self_tail == MR_NIL) a->self_head = idx;
        else rt.sends[a->self_tail].next = idx;
        a->self_tail = idx;
        rt.stats.messages_sent++;
        rt.stats.bytes_sent += length;
    } else {
        status = rt_submit(idx, length, dest, MR_KIND_ITEMS);
        /* The destination failed since the items were pushed: they are lost with it. */
        if (status != MR_OK) rt_send_free(idx);
    }
    return status;
}

/* Sends every staged datagram of an aggregator. */
static void items_flush(mr_items_t *a)
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
        mr_items_t *a = &items_table[i];
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
    uint32_t idx = rt_send_bytes_full() ? MR_NIL : mr__pool_get(&rt.send_pool);
    uint8_t *base;

    if (idx == MR_NIL) {
        rt.stats.reserve_failures++;
        items_send_fullest();
        return MR_AGAIN;
    }
    rt.sends[idx].state = SEND_RESERVED;
    base = mr__pool_slot(&rt.send_pool, idx);
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

    ITEMS_CHECK("mr_items_push()", a);
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
    if (rt_state == RT_READY && items_valid(a) && length == a->item_size && length != 0 &&
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

mr_status_t mr_items_flush(mr_items_t *a)
{
    ITEMS_CHECK("mr_items_flush()", a);
    items_flush(a);
    return MR_OK;
}

void rt_items_flush_all(void)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (items_table[i].live) items_flush(&items_table[i]);
    }
}

mr_status_t mr_items_end_phase(mr_items_t *a)
{
    ITEMS_CHECK("mr_items_end_phase()", a);
    /*
     * The last item pulled from each aggregator may have been handled: its
     * datagram counts as received now.
     */
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        mr_items_t *b = &items_table[i];
        if (b->live && b->pos == b->end) items_release_current(b);
    }
    rt_items_flush_all();
    return mr_quiesce();
}

/* ---- Creating and destroying --------------------------------------------------------- */

mr_status_t mr_items_create(size_t item_size, mr_items_t **items)
{
    mr_items_t *a = NULL;
    size_t room;

    RT_CHECK_READY("mr_items_create()");
    if (items == NULL) {
        mr_error("mr_items_create(): the output pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    room = rt.cfg.datagram_size - ITEMS_WIRE_HDR_LEN;
    if (item_size > room) {
        mr_error("mr_items_create(): items of %zu bytes do not fit a datagram of %zu bytes "
                 "with its %d-byte header (MAILRAIL_DATAGRAM_SIZE).", item_size,
                 (size_t)rt.cfg.datagram_size, ITEMS_WIRE_HDR_LEN);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    for (int i = 0; i < MR_ITEMS_MAX && a == NULL; i++) {
        if (!items_table[i].live) a = &items_table[i];
    }
    if (a == NULL) {
        mr_error("mr_items_create(): %d aggregators exist already (MR_ITEMS_MAX).",
                 MR_ITEMS_MAX);
        return MR_ERR_NO_MEMORY;
    }
    memset(a, 0, sizeof(*a));
    a->stage = calloc((size_t)rt.size, sizeof(*a->stage));
    a->staged = calloc((size_t)rt.size, sizeof(*a->staged));
    a->listed = calloc((size_t)rt.size, sizeof(*a->listed));
    if (a->stage == NULL || a->staged == NULL || a->listed == NULL) {
        free(a->listed);
        free(a->staged);
        free(a->stage);
        mr_error("mr_items_create(): cannot allocate the staging table of %d ranks.", rt.size);
        return MR_ERR_NO_MEMORY;
    }
    a->id = (uint8_t)(a - items_table);
    a->item_size = (uint32_t)item_size;
    if (item_size != 0) {
        a->max_item = item_size;
    } else {
        /* The longest item whose length and bytes fill a datagram. */
        a->max_item = room - items_wire_len_size(room);
        if (a->max_item > ITEMS_WIRE_VAR_MAX) a->max_item = ITEMS_WIRE_VAR_MAX;
        if (items_wire_len_size(a->max_item) + a->max_item > room) a->max_item--;
    }
    a->cur = MR_NIL;
    a->self_head = a->self_tail = MR_NIL;
    a->number = items_created++;
    a->live = true;
    items_adopt_early(a);
    *items = a;
    return MR_OK;
}

size_t mr_items_max_size(const mr_items_t *a)
{
    return rt_state == RT_READY && items_valid(a) ? a->max_item : 0;
}

/* Frees everything an aggregator holds; returns the datagrams that were discarded. */
static uint64_t items_discard(mr_items_t *a)
{
    uint64_t discarded = 0;

    if (a->cur != MR_NIL) {
        if (a->pos != a->end) discarded++;
        items_release_current(a);
    }
    for (int dest = 0; dest < rt.size; dest++) {
        items_stage_t *st = &a->stage[dest];
        if (st->pos == NULL) continue;
        discarded++;
        rt_send_free(mr__pool_index(&rt.send_pool, st->end - rt.cfg.datagram_size));
        st->pos = st->end = NULL;
    }
    while (a->self_head != MR_NIL) {
        a->cur = a->self_head;
        a->cur_self = true;
        a->self_head = rt.sends[a->cur].next;
        items_release_current(a);
        discarded++;
    }
    for (uint32_t idx; (idx = rt_queue_pop(&items_arrivals[a->id])) != MR_NIL;) {
        rt.stats.messages_received++;
        rt_recv_release(idx);
        discarded++;
    }
    free(a->listed);
    free(a->staged);
    free(a->stage);
    memset(a, 0, sizeof(*a));
    return discarded;
}

mr_status_t mr_items_destroy(mr_items_t *a)
{
    ITEMS_CHECK("mr_items_destroy()", a);
    unsigned number = a->number;
    uint64_t discarded = items_discard(a);
    if (discarded > 0) {
        mr_warn("mr_items_destroy(): aggregator %u still had %llu datagrams of items staged, "
                "arrived or being pulled; they are discarded.", number,
                (unsigned long long)discarded);
    }
    return MR_OK;
}

void rt_items_fini(void)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (items_table[i].live) mr_items_destroy(&items_table[i]);
    }
}

bool rt_items_waiting(void)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (items_arrivals[i].head != MR_NIL) return true;
        if (items_table[i].live && items_table[i].self_head != MR_NIL) return true;
    }
    return false;
}

uint64_t rt_items_drop_arrivals(void)
{
    uint64_t dropped = 0;

    for (int i = 0; i <= MR_ITEMS_MAX; i++) {
        rt_queue_t *q = i < MR_ITEMS_MAX ? &items_arrivals[i] : &items_future;
        for (uint32_t idx; (idx = rt_queue_pop(q)) != MR_NIL;) {
            rt_recv_release(idx);
            dropped++;
        }
    }
    return dropped;
}
