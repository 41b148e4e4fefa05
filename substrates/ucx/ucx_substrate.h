/*
 * The UCX substrate: UCP active messages over one worker per rank. Its
 * settings, endpoints made on first use, receive path (fast path, arrival queue, spill
 * area, backpressure), failure detection and closing are described in
 * docs/substrate-ucx.md; ucx_wire.c
 * reads and writes its address blob and message headers.
 *
 * This header is internal to the plugin: its constants, settings and state,
 * the helpers of the per-message path (static inline), and the functions its
 * files share (prefixed ucx__). One file per job:
 *
 *   ucx_settings.c  the MAILRAIL_UCX_* settings, and telling UCX they are not its own
 *   ucx_host.c      host identity, and watching the processes of peers on this host
 *   ucx_open.c      open() (context, worker, address, queues, requests); the address
 *   ucx_connect.c   endpoints on first use, connect(), watch(), preconnect(), closing()'s flush
 *   ucx_send.c      send(), send_control(), and sending batches of small messages
 *   ucx_sreq.c      the pool of send states, the send callback, batch completion
 *   ucx_am.c        the active-message handlers (set at open): headers, data, control
 *   ucx_rxq.c       the arrival queue, rendezvous receives and the spill area
 *   ucx_failure.c   peer failures: queued, reported, and the peer's sends given up
 *   ucx_ops.c       progress(), release_recv(), close(), stats() and the ops table
 */
#ifndef UCX_SUBSTRATE_H
#define UCX_SUBSTRATE_H

#include "mr_batch.h"
#include "mr_failq.h"
#include "mr_substrate_base.h"
#include "ucx_wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

/* ------------------------------------------------------------------------ */
/* Constants of the wire format and of the implementation.                  */

#define UCX_AM_DATA 0x4d31 /* AM ids; this worker is MailRail's own. */
#define UCX_AM_CTRL 0x4d32
/*
 * Data without a user header: the AM id names the sender and the kind,
 * UCX_AM_BARE + UCX_BARE_KINDS * source + k, k = kind - MR_KIND_DATA or
 * UCX_BARE_HFRONT. Used for a message that
 * has nothing else to say (no credits, no failures seen), so that the
 * receiver never touches a header, which UCX places after the payload: at
 * 4 KiB reading it costs a cache miss per message (docs/notes/performance-notebook.md).
 */
#define UCX_AM_BARE 0x4d40
#define UCX_BARE_KINDS 4 /* MR_KIND_DATA, MR_KIND_ITEMS, MR_KIND_HANDLER, and: */
#define UCX_BARE_HFRONT 3 /* A handler's message with its id in front (ucx_wire.h). */
#define UCX_BARE_MAX_RANKS ((UINT16_MAX - UCX_AM_BARE) / UCX_BARE_KINDS)

#define UCX_ENV_PREFIX "MAILRAIL"       /* UCX reads MAILRAIL_UCX_<NAME>. */
#define UCX_OWN_PREFIX "MAILRAIL_UCX_"  /* The plugin's own settings. */

#define UCX_CTRL_SLOTS_MIN 64     /* Control sends in flight at once, at least ... */
#define UCX_CTRL_SLOTS_MAX 4096   /* ... 2 per peer, at most this. */
#define UCX_RREQS_MAX 256         /* Rendezvous receives in flight at once. */
#define UCX_RXQ_SLACK 256         /* Arrival queue: receive slots plus this, ... */
#define UCX_RXQ_MAX_INIT 65536    /* ... at most this to start with; it grows if need be. */
#define UCX_PROGRESS_BURST 16     /* ucp_worker_progress() calls per progress(). */
#define UCX_PIDFD_CHECK_MS 20     /* How often progress(0) polls the peers' pidfds. */
#define UCX_HINTED_CHECK_US 100   /* ... and at most how often a peer's header makes it. */
#define UCX_CONNECT_POLL_MS 10    /* Sleep per idle round of closing()'s flush. */
#define UCX_CLOSE_FLUSH_S 5       /* Longest flush of the endpoints in closing(). */
#define UCX_CLOSE_EP_MS 1000      /* Longest wait for the endpoints to close after it. */
#define UCX_PROTO_LOG_BURST 10    /* Protocol errors logged before going quiet. */
#define UCX_MAX_EVENTS 32
#define UCX_TAG_WAKE UINT64_MAX   /* epoll tag of flow control's wake-up descriptor. */
/* Coalescing (mr_batch.h): batches being filled or in flight, and their size at most. */
#define UCX_BATCHES 32u
#define UCX_BATCH_BYTES 4096u

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

