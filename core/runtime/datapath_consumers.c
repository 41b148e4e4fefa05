/*
 * What the datapath offers the layers that consume a message kind (the item
 * layer): registration, message handles and their queues, and datagrams to
 * oneself handed over without a copy (datapath.h).
 */
#include "datapath_state.h"

/* The link of a message handle: in its receive slot, or its send slot when local. */
static inline uint32_t *dp_msg_next(rt_msg_t msg)
{
    return msg & RT_MSG_LOCAL ? &dp.sends[msg & ~RT_MSG_LOCAL].next : &dp.recvs[msg].next;
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

void rt_msg_drop(rt_msg_t msg)
{
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
