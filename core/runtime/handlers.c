/*
 * Active-message handlers (mailrail.h): the table of handlers, sending to
 * one, and running them. The datapath hands this file every MR_KIND_HANDLER
 * message (datapath.h): at once in the transport's callback when nothing
 * waits before it (now), otherwise queued in arrival order and run at the
 * end of each progress call. A message's last byte names its handler.
 *
 * Order is kept per source: each source has its own queue, and the sources
 * with messages waiting take turns, round robin. A handler that cannot send
 * now returns MR_AGAIN. Its message, and every message from the same source
 * waiting behind it, is then parked (rt_msg_park()): copied out of its
 * receive slot, whose credit goes back at once. Otherwise the slots held by
 * waiting handlers would keep the credits their senders need to drain the
 * very sends this rank waits for, and ranks whose handlers send to each
 * other would deadlock. Messages from other sources run meanwhile: a reply
 * that needs no send is not held up behind a request that waits to send.
 * Quiescence counts each message as received when its handler returns
 * MR_OK. Parking copies, but allocates only when more messages wait at once
 * than ever before (rt_msg_park()).
 */
#include "datapath.h"

#include <stdlib.h>
#include <string.h>

typedef struct rt_handler {
    mr_handler_t fn;
    void *arg;
} rt_handler_t;

static rt_handler_t handlers[MR_HANDLERS_MAX];
/* Arrived (in their slots, or parked), handlers not run yet: one queue per source. */
static rt_msgq_t *waiting;
static uint64_t nwaiting;
/*
 * The sources with messages waiting, in turn: a ring of nturns of rt.size. A
 * source is in it exactly when its queue is not empty, except while its turn
 * runs (a handler's message to this rank then finds its source's queue
 * holding the message being handled).
 */
static int *turns;
static int turn_head, nturns;
static int nregistered;        /* Handlers registered. */
static bool blocked;           /* Every source waiting asked to be called again in this call. */
static bool stopped;           /* Finalize began: handlers run no more. */

static void handlers_consume(void);

/* Puts `source` at the end of the ring of sources with messages waiting. */
static void handlers_list(int source)
{
    turns[(turn_head + nturns) % rt.size] = source;
    nturns++;
}

/* Takes the source whose turn it is off the ring. */
static int handlers_unlist(void)
{
    int source = turns[turn_head];

    turn_head = turn_head + 1 < rt.size ? turn_head + 1 : 0;
    nturns--;
    return source;
}

/* Handler messages run per progress call at most, so that one sent to oneself
 * by its own handler cannot keep progress from returning. */
#define RT_HANDLER_BURST 256

/*
 * Runs handler `id` on a payload of `length` bytes. MR_AGAIN: the handler
 * asked to be called again; anything else: done with it.
 */
__attribute__((always_inline)) static inline mr_status_t handler_run_id(unsigned id,
                                                                       const uint8_t *payload,
                                                                       size_t length, int source)
{
    const rt_handler_t *h;
    mr_message_t m;
    mr_status_t status;

    h = id < MR_HANDLERS_MAX ? &handlers[id] : NULL;
    if (h == NULL || h->fn == NULL) {
        mr_error("Rank %d sent a message to handler %u, which is not registered on this rank; "
                 "it is dropped (register the same handlers on every rank before sending).",
                 source, id);
        rt.stats.handler_dropped++;
        return MR_OK;
    }
    m.data = (void *)payload;
    m.length = length;
    m.source = source;
    rt_state = RT_IN_HANDLER;
    status = h->fn(&m, h->arg);
    rt_state = RT_READY;
    if (__builtin_expect(status != MR_OK, 0)) {
        if (status == MR_AGAIN) {
            rt.stats.handler_retries++;
            return MR_AGAIN;
        }
        mr_warn("Handler %u returned %d (%s); its message counts as handled.", id, (int)status,
                mr_status_string(status));
    }
    rt.stats.handler_calls++;
    return MR_OK;
}

/* handler_run_id() of a message of `length` bytes whose last byte is its id. */
__attribute__((always_inline)) static inline mr_status_t handler_run(const uint8_t *data,
                                                                    size_t length, int source)
{
    if (length == 0) {
        mr_error("Rank %d sent a handler's message without its id; it is dropped.", source);
        rt.stats.handler_dropped++;
        return MR_OK;
    }
    return handler_run_id(data[length - 1], data, length - 1, source);
}