enum { ERRMODE_AUTO = 0, ERRMODE_NONE = 1, ERRMODE_PEER = 2 };

typedef struct ucx_config {
    unsigned error_mode;
    uint64_t zcopy_thresh;
    uint64_t spill_size;
    bool bare;
    uint64_t bare_max_ranks;
} ucx_config_t;

/* ucx_settings.c: the settings table, its error mode names, and the job-wide settings. */
extern const char *const ucx__error_modes[];
extern const char *const ucx__job_wide_settings[];
extern const mr_config_entry_t ucx__config_table[];

/* ------------------------------------------------------------------------ */
/* State.                                                                    */

/* Send state of one data or control message; UCX's request precedes it. */
typedef struct ucx_sreq {
    mr__sreq_t link;            /* Free list, done queue, and send()'s cookie. */
    mr_substrate_t *s;
    int32_t dest;
    bool ctrl;
    bool inflight;              /* Handed to UCX, not completed yet. */
    bool retired;               /* Given up on (its peer died): UCX may still hold it. */
    uint8_t hdr[UCX_WIRE_HDR_LEN];   /* Stays valid until completion (no COPY_HEADER in 1.13). */
    ucp_dt_iov_t iov[2];        /* A handler's prefix (in hdr) and payload (ucx_wire.h). */
    mr__batch_t *batch;         /* The batch it carries (the cookie is unused), or NULL. */
} ucx_sreq_t;

/* A block of send states: the first at open, one more for each set retired. */
typedef struct ucx_sreq_block {
    uint8_t *mem;
    size_t n;
} ucx_sreq_block_t;

/* State of one rendezvous receive; UCX's request precedes it. */
typedef struct ucx_rreq {
    struct ucx_rreq *next;
    volatile bool done;
    ucs_status_t status;
} ucx_rreq_t;

/* Where a queued arrival is. */
typedef enum ucx_rx_state {
    RX_READY,      /* Complete in a receive slot (data). */
    RX_RECEIVING,  /* Rendezvous under way into a receive slot (data). */
    RX_FAILED,     /* Rendezvous failed; the slot (data) goes back. */
    RX_HELD,       /* Waiting: UCX's buffer, kept (data, also the release handle). */
    RX_RNDV_WAIT,  /* Waiting: rendezvous descriptor (data), not started. */
    RX_SPILL       /* Waiting: a copy in the spill area or on the heap (data). */
} ucx_rx_state_t;

typedef struct ucx_rx {
    uint8_t state;
    uint8_t kind;
    bool heap;             /* RX_SPILL: the copy was malloc'ed. */
    int32_t source;
    uint32_t imm;
    size_t length;
    void *data;
    ucx_rreq_t *rreq;      /* RX_RECEIVING */
    size_t spill_end;      /* RX_SPILL in the arena: where the arena's head moves on release. */
    uint32_t frames;       /* Waiting: the messages it counts for in held() (ucx__rx_wait()). */
} ucx_rx_t;

typedef enum ucx_peer_state {
    P_NONE,    /* No endpoint (yet), or this rank. */
    P_OK,
    P_FAILED,  /* Failure found; reported (or not, when closing) and endpoint forced closed. */
    P_CLOSED   /* Endpoint closed in close(). */
} ucx_peer_state_t;

typedef struct ucx_peer {
    mr_substrate_t *s;
    int rank;
    uint8_t state;
    bool same_host;            /* Same kernel (boot id). */
    bool err_peer;             /* Its endpoint has UCP_ERR_HANDLING_MODE_PEER. */
    bool exited;               /* Its pidfd said so. */
    ucs_status_t fail_status;
    ucp_ep_h ep;
    void *close_req;
    void *flush_req;           /* A flush of the endpoint: preconnect()'s or closing()'s. */
    bool wired;                /* preconnect()'s flush completed: the endpoint is wired up. */
    uint32_t pid;
    int pidfd;
} ucx_peer_t;

struct mr_substrate {
    mr__substrate_base_t base; /* base.closing: peer failures are expected. */
    ucx_config_t cfg;

