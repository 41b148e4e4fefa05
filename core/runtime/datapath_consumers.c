/*
 * What the datapath offers the layers that consume a message kind (the item
 * layer, handlers): registration, message handles and their queues,
 * datagrams to oneself handed over without a copy, and parking (datapath.h).
 */
#include "datapath_state.h"

#include <stdlib.h>
#include <string.h>

/* The link of a message handle: in its receive slot, its send slot, or its parked copy. */
static inline uint32_t *dp_msg_next(rt_msg_t msg)
{
    if (msg & RT_MSG_LOCAL) return &dp.sends[msg & RT_MSG_INDEX].next;
    if (msg & RT_MSG_PARKED) return &dp.parked[msg & RT_MSG_INDEX]->next;
    return &dp.recvs[msg].next;
}

static void dp_msgq_push(rt_msgq_t *q, rt_msg_t msg)
{
    *dp_msg_next(msg) = MR_NIL;
    if (q->tail == MR_NIL) q->head = msg;
    else *dp_msg_next(q->tail) = msg;
    q->tail = msg;
}

static rt_msg_t dp_msgq_pop(rt_msgq_t *q)
{
    rt_msg_t msg = q->head;

    if (msg == MR_NIL) return MR_NIL;
    q->head = *dp_msg_next(msg);
    if (q->head == MR_NIL) q->tail = MR_NIL;
    if (msg == q->parked) q->parked = MR_NIL;
    return msg;
}

void rt_datapath_consume(unsigned kind, const rt_consumer_t *consumer)
{
    if (kind == MR_KIND_DATA || kind >= sizeof(dp.consumers) / sizeof(dp.consumers[0])) return;
    dp.consumers[kind] = consumer;
    dp.nconsumer_progress = 0;
    for (size_t k = 0; k < sizeof(dp.consumers) / sizeof(dp.consumers[0]); k++) {
        if (dp.consumers[k] != NULL && dp.consumers[k]->progress != NULL) {
            dp.consumer_progress[dp.nconsumer_progress++] = dp.consumers[k]->progress;
        }
    }
}

void rt_msgq_push(rt_msgq_t *q, rt_msg_t msg)
{
    dp_msgq_push(q, msg);
}

rt_msg_t rt_msgq_pop(rt_msgq_t *q)
{
    return dp_msgq_pop(q);
}

const uint8_t *rt_msg_data(rt_msg_t msg, size_t *length, int *source)
{
    if (msg & RT_MSG_PARKED) {
        const dp_parked_t *p = dp.parked[msg & RT_MSG_INDEX];
        if (length != NULL) *length = p->length;
        if (source != NULL) *source = p->source;
        return p->data;
    }
    if (msg & RT_MSG_LOCAL) {
        uint32_t slot = msg & ~RT_MSG_LOCAL;
        if (length != NULL) *length = dp.sends[slot].length;
        if (source != NULL) *source = rt.rank;
        return mr__pool_slot(&dp.send_pool, slot);
    }
    if (length != NULL) *length = dp.recvs[msg].length;
    if (source != NULL) *source = dp.recvs[msg].source;
    return dp.recvs[msg].data;
}

/*
 * Entries below this index keep their block when their copy is dropped: as
 * much memory as the receive pool, at most, stays with parking.
 */
#define DP_PARKED_KEEP \
    ((uint32_t)(rt.cfg.recv_slots < RT_MSG_INDEX ? rt.cfg.recv_slots : RT_MSG_INDEX))

void rt_msg_drop(rt_msg_t msg)
{
    if (msg & RT_MSG_PARKED) {
        uint32_t i = msg & RT_MSG_INDEX;
        if (i >= DP_PARKED_KEEP) {
            free(dp.parked[i]);
            dp.parked[i] = NULL;
        }
        dp.parked_next[i] = dp.parked_free;
        dp.parked_free = i;
        return;
    }
    if (msg & RT_MSG_LOCAL) rt_send_free(msg & ~RT_MSG_LOCAL);
    else dp_recv_release(msg);
}

