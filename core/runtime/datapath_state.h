/*
 * The datapath's state, private to datapath.c, datapath_life.c and
 * datapath_consumers.c (tests/check_layers.sh refuses it elsewhere): the
 * rest of the runtime goes through datapath.h.
 */
#ifndef MR_DATAPATH_STATE_H
#define MR_DATAPATH_STATE_H

#include "datapath.h"

/*
 * Where a send slot is in its life. SEND_LOCAL: a datagram to oneself, held
 * by a consumer (rt_submit_local), never sent.
 */
enum send_state { SEND_FREE, SEND_RESERVED, SEND_DEFERRED, SEND_INFLIGHT, SEND_LOCAL };

/*
 * Where a receive slot is in its life (RECV_CONSUMER: a consumer of its kind
 * owns it; RECV_BATCH: a batch of data frames, in the arrival queue while
 * frames are left to hand out, and free once every frame was released).
 */
enum recv_state { RECV_FREE, RECV_FILLING, RECV_QUEUED, RECV_HELD, RECV_CONSUMER, RECV_BATCH };

typedef struct rt_send {
    uint8_t state;
    uint8_t kind;       /* MR_KIND_DATA or MR_KIND_ITEMS. */
    int32_t dest;
    uint32_t length;
    uint32_t next;      /* Next in a consumer's queue, when SEND_LOCAL. */
} rt_send_t;

typedef struct rt_recv {
    uint8_t state;
    uint16_t frames_left;   /* RECV_BATCH: frames not handed out yet, ... */
    uint16_t frames_held;   /* ... handed out and not released, ... */
    uint32_t cursor;        /* ... and the offset of the next one. */
    int32_t source;
    uint32_t length;
    uint32_t next;      /* Next in the arrival queue or a consumer's. */
    void *data;         /* The slot, or the substrate's buffer when `handle` is set. */
    void *handle;       /* Substrate-owned buffer, released through release_recv(). */
    void *foreign;      /* The substrate's buffer this slot last stood for, kept in
                           dp.foreign (or dp.region_slot) after release so that a
                           double release is recognised; NULL if none. */
} rt_recv_t;

/* A message copied out of its slot while its consumer waits to send. */
typedef struct dp_parked {
    uint32_t next;       /* Queue link, as rt_recv_t.next; a free-list link when unused. */
    int source;
    size_t length;
    uint8_t data[];
} dp_parked_t;

/* The datapath's state: nobody outside this file touches it (datapath.h). */
typedef struct rt_datapath {
    mr_pool_t send_pool, recv_pool;
    rt_send_t *sends;
    rt_recv_t *recvs;
    mr_deferq_t deferq;
    rt_msgq_t arrivals;    /* Datagrams for mr_receive(); consumers keep their own. */
    mr_ptrmap_t foreign;   /* Substrate-owned buffer -> receive slot, ... */
    /*
     * ... or, for a buffer in the substrate's receive region (its
     * recv_region(), ABI 7), the slot by the buffer's index there: MR_NIL
     * when none stands for it.
     */
    uintptr_t region_base;
    size_t region_stride;
    size_t region_bytes;   /* count x stride: 0 when there is no region. */
    int region_shift;      /* log2(stride) when a power of two, else -1. */
    uint32_t *region_slot;
    const rt_consumer_t *consumers[MR_KIND_HANDLER + 1];
    /* The consumers with a progress() hook, run at the end of rt_progress(). */
    int (*consumer_progress[MR_KIND_HANDLER + 1])(void);
    int nconsumer_progress;
    dp_parked_t **parked;    /* Parked messages by index (rt_msg_park()), ... */
    uint32_t nparked_cap;    /* ... the table's size ... */
    uint32_t parked_free;    /* ... and its free entries, linked through parked_next. */
    uint32_t *parked_next;
    /*
     * Progress calls so far, and per rank the count when the substrate last
     * refused a message to it (MR_AGAIN), or flow control said no credit for
     * it can come before the next progress call: until then messages to that
     * rank are deferred at once.
     */
    uint32_t progress_epoch;
    uint32_t *refused_epoch;
    /*
     * Per rank: since when (mr__now_ns) none of the messages deferred to it
     * left, or 0. A rank that takes none for MAILRAIL_TIMEOUT has failed
     * (rt_deferred_overdue).
     */
    uint64_t *defer_since;
    /* The progress count when a pass over the deferred queue found only such refusals. */
    uint32_t drain_stuck_epoch;
    /*
     * The hot path's callees, copied from rt at attach: one load each on every
     * message. Flow control's are NULL when the policy is unconstrained.
     */
    bool (*acquire)(mr_flowctl_t *fc, int dest, uint32_t *imm);
    uint32_t (*acquire_n)(mr_flowctl_t *fc, int dest, uint32_t want, uint32_t *imm);
    void (*on_arrival)(mr_flowctl_t *fc, int source, uint32_t imm);
    void (*on_release)(mr_flowctl_t *fc, int source);
    mr_flowctl_t *fc;
    mr_status_t (*send)(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                        const void *data, size_t length, void *cookie);
    mr_substrate_t *sub;
    /* The substrate's append windows and the largest payload they take (NULL: none). */
    mr_append_window_t *win;
    size_t win_max;
    uint64_t send_bytes;     /* MAILRAIL_SEND_BYTES, or no bound: UINT64_MAX. */
    size_t inflight;         /* Sends accepted by the substrate and not completed. */
    uint64_t pending_bytes;  /* Of messages deferred or in flight (MAILRAIL_SEND_BYTES). */
    unsigned receive_budget; /* mr_receive() calls until the next that makes progress. */
    unsigned idle_polls;
    bool reserve_blocked;    /* The last mr_reserve() found no send buffer. */
    /* The pool bound from the wire's side (docs/reliability.md). */
    uint64_t recv_bound;     /* Flow control's recv_bound(), or 0: it bounds nothing. */
    uint64_t (*sub_held)(mr_substrate_t *s); /* The substrate's held(), or NULL. */
    uint64_t held;           /* What it returned when last asked. */
    bool slot_refused;       /* A slot was asked for and none was free since then. */
} rt_datapath_t;

extern rt_datapath_t dp;

/*
 * Message handles: a receive slot's index; with RT_MSG_LOCAL, a send slot kept
 * for oneself; with RT_MSG_PARKED, a copy on the heap (rt_msg_park()), the
 * index of its entry in dp.parked.
 */
#define RT_MSG_LOCAL 0x80000000u
#define RT_MSG_PARKED 0x40000000u
#define RT_MSG_INDEX 0x3fffffffu


/* The arrival queue of mr_receive(): receive slots only, linked through rt_recv_t.next. */
static inline void dp_recvq_push(rt_msgq_t *q, uint32_t idx)
{
    dp.recvs[idx].next = MR_NIL;
    if (q->tail == MR_NIL) q->head = idx;
    else dp.recvs[q->tail].next = idx;
    q->tail = idx;
}

static inline uint32_t dp_recvq_pop(rt_msgq_t *q)
{
    uint32_t idx = q->head;

    if (idx == MR_NIL) return MR_NIL;
    q->head = dp.recvs[idx].next;
    if (q->head == MR_NIL) q->tail = MR_NIL;
    return idx;
}

/* datapath.c: returns a held or queued receive slot, and its credit, to MailRail. */
void dp_recv_release(uint32_t idx);

/*
 * datapath.c: gives back a batch slot with every frame in it, handed out or
 * not, and their credits; returns how many were not handed out.
 */
uint32_t dp_batch_drop(uint32_t idx);

#endif /* MR_DATAPATH_STATE_H */