/* Counts a handled message as received: quiescence sees it now. */
static inline void handler_done(size_t length)
{
    rt.stats.messages_received++;
    rt.stats.bytes_received += length > 0 ? length - 1 : 0;
}

static void handlers_arrived(rt_msg_t msg, const uint8_t *data, size_t length, int source)
{
    (void)data;
    (void)length;
    if (rt_msgq_empty(&waiting[source])) handlers_list(source);
    rt_msgq_push(&waiting[source], msg);
    if (nwaiting++ == 0 && nregistered == 0) handlers_consume(); /* To drop it, in order. */
}

/*
 * Handlers may run now for `source`: none of its messages waits before (order
 * is kept per source), none runs, and not finalizing.
 */
static inline bool handlers_open(int source)
{
    return rt_msgq_empty(&waiting[source]) && !stopped && rt_state == RT_READY;
}

/* Runnable now: not while the last attempt found a handler unable to send (mr_wait() sleeps). */
static bool handlers_waiting(void)
{
    return nwaiting > 0 && !blocked && !stopped;
}

/* Handler `id` on a `length`-byte payload, in the transport's callback, if it may run now. */
static mr_status_t handlers_now(unsigned id, const uint8_t *payload, size_t length, int source)
{
    if (!handlers_open(source)) return MR_AGAIN;
    if (handler_run_id(id, payload, length, source) == MR_AGAIN) return MR_AGAIN;
    rt.stats.handler_now++;
    handler_done(length + 1);
    return MR_OK;
}

static unsigned handlers_now_frames(const uint8_t *frames, size_t length, int source,
                                    size_t *consumed)
{
    size_t off = 0;
    unsigned n = 0;

    /*
     * As handlers_now(), frame by frame: each in order, unless one of the
     * source's waits before it. Only a handler's message to this rank can
     * make one wait meanwhile (finalize and progress are refused inside a
     * handler).
     */
    if (handlers_open(source)) {
        while (off < length) {
            uint32_t hdr = 0;
            size_t size = mr_frame_read(frames + off, length - off, &hdr);
            if (size == 0 || (hdr & MR_FRAME_KIND_BITS) != MR_FRAME_HANDLER_BIT) break;
            size_t plen = hdr & ~MR_FRAME_KIND_BITS;
            if (handler_run(frames + off + MR_FRAME_HDR, plen, source) == MR_AGAIN) break;
            handler_done(plen);
            off += size;
            n++;
            if (__builtin_expect(!rt_msgq_empty(&waiting[source]), 0)) break;
        }
    }
    rt.stats.handler_now += n;
    *consumed = off;
    return n;
}

/*
 * Runs a source's waiting messages' handlers in order, until one asks to be
 * called again (then parks it and those behind it, so that their credits go
 * back, and returns true) or the burst is spent.
 */
static bool handlers_run_source(rt_msgq_t *q, int *events)
{
    while (q->head != MR_NIL && *events < RT_HANDLER_BURST) {
        rt_msg_t msg = q->head;
        size_t length;
        int source;
        const uint8_t *data = rt_msg_data(msg, &length, &source);

        if (handler_run(data, length, source) == MR_AGAIN) {
            rt_msgq_park(q);
            return true;
        }
        rt_msgq_pop(q);
        nwaiting--;
        handler_done(length);
        rt_msg_drop(msg);
        (*events)++;
    }
    return false;
}

/*
 * Gives each source with messages waiting one turn, round robin. Blocked
 * (mr_wait() may sleep) when every source still waiting asked to be called
 * again in this call.
 */
static int handlers_progress(void)
{
    int events = 0, waits = 0, turns_now = nturns;

    blocked = false;
    if (nwaiting == 0 || stopped || rt_state != RT_READY) return 0;
    for (int i = 0; i < turns_now && events < RT_HANDLER_BURST; i++) {
        int source = handlers_unlist();

        waits += handlers_run_source(&waiting[source], &events);
        if (!rt_msgq_empty(&waiting[source])) handlers_list(source);
    }
    blocked = waits > 0 && waits == nturns;
    return events;
}

