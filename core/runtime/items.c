/*
 * The item layer's aggregators: their table, creation and destruction, and
 * the end of a phase (mailrail_items.h). items.h says what the three files
 * of the layer share.
 */
#include "items.h"
#include "items_wire.h"

#include <stdlib.h>
#include <string.h>

mr_items_t rt_items_table[MR_ITEMS_MAX];
rt_msgq_t rt_items_arrivals[MR_ITEMS_MAX];
rt_msgq_t rt_items_future;
uint16_t rt_items_created;

void rt_items_init(void)
{
    memset(rt_items_table, 0, sizeof(rt_items_table));
    for (int i = 0; i < MR_ITEMS_MAX; i++) rt_items_arrivals[i] = RT_MSGQ_INIT;
    rt_items_future = RT_MSGQ_INIT;
    rt_items_created = 0;
    rt_items_nhandlers = 0;
    rt_datapath_consume(MR_KIND_ITEMS, &rt_items_consumer);
}

/* The live aggregator created as `number`, or NULL. */
mr_items_t *rt_items_by_number(uint16_t number)
{
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        if (rt_items_table[i].live && rt_items_table[i].number == number) return &rt_items_table[i];
    }
    return NULL;
}

mr_status_t mr_items_end_phase(mr_items_t *a)
{
    RT_ITEMS_CHECK("mr_items_end_phase()", a);
    /*
     * The last item pulled from each aggregator may have been handled: its
     * datagram counts as received now.
     */
    for (int i = 0; i < MR_ITEMS_MAX; i++) {
        mr_items_t *b = &rt_items_table[i];
        if (b->live && b->pos == b->end) rt_items_release_current(b);
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
        if (!rt_items_table[i].live) a = &rt_items_table[i];
    }
    if (a == NULL) {
        mr_error("mr_items_create(): %d aggregators exist already (MR_ITEMS_MAX); destroy one "
                 "first.", MR_ITEMS_MAX);
        return MR_ERR_LIMIT;
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
    a->id = (uint8_t)(a - rt_items_table);
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
    a->number = rt_items_created++;
    a->live = true;
    rt_items_adopt_early(a);
    *items = a;
    return MR_OK;
}

size_t mr_items_max_size(const mr_items_t *a)
{
    return RT_LIVE() && rt_items_valid(a) ? a->max_item : 0;
}

/* Frees everything an aggregator holds; returns the datagrams that were discarded. */
static uint64_t items_discard(mr_items_t *a)
{
    uint64_t discarded = 0;

    if (a->cur != MR_NIL) {
        if (a->pos != a->end) discarded++;
        rt_items_release_current(a);
    }
    for (int dest = 0; dest < rt.size; dest++) {
        items_stage_t *st = &a->stage[dest];
        if (st->pos == NULL) continue;
        discarded++;
        rt_send_free(rt_send_slot(st->end - rt.cfg.datagram_size));
        st->pos = st->end = NULL;
    }
    for (rt_msg_t msg; (msg = rt_msgq_pop(&rt_items_arrivals[a->id])) != MR_NIL; discarded++) {
        rt_msg_consumed(msg);
    }
    free(a->listed);
    free(a->staged);
    free(a->stage);
    memset(a, 0, sizeof(*a));
    return discarded;
}

mr_status_t mr_items_destroy(mr_items_t *a)
{
    RT_ITEMS_CHECK("mr_items_destroy()", a);
    if (a->handler != NULL) mr_items_handler(a, NULL, NULL);
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
        if (rt_items_table[i].live) mr_items_destroy(&rt_items_table[i]);
    }
}

uint64_t rt_items_drop_arrivals(void)
{
    uint64_t dropped = 0;

    for (int i = 0; i <= MR_ITEMS_MAX; i++) {
        rt_msgq_t *q = i < MR_ITEMS_MAX ? &rt_items_arrivals[i] : &rt_items_future;
        for (rt_msg_t msg; (msg = rt_msgq_pop(q)) != MR_NIL; dropped++) rt_msg_drop(msg);
    }
    return dropped;
}
