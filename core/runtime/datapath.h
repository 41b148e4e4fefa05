/*
 * The datapath's interface to the rest of the runtime (the datapath_*.c
 * files hold the slot tables, the queues and the deferred sends, and nobody
 * else touches them). Above it, the item layer and init/finalize; below it, the substrate
 * and flow control.
 *
 * A layer that builds on datagrams (the item layer) registers as the
 * consumer of one message kind: the datapath hands it each arrival of that
 * kind as a message handle (rt_msg_t) and the consumer keeps it in its own
 * queues (rt_msgq_t), reads it through rt_msg_data(), and gives it back with
 * rt_msg_consumed(). A datagram a rank sends to itself through
 * rt_submit_local() reaches the consumer the same way, without a copy.
 */
#ifndef MR_DATAPATH_H
#define MR_DATAPATH_H

#include "runtime.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Life, for init.c ------------------------------------------------------------------ */

/* Allocates the pools and slot tables (rt.cfg and rt.size are set). */
mr_status_t rt_datapath_init(void);
/* Frees them; safe on partly allocated state. */
void rt_datapath_fini(void);
/* After flow control and the substrate opened: the wire-side pool bound and held(). */
void rt_datapath_attach(uint64_t recv_bound, uint64_t (*held)(mr_substrate_t *s));
/* Whether messages are deferred or in flight. */
bool rt_datapath_sends_pending(void);
/* Discards every datagram waiting for mr_receive(); returns how many. */
uint64_t rt_datapath_drop_arrivals(void);
/* Takes back every receive buffer the application holds (finalize). */
void rt_datapath_release_held(void);
/* Gives back the send slots of every message deferred to a rank that failed. */
void rt_datapath_drop_deferred(int rank);

/* A failure waits to be reported: the next mr_receive() makes progress and reports it. */
void rt_datapath_report_soon(void);
/* Fills the datapath's fields of mr_get_stats()' snapshot. */
void rt_datapath_stats(mr_stats_t *snapshot);

/* ---- Progress and sending ------------------------------------------------------------ */

extern const mr_substrate_upcalls_t rt_upcalls;
/* Sends a credit return for flow control. */
mr_status_t rt_send_control(void *core, int dest, uint32_t imm);
/* The messages deferred to `dest` now, for flow control. */
uint32_t rt_deferred_to(void *core, int dest);
/* One round of progress: substrate, flow control, deferred sends. */
int rt_progress(int timeout_ms);
/*
 * Reserves a send slot, or returns MR_NIL (counted as a reserve failure) when
 * none is free or the messages deferred or in flight hold MAILRAIL_SEND_BYTES.
 */
uint32_t rt_send_take(void);
/* The buffer of a reserved send slot (MAILRAIL_DATAGRAM_SIZE bytes), and back. */
uint8_t *rt_send_buffer(uint32_t slot);
uint32_t rt_send_slot(const uint8_t *buffer);
/* Frees a send slot: sent, or never to be sent. */
void rt_send_free(uint32_t slot);
/*
 * Sends a reserved send slot: transmits it, or defers it behind older
 * messages to `dest` (MR_OK either way), or returns the substrate's error
 * with the slot still reserved. Counts it as a message sent.
 */
mr_status_t rt_submit(uint32_t slot, size_t length, int dest, unsigned kind);
/*
 * Hands a reserved send slot of `length` bytes to this rank's consumer of
 * `kind` as an arrival from itself, without a copy or a credit. Counted as
 * a message sent, and as received when the consumer releases it.
 */
void rt_submit_local(uint32_t slot, size_t length, unsigned kind);
/*
 * mr_send() for another kind of message (mr_send_handler()): the same checks
 * under `fn`'s name, then `trailer` appended as a last byte (the buffer has
 * room for it: `length` is below the datagram size).
 */
mr_status_t rt_send_kind(const char *fn, void *buffer, size_t length, int dest, unsigned kind,
                         uint8_t trailer);