/* With a progress hook while a handler is registered; without, progress pays nothing. */
static const rt_consumer_t rt_handlers_consumer = {
    .arrived = handlers_arrived,
    .waiting = handlers_waiting,
    .now = handlers_now,
    .now_frames = handlers_now_frames,
    .progress = handlers_progress,
};
static const rt_consumer_t rt_handlers_consumer_idle = {
    .arrived = handlers_arrived,
    .waiting = handlers_waiting,
    .now = handlers_now,
    .now_frames = handlers_now_frames,
};
/* Registers the consumer with its progress hook only while some handler is registered. */
static void handlers_consume(void)
{
    rt_datapath_consume(MR_KIND_HANDLER, nregistered > 0 || nwaiting > 0
                                             ? &rt_handlers_consumer
                                             : &rt_handlers_consumer_idle);
}

mr_status_t rt_handlers_init(void)
{
    waiting = malloc((size_t)rt.size * sizeof(*waiting));
    turns = malloc((size_t)rt.size * sizeof(*turns));
    if (waiting == NULL || turns == NULL) {
        mr_error("Cannot allocate the handlers' queues of %d ranks.", rt.size);
        rt_handlers_fini();
        return MR_ERR_NO_MEMORY;
    }
    for (int s = 0; s < rt.size; s++) waiting[s] = RT_MSGQ_INIT;
    turn_head = 0;
    nturns = 0;
    memset(handlers, 0, sizeof(handlers));
    nwaiting = 0;
    nregistered = 0;
    blocked = false;
    stopped = false;
    handlers_consume();
    return MR_OK;
}

void rt_handlers_fini(void)
{
    free(turns);
    free(waiting);
    turns = NULL;
    waiting = NULL;
}

uint64_t rt_handlers_stop(void)
{
    uint64_t dropped = 0;

    stopped = true;
    while (nturns > 0) {
        rt_msgq_t *q = &waiting[handlers_unlist()];
        for (rt_msg_t msg; (msg = rt_msgq_pop(q)) != MR_NIL; dropped++) rt_msg_drop(msg);
    }
    nwaiting = 0;
    return dropped;
}

mr_status_t mr_handler_register(int id, mr_handler_t handler, void *arg)
{
    RT_CHECK_READY("mr_handler_register()");
    if (id < 0 || id >= MR_HANDLERS_MAX) {
        mr_error("mr_handler_register(): id %d is not in [0, %d).", id, MR_HANDLERS_MAX);
        return MR_ERR_INVALID_PARAM;
    }
    nregistered += (handler != NULL) - (handlers[id].fn != NULL);
    handlers[id].fn = handler;
    handlers[id].arg = handler != NULL ? arg : NULL;
    handlers_consume();
    return MR_OK;
}

mr_status_t mr_send_handler(void *buffer, size_t length, int dest, int id)
{
    RT_CHECK_SEND("mr_send_handler()");
    if (id < 0 || id >= MR_HANDLERS_MAX || handlers[id].fn == NULL) {
        mr_error("mr_send_handler(): handler %d is not registered on this rank (register the "
                 "same handlers on every rank).", id);
        return MR_ERR_INVALID_PARAM;
    }
    if (length >= rt.cfg.datagram_size) {
        mr_error("mr_send_handler(): length %zu leaves no room for the handler id in a "
                 "datagram of %zu bytes (MAILRAIL_DATAGRAM_SIZE).", length,
                 (size_t)rt.cfg.datagram_size);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    return rt_send_kind("mr_send_handler()", buffer, length, dest, MR_KIND_HANDLER,
                        (uint8_t)id);
}

mr_status_t mr_send_handler_copy(const void *data, size_t length, int dest, int id)
{
    RT_CHECK_SEND("mr_send_handler_copy()");
    if ((unsigned)id >= MR_HANDLERS_MAX || handlers[id].fn == NULL) {
        mr_error("mr_send_handler_copy(): handler %d is not registered on this rank (register "
                 "the same handlers on every rank).", id);
        return MR_ERR_INVALID_PARAM;
    }
    if (data == NULL && length > 0) {
        mr_error("mr_send_handler_copy(): the data pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    if ((unsigned)dest >= (unsigned)rt.size) {
        mr_error("mr_send_handler_copy(): destination %d is not in [0, %d).", dest, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    if (length >= rt.cfg.datagram_size) {
        mr_error("mr_send_handler_copy(): length %zu leaves no room for the handler id in a "
                 "datagram of %zu bytes (MAILRAIL_DATAGRAM_SIZE).", length,
                 (size_t)rt.cfg.datagram_size);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    return rt_send_copy(data, length, dest, MR_KIND_HANDLER, (uint8_t)id);
}