    ucp_context_h context;
    ucp_worker_h worker;
    size_t ucx_req_size;       /* Bytes UCX needs before each user request. */
    int efd;                   /* The worker's event fd, or -1. */
    int epfd;                  /* epoll over efd, the pidfds and a wake-up fd. */
    bool woken;                /* The wake-up fd was readable in the last wait. */
    size_t npidfds;

    uint8_t addr[MR_SUBSTRATE_ADDR_MAX];
    size_t addr_len;
    uint64_t boot_hash, pidns;

    bool connect_started, connected;
    const uint8_t *addrs;      /* The address table (the core's, kept until close()) ... */
    size_t addrs_len;          /* ... and the length of its entries. */
    size_t nendpoints;         /* Peers with an endpoint now (peers_connected). */
    bool flushed;              /* closing() flushed every endpoint. */
    bool closed;               /* close() runs: data is dropped, failures are expected. */
    bool upcalls_ok;           /* Inside progress(): callbacks may call the core. */
    int cb_events;             /* Upcalls made from callbacks in this progress() call. */

    ucx_peer_t *peers;
    mr__failq_t failq;         /* Failures found, awaiting progress() (ucx_failure.c). */

    /* Send state: max_sends data sends and nctrl control sends usable at any time. */
    ucx_sreq_block_t *sreq_blocks;
    size_t nsreq_blocks, sreq_stride, nctrl;
    mr__sreq_t *free_sreqs, *free_ctrl;
    mr__done_queue_t done;
    mr__batcher_t batcher;     /* Small messages packed together (MAILRAIL_COALESCE_BYTES). */
    mr__batch_t *batches_done; /* Sent batches whose messages await send_complete(). */

    /* Rendezvous receives. */
    uint8_t *rreq_mem;
    size_t rreq_stride, nrreqs;
    ucx_rreq_t *free_rreqs;
    size_t nreceiving;

    /* Arrival queue: [head, head + claimed) own slots; the rest wait for one. */
    ucx_rx_t *rxq;
    size_t rxq_cap, rxq_head, rxq_count, rxq_claimed;
    uint64_t rxq_waiting;      /* The messages the waiting entries stand for: held(). */

    /* Control messages that arrived outside progress() (in closing()'s flush). */
    uint32_t *ctrlq;           /* (source, imm) pairs. */
    size_t ctrlq_cap, ctrlq_head, ctrlq_count;

    /* A handler's message with its id in front, rewritten with the id last (ucx_am.c). */
    uint8_t *hfront_scratch;
    size_t hfront_cap;
    uint64_t hfront_rewritten;

    /* Spill area: a ring of bytes, allocated and freed in FIFO order. */
    uint8_t *spill;
    size_t spill_cap, spill_head, spill_tail, spill_used;
    bool spill_warned;

    uint64_t next_pidfd_check;
    uint64_t next_hinted_check;
    uint8_t failures_seen;     /* Peer failures found (saturating); sent in every header. */
    bool bare;                 /* Sends without a header when it has nothing to say. */
    bool bare_ids;             /* The header-less ids are registered: not the large-job path. */
    uint64_t proto_errors;
    uint64_t spilled, spilled_heap, paused_calls, zcopy_delivered, rndv_received, held;
    uint64_t bare_received;
};
MR__BASE_CHECK();

/* ------------------------------------------------------------------------ */
/* Small helpers, some on the per-message path.                             */

static inline size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* Writes the header of a message from this rank. */
static inline void hdr_pack(const mr_substrate_t *s, uint8_t *h, unsigned kind, uint32_t imm)
{
    ucx_wire_hdr_t w = {.kind = (uint8_t)kind, .imm = imm, .source = s->base.rank,
                        .failures_seen = s->failures_seen};

    mr__ucx_wire_hdr_encode(h, &w);
}

/* Takes a send state from a free list, or NULL (its link comes first). */
static inline ucx_sreq_t *sreq_pop(mr__sreq_t **free_list)
{
    return (ucx_sreq_t *)(void *)mr__sreq_pop(free_list);
}

static inline void ctrl_free(mr_substrate_t *s, ucx_sreq_t *r)
{
    mr__sreq_push(&s->free_ctrl, &r->link);
}