void rt_msg_consumed(rt_msg_t msg)
{
    size_t length;

    rt_msg_data(msg, &length, NULL);
    rt.stats.messages_received++;
    rt.stats.bytes_received += length;
    rt_msg_drop(msg);
}

void rt_submit_local(uint32_t slot, size_t length, unsigned kind)
{
    rt_send_t *s = &dp.sends[slot];

    s->state = SEND_LOCAL;
    s->kind = (uint8_t)kind;
    s->dest = rt.rank;
    s->length = (uint32_t)length;
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length;
    dp.consumers[kind]->arrived(slot | RT_MSG_LOCAL, mr__pool_slot(&dp.send_pool, slot), length,
                                rt.rank);
}

/* A free entry of the parked table, growing it when full; MR_NIL without memory. */
static uint32_t dp_parked_entry(void)
{
    if (dp.parked_free == MR_NIL || dp.nparked_cap == 0) {
        uint32_t cap = dp.nparked_cap ? 2 * dp.nparked_cap : 64;
        dp_parked_t **table = cap <= RT_MSG_INDEX ? realloc(dp.parked, cap * sizeof(*table)) : NULL;
        if (table == NULL) return MR_NIL;
        dp.parked = table;
        uint32_t *next = realloc(dp.parked_next, cap * sizeof(*next));
        if (next == NULL) return MR_NIL;
        dp.parked_next = next;
        for (uint32_t i = cap; i-- > dp.nparked_cap;) {
            dp.parked[i] = NULL;
            dp.parked_next[i] = i == cap - 1 ? MR_NIL : i + 1;
        }
        dp.parked_free = dp.nparked_cap;
        dp.nparked_cap = cap;
    }
    uint32_t i = dp.parked_free;
    dp.parked_free = dp.parked_next[i];
    return i;
}

rt_msg_t rt_msg_park(rt_msg_t msg)
{
    size_t length;
    int source;
    const uint8_t *data;
    dp_parked_t *p;
    uint32_t i;

    if (msg & RT_MSG_PARKED) return msg;
    data = rt_msg_data(msg, &length, &source);
    i = dp_parked_entry();
    p = i != MR_NIL ? dp.parked[i] : NULL;
    if (i != MR_NIL && (p == NULL || p->room < length)) {
        /* A datagram's room, so that the block fits whatever parks in this entry next. */
        size_t room = length > rt.cfg.datagram_size ? length : (size_t)rt.cfg.datagram_size;
        free(p);
        if ((p = dp.parked[i] = malloc(sizeof(*p) + room)) != NULL) p->room = room;
    }
    if (p == NULL) {
        if (i != MR_NIL) {
            dp.parked_next[i] = dp.parked_free;
            dp.parked_free = i;
        }
        mr_warn("Cannot park a message of %zu bytes: it keeps its slot.", length);
        return msg;
    }
    p->next = MR_NIL;
    p->source = source;
    p->length = length;
    memcpy(p->data, data, length);
    dp.parked[i] = p;
    rt.stats.handler_parked++;
    rt_msg_drop(msg); /* Its slot, and with it a credit, go back now. */
    return i | RT_MSG_PARKED;
}

/*
 * Each copy takes its original's place in the list. A handler that waits
 * parks its queue at every progress call; starting after the messages parked
 * already keeps that linear in the arrivals, not in the queue's length.
 */
void rt_msgq_park(rt_msgq_t *q)
{
    rt_msg_t prev = q->parked, msg = prev == MR_NIL ? q->head : *dp_msg_next(prev);
    bool all = true;

    while (msg != MR_NIL) {
        rt_msg_t next = *dp_msg_next(msg), copy = rt_msg_park(msg);
        *dp_msg_next(copy) = next;
        if (prev == MR_NIL) q->head = copy;
        else *dp_msg_next(prev) = copy;
        if (next == MR_NIL) q->tail = copy;
        /* One that found no memory kept its slot: the next park tries it again. */
        all = all && (copy & RT_MSG_PARKED);
        if (all) q->parked = copy;
        prev = copy;
        msg = next;
    }
}
