/*
 * The item layer's receive side: item datagrams queued per aggregator as
 * they arrive, and pulled zero copy, one item, a batch or a block at a time.
 */
#include "items.h"
#include "items_wire.h"

/*
 * Queues an item datagram for the aggregator it names: a live one, or one
 * this rank has yet to create. One created and destroyed here already gets
 * nothing: its items are dropped with a warning.
 */
static void items_arrived(rt_msg_t msg, const uint8_t *data, size_t length, int source)
{
    uint16_t number = length >= ITEMS_WIRE_HDR_LEN ? mr__get_le16(data) : 0;
    mr_items_t *a = length >= ITEMS_WIRE_HDR_LEN ? rt_items_by_number(number) : NULL;

    if (a != NULL) {
        rt_msgq_push(&rt_items_arrivals[a->id], msg);
    } else if (length >= ITEMS_WIRE_HDR_LEN && (int16_t)(number - rt_items_created) >= 0) {
        rt_msgq_push(&rt_items_future, msg);
    } else {
        if (length < ITEMS_WIRE_HDR_LEN) {
            mr_error("Rank %d sent an item datagram of %zu bytes, shorter than its header; it "
                     "is dropped.", source, length);
        } else {
            mr_warn("Rank %d sent items to aggregator %u, which this rank has destroyed; they "
                    "are dropped.", source, number);
        }
        rt_msg_consumed(msg);
    }
}

/* Whether an item datagram waits to be pulled. */
static bool items_waiting(void)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        /* A handler waiting to send is no news: mr_wait() sleeps until progress is made. */
        if (!rt_msgq_empty(&rt_items_arrivals[i]) && !rt_items_table[i].blocked) return true;
    }
    return false;
}

/* Item handlers run per aggregator and progress call at most. */
#define RT_ITEMS_HANDLER_BURST 4096

int rt_items_nhandlers;

/* Below: the next datagram, and the next item of the current one. */
static mr_status_t items_take(mr_items_t *a);
static mr_status_t items_next(mr_items_t *a, mr_item_t *item);

/*
 * Parks the datagram being handled and those queued behind it (rt_msg_park()):
 * while the handler waits to send, their slots and credits go back.
 */
static void items_park(mr_items_t *a)
{
    if (a->cur != MR_NIL) {
        size_t length;
        const uint8_t *old = rt_msg_data(a->cur, &length, NULL);
        size_t at = (size_t)(a->pos - old);
        a->cur = rt_msg_park(a->cur);
        const uint8_t *now = rt_msg_data(a->cur, NULL, NULL);
        a->pos = now + at;
        a->end = now + length;
    }
    rt_msgq_park(&rt_items_arrivals[a->id]);
}

/*
 * Runs an aggregator's handler on its items in arrival order, until one asks
 * to be called again; a datagram goes back (counted as received) once its
 * last item is handled. Returns the number of items handled.
 */
static int items_handle(mr_items_t *a)
{
    int handled = 0;

    a->blocked = false;
    while (handled < RT_ITEMS_HANDLER_BURST) {
        if (a->pos == a->end) {
            rt_items_release_current(a);
            mr_status_t st = items_take(a);
            if (st == MR_AGAIN) break;
            if (st != MR_OK || a->pos == a->end) continue; /* Malformed (dropped), or empty. */
        }
        const uint8_t *at = a->pos;
        mr_item_t item;
        if (items_next(a, &item) != MR_OK) continue; /* Malformed: the datagram was dropped. */
        rt_state = RT_IN_HANDLER;
        mr_status_t st = a->handler(&item, a->handler_arg);
        rt_state = RT_READY;
        if (st == MR_AGAIN) {
            a->pos = at;
            rt.stats.items_pulled--;
            rt.stats.handler_retries++;
            a->blocked = true;
            items_park(a);
            break;
        }
        if (st != MR_OK) {
            mr_warn("The item handler of aggregator %u returned %d (%s); the item counts as "
                    "handled.", a->number, (int)st, mr_status_string(st));
        }
        rt.stats.handler_calls++;
        handled++;
        if (a->pos == a->end) rt_items_release_current(a);
    }
    return handled;
}

static int items_progress(void)
{
    int events = 0;

    if (rt_state != RT_READY) return 0;
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        mr_items_t *a = &rt_items_table[i];
        if (a->live && a->handler != NULL) events += items_handle(a);
    }
    return events;
}

const rt_consumer_t rt_items_consumer = {
    .arrived = items_arrived,
    .waiting = items_waiting,
};

const rt_consumer_t rt_items_consumer_handlers = {
    .arrived = items_arrived,
    .waiting = items_waiting,
    .progress = items_progress,
};

mr_status_t mr_items_handler(mr_items_t *a, mr_item_handler_t handler, void *arg)
{
    RT_ITEMS_CHECK("mr_items_handler()", a);
    rt_items_nhandlers += (handler != NULL) - (a->handler != NULL);
    a->handler = handler;
    a->blocked = false;
    a->handler_arg = handler != NULL ? arg : NULL;
    /* The progress hook costs every progress call: only while some aggregator has a handler. */
    rt_datapath_consume(MR_KIND_ITEMS,
                        rt_items_nhandlers > 0 ? &rt_items_consumer_handlers : &rt_items_consumer);
    return MR_OK;
}

/* Moves the datagrams that came early for a new aggregator into its queue. */
void rt_items_adopt_early(mr_items_t *a)
{
    rt_msgq_t keep = RT_MSGQ_INIT;

    for (rt_msg_t msg; (msg = rt_msgq_pop(&rt_items_future)) != MR_NIL;) {
        bool mine = mr__get_le16(rt_msg_data(msg, NULL, NULL)) == a->number;
        rt_msgq_push(mine ? &rt_items_arrivals[a->id] : &keep, msg);
    }
    rt_items_future = keep;
}

/* Counts the current datagram as received and gives its slot back. */
void rt_items_release_current(mr_items_t *a)
{
    if (a->cur == MR_NIL) return;
    rt_msg_consumed(a->cur);
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

/* Takes the next datagram, from the network or from oneself; no progress. */
static mr_status_t items_take(mr_items_t *a)
{
    rt_msg_t msg = rt_msgq_pop(&rt_items_arrivals[a->id]);
    const uint8_t *data;
    size_t length;

    if (msg == MR_NIL) return MR_AGAIN;
    a->cur = msg;
    a->pulls++;
    data = rt_msg_data(msg, &length, &a->cur_source);
    if (!items_header_ok(a, data, length, a->cur_source)) {
        rt_items_release_current(a);
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
    rt_items_release_current(a);
    bool waiting = !rt_msgq_empty(&rt_items_arrivals[a->id]);
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
    rt_busy();
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
            rt_items_release_current(a);
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

    RT_ITEMS_CHECK_PULL("mr_items_pull()", a);
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

    RT_ITEMS_CHECK_PULL("mr_items_pull_batch()", a);
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

    RT_ITEMS_CHECK_PULL("mr_items_pull_block()", a);
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