/* A sent batch: its messages complete at the next progress call. */
static inline void batch_done_push(mr_substrate_t *s, mr__batch_t *b)
{
    b->next_free = s->batches_done;
    s->batches_done = b;
}

/* Whether a held UCX buffer is delivered in place rather than copied. */
static inline bool zcopy_ok(const mr_substrate_t *s, size_t length)
{
    return length > 0 && length >= s->cfg.zcopy_thresh;
}

static inline ucx_rx_t *rxq_at(mr_substrate_t *s, size_t i)
{
    return &s->rxq[(s->rxq_head + i) & (s->rxq_cap - 1)];
}

/* Whether entries wait for slots that only the application can free. */
static inline bool rx_paused(const mr_substrate_t *s)
{
    return s->rxq_count > s->rxq_claimed && s->nreceiving == 0;
}

/* ------------------------------------------------------------------------ */
/* Functions shared between the files, by the file that holds them.         */

/* ucx_settings.c */
void ucx__mark_own_settings(void);

/* ucx_host.c */
void ucx__host_identity(uint64_t *boot_hash, uint64_t *pidns);
void ucx__peer_watch_process(mr_substrate_t *s, ucx_peer_t *p, uint64_t pidns);
void ucx__check_events(mr_substrate_t *s, int timeout_ms);

/* ucx_open.c */
mr_status_t ucx__open(const mr_substrate_params_t *p, mr_substrate_t **out);
mr_status_t ucx__get_address(mr_substrate_t *s, void *addr, size_t *length);
void ucx__format_address(const void *addr, size_t length, char *buf, size_t len);

/* ucx_connect.c */
/* Whether a UCX request handle is done (freeing it when it is). */
bool ucx__req_done(void **req, ucs_status_t *status);
/* Gives peer `p` its endpoint (and pidfd) if it has none yet: the first send or watch(). */
mr_status_t ucx__peer_endpoint(mr_substrate_t *s, ucx_peer_t *p);
mr_status_t ucx__connect(mr_substrate_t *s, const void *addrs, size_t addr_len);
mr_status_t ucx__watch(mr_substrate_t *s, int rank);
/* preconnect(): the endpoint to `rank`, wired up (MR_AGAIN until it is). */
mr_status_t ucx__preconnect(mr_substrate_t *s, int rank);
/* closing(): flushes every endpoint, so that close() may release them without a flush. */
void ucx__closing(mr_substrate_t *s);

/* ucx_send.c */
void ucx__flush_batches(mr_substrate_t *s);
mr_status_t ucx__send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                      const void *data, size_t length, void *cookie);
mr_status_t ucx__send_control(mr_substrate_t *s, int dest, uint32_t imm);

/* ucx_sreq.c */
ucx_sreq_t *ucx__sreq_at(const mr_substrate_t *s, const ucx_sreq_block_t *b, size_t i);
mr_status_t ucx__sreq_block_add(mr_substrate_t *s, size_t ndata, size_t nctrl);
int ucx__batches_complete(mr_substrate_t *s);
void ucx__send_cb(void *request, ucs_status_t status, void *user_data);

/* ucx_am.c */
mr_status_t ucx__set_handlers(mr_substrate_t *s);
int ucx__drain_ctrlq(mr_substrate_t *s);

/* ucx_rxq.c */
bool ucx__spill_store(mr_substrate_t *s, ucx_rx_t *e, const void *data, size_t len);
ucx_rx_t *ucx__rxq_push(mr_substrate_t *s);
void ucx__rx_wait(mr_substrate_t *s, ucx_rx_t *e);
void ucx__rreq_free(mr_substrate_t *s, ucx_rreq_t *r);
bool ucx__rx_start_rndv(mr_substrate_t *s, ucx_rx_t *e, void *desc);
int ucx__rx_drain(mr_substrate_t *s);
bool ucx__rx_any_receiving(mr_substrate_t *s);

/* ucx_failure.c */
bool ucx__is_peer_gone_status(ucs_status_t st);
void ucx__peer_fail(mr_substrate_t *s, int rank, ucs_status_t why);
void ucx__abandon(mr_substrate_t *s, int rank);
void ucx__ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status);
int ucx__drain_failed(mr_substrate_t *s);

/* ucx_ops.c */
void ucx__close(mr_substrate_t *s);

#endif /* UCX_SUBSTRATE_H */