/*
 * rt_send_kind() of a copy of `length` bytes at `data` (checked already, but
 * for the peer), with no buffer from mr_reserve(): packed straight into the
 * batch the substrate fills for `dest` when it takes them, else copied into
 * a send slot. MR_AGAIN when no slot is free: nothing was sent.
 */
mr_status_t rt_send_copy(const void *data, size_t length, int dest, unsigned kind,
                         uint8_t trailer);
/* True, once, for each peer failure the application has not been told of. */
bool rt_report_failure(void);
/* A poll found nothing: lets other ranks have the core now and then. */
void rt_idle(void);
/* A poll found something: the next idle poll starts counting again. */
void rt_busy(void);

/* ---- Consumers of a message kind ----------------------------------------------------- */

/* A datagram handed to a consumer: a receive slot, or a send slot kept for oneself. */
typedef uint32_t rt_msg_t;

/*
 * A FIFO of message handles; the links live in the datapath's slot tables.
 * `parked` is the last of the messages at its head that rt_msgq_park() has
 * parked (MR_NIL: none), so that parking again starts after them.
 */
typedef struct rt_msgq {
    rt_msg_t head, tail, parked;
} rt_msgq_t;

#define RT_MSGQ_INIT ((rt_msgq_t){MR_NIL, MR_NIL, MR_NIL})

typedef struct rt_consumer {
    /* A datagram of this kind arrived; the consumer owns it until rt_msg_consumed(). */
    void (*arrived)(rt_msg_t msg, const uint8_t *data, size_t length, int source);
    /* Whether it holds arrivals the application has not taken (mr_wait() returns). */
    bool (*waiting)(void);
    /*
     * Optional: consumes a message at once, in the transport's own receive
     * callback, without a slot (the substrate's
     * deliver_handler_now()): handler `id` on a `length`-byte payload. MR_OK:
     * done, counted as received; MR_AGAIN: it is to be delivered the usual way.
     */
    mr_status_t (*now)(unsigned id, const uint8_t *payload, size_t length, int source);
    /*
     * Optional: now() of a batch's frames from its start, while they are of
     * this kind and go; returns how many went, and their bytes in *consumed.
     */
    unsigned (*now_frames)(const uint8_t *frames, size_t length, int source, size_t *consumed);
    /* Optional: runs at the end of every progress call; returns the events it made. */
    int (*progress)(void);
} rt_consumer_t;

/* Registers the consumer of `kind` (not MR_KIND_DATA, which is mr_receive()'s); NULL: none. */
void rt_datapath_consume(unsigned kind, const rt_consumer_t *consumer);

void rt_msgq_push(rt_msgq_t *q, rt_msg_t msg);
/* The oldest message of a queue, taken off it, or MR_NIL. */
rt_msg_t rt_msgq_pop(rt_msgq_t *q);

static inline bool rt_msgq_empty(const rt_msgq_t *q)
{
    return q->head == MR_NIL;
}

/* Where a message's bytes are, and (unless NULL) how many and from whom. */
const uint8_t *rt_msg_data(rt_msg_t msg, size_t *length, int *source);
/* Counts a message as received (quiescence) and gives its slot and credit back. */
void rt_msg_consumed(rt_msg_t msg);
/* Gives a message's slot and credit back without counting it (finalize's drops). */
void rt_msg_drop(rt_msg_t msg);
/*
 * Parks a message: copies it to the heap and gives its slot and credit back
 * at once, for a consumer that cannot take it now (a handler that waits to
 * send): slots held by waiting consumers would keep the very credits their
 * peers need to drain what this rank waits for. Returns the copy's handle
 * (the same handle when it is parked already, or when memory runs out).
 */
rt_msg_t rt_msg_park(rt_msg_t msg);
/* Parks every message of a queue in place, in order: those parked before cost nothing. */
void rt_msgq_park(rt_msgq_t *q);

#endif /* MR_DATAPATH_H */
