/*
 * The datapath's state and what its files share, private to them
 * (datapath_*.c; tests/check_layers.sh refuses it elsewhere): the rest of
 * the runtime goes through datapath.h. The send path's core
 * (rt_transmit_credited()) is here, inline, because sending and the
 * deferred queue's drain both run it on every message.
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
    uint16_t swept;     /* SEND_INFLIGHT: the sweep that first saw it so, or 0. */
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

/*
 * A message copied out of its slot while its consumer waits to send. The
 * block stays with its entry of dp.parked when the copy is dropped, so that
 * parking does not allocate once entries have been used (DP_PARKED_KEEP).
 */
typedef struct dp_parked {
    uint32_t next;       /* Queue link, as rt_recv_t.next. */
    int source;
    size_t length;
    size_t room;         /* Bytes data[] can hold. */
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
    dp_parked_t **parked;    /* Parked messages by index (rt_msg_park()), or kept blocks, ... */
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
    /*
     * Per rank: the messages and control messages that came from it, counted
     * (wrapping), and the count when its defer_since clock started: a rank
     * that was heard from since is alive, and its clock starts again.
     */
    uint32_t *heard;
    uint32_t *defer_heard;
    /*
     * Sends the substrate took and never completes (rt_inflight_sweep()):
     * when the next sweep is due (mr__now_ns), the last sweep's number, and
     * the heard counts of the last two sweeps (by the number's parity).
     */
    uint64_t sweep_at;
    uint16_t sweep_no;
    uint32_t *sweep_heard[2];
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
    uint64_t nap_ns;         /* mr_wait()'s last nap (MAILRAIL_WAIT_NAP); 0 after news. */
    bool reserve_blocked;    /* The last mr_reserve() found no send buffer. */
    /* The pool bound from the wire's side (docs/reliability.md). */
    uint64_t recv_bound;     /* Flow control's recv_bound(), or 0: it bounds nothing. */
    uint64_t (*sub_held)(mr_substrate_t *s); /* The substrate's held(), or NULL. */
    uint64_t held;           /* What it returned when last asked. */
    uint64_t batch_frames;   /* Frames of batches in slots beyond each slot's first. */
    bool slot_refused;       /* A slot was asked for and none was free since then. */
} rt_datapath_t;

extern rt_datapath_t dp;

/*
 * Messages in flight to this rank (docs/reliability.md): one per receive slot
 * in use, one more per further frame of a batch in a slot, not yet released,
 * and what the substrate holds for want of a slot.
 */
static inline uint64_t dp_recv_messages(void)
{
    return mr__pool_in_use(&dp.recv_pool) + dp.batch_frames + dp.held;
}

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

/* datapath_arrival.c: returns a held or queued receive slot, and its credit, to MailRail. */
void dp_recv_release(uint32_t idx);

/*
 * datapath_arrival.c: gives back a batch slot with every frame in it, handed out or
 * not, and their credits; returns how many were not handed out.
 */
uint32_t dp_batch_drop(uint32_t idx);


/* ---- What the datapath's files share ------------------------------------------------- */

/* Flow control hears of an arrival, and of a slot the application gave back. */
static inline void dp_fc_arrival(int source, uint32_t imm)
{
    if (dp.on_arrival != NULL) dp.on_arrival(dp.fc, source, imm);
}

static inline void dp_fc_release(int source)
{
    if (dp.on_release != NULL) dp.on_release(dp.fc, source);
}

/* The index of the buffer at `p` in the substrate's receive region, or MR_NIL. */
static inline uint32_t dp_region_index(const void *p)
{
    uintptr_t off = (uintptr_t)p - dp.region_base;

    if (off >= dp.region_bytes) return MR_NIL;
    /* A power of two (the usual datagram size) spares a division. */
    uintptr_t b = dp.region_shift >= 0 ? off >> dp.region_shift : off / dp.region_stride;
    return b * dp.region_stride == off ? (uint32_t)b : MR_NIL;
}


/* datapath_arrival.c: takes a free receive slot (MR_NIL: none), and frees one. */
uint32_t rt_recv_take(void);
void rt_recv_free(uint32_t idx);

/* datapath_arrival.c: counts a new peak, and arrivals beyond the grant, since `before`. */
void rt_inflight_grew(uint64_t before);

/* datapath_send.c: the pieces of rt_transmit_credited() out of line. */
mr_status_t rt_deliver_self(uint32_t idx);
mr_status_t rt_no_credit(int dest);
mr_status_t rt_transmit_rest(uint32_t idx, uint32_t imm, mr_status_t status);

/* datapath_send.c: the send slot of a reserved buffer the application passes in. */
mr_status_t rt_reserved_slot(const char *fn, const void *buffer, uint32_t *out);

/* datapath_progress.c: sends what the deferred queue can; returns how many left it. */
int rt_drain(void);
/* datapath_progress.c: when due, names the ranks whose sends stay in flight (`now`: mr__now_ns). */
void rt_inflight_sweep(uint64_t now);

/*
 * The message in send slot `idx` was packed into a batch: the slot is free
 * again, and its `length` bytes at `data` are copied to `payload`, last, so
 * that nothing is kept across the copy.
 */
__attribute__((always_inline)) static inline void rt_packed(uint32_t idx, uint8_t *payload,
                                                            const void *data, size_t length)
{
    rt_send_t *s = &dp.sends[idx];

    if (s->state == SEND_DEFERRED) dp.pending_bytes -= length;
    s->state = SEND_FREE;
    mr__pool_put(&dp.send_pool, idx);
    if (length > 0) memcpy(payload, data, length);
}

/*
 * Hands the message in send slot `idx`, whose credit flow control granted
 * (with `imm`), to the substrate, or to oneself. Inlined: it is most of every
 * send. The common case, a message the substrate is done with at once
 * (packed into a batch through its window, say), frees its slot here; the
 * slot's dest, kind and length must be set before.
 */
__attribute__((always_inline)) static inline mr_status_t rt_transmit_credited(uint32_t idx,
                                                                              uint32_t imm)
{
    rt_send_t *s = &dp.sends[idx];
    int dest = s->dest;
    mr_status_t status;

    if (__builtin_expect(dest == rt.rank, 0)) {
        status = rt_deliver_self(idx);
        if (status == MR_OK) return MR_OK;
    } else {
        void *data = mr__pool_slot(&dp.send_pool, idx);
        uint8_t *payload;
        /* The batch the substrate fills for `dest` takes it without a call (ABI 6). */
        if (__builtin_expect(imm == 0 && dp.win != NULL && s->length <= dp.win_max, 1) &&
            (payload = mr_append_window_take(&dp.win[dest], s->kind, s->length)) != NULL) {
            rt_packed(idx, payload, data, s->length);
            return MR_OK;
        }
        status = dp.send(dp.sub, dest, s->kind, imm, data, s->length, s);
        if (__builtin_expect(status == MR_SUBSTRATE_SENT, 1)) {
            /* Already copied out: the slot is free again, warm for the next reserve. */
            if (s->state == SEND_DEFERRED) dp.pending_bytes -= s->length;
            s->state = SEND_FREE;
            mr__pool_put(&dp.send_pool, idx);
            return MR_OK;
        }
    }
    return rt_transmit_rest(idx, imm, status);
}

#endif /* MR_DATAPATH_STATE_H */
