/*
 * The UCX substrate: UCP active messages over one worker per rank. Its
 * settings, connection rounds, receive path (fast path, arrival queue, spill
 * area, backpressure), failure detection and closing are described in
 * docs/architecture.md, "The UCX substrate" (#the-ucx-substrate); ucx_wire.c
 * reads and writes its address blob and message headers.
 */
#include "mr_batch.h"
#include "mr_substrate_base.h"
#include "ucx_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/config/parser.h>

/* ------------------------------------------------------------------------ */
/* Constants of the wire format and of the implementation.                  */

#define UCX_AM_DATA 0x4d31 /* AM ids; this worker is MailRail's own. */
#define UCX_AM_CTRL 0x4d32
/*
 * Data without a user header: the AM id names the sender and the kind,
 * UCX_AM_BARE + 2 * source + (kind == MR_KIND_ITEMS). Used for a message that
 * has nothing else to say (no credits, no failures seen), so that the
 * receiver never touches a header, which UCX places after the payload: at
 * 4 KiB reading it costs a cache miss per message (docs/performance.md).
 */
#define UCX_AM_BARE 0x4d40
#define UCX_BARE_MAX_RANKS ((UINT16_MAX - UCX_AM_BARE) / 2)

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
#define UCX_CONNECT_POLL_MS 10    /* Sleep per idle round of connect(). */
#define UCX_CLOSE_FLUSH_S 5       /* Longest BYE round in close(). */
#define UCX_CLOSE_EP_MS 1000      /* Longest wait for the endpoints to close after it. */
#define UCX_PROTO_LOG_BURST 10    /* Protocol errors logged before going quiet. */
#define UCX_MAX_EVENTS 32
/* Coalescing (mr_batch.h): batches being filled or in flight, and their size at most. */
#define UCX_BATCHES 32u
#define UCX_BATCH_BYTES 4096u

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

enum { ERRMODE_AUTO = 0, ERRMODE_NONE = 1, ERRMODE_PEER = 2 };

static const char *const ucx_error_modes[] = {"auto", "none", "peer", NULL};

typedef struct ucx_config {
    unsigned error_mode;
    uint64_t zcopy_thresh;
    uint64_t spill_size;
    bool bare;
} ucx_config_t;

/* The two ends of an endpoint must use the same error handling mode. */
static const char *const ucx_job_wide_settings[] = {"MAILRAIL_UCX_ERROR_MODE", NULL};

static const mr_config_entry_t ucx_config_table[] = {
    {.name = "MAILRAIL_UCX_ERROR_MODE",
     .default_value = "auto",
     .type = MR_CONFIG_ENUM,
     .offset = offsetof(ucx_config_t, error_mode),
     .choices = ucx_error_modes,
     .doc = "UCX error handling towards each peer: peer makes UCX report dead peers, but UCX "
            "1.13 then replaces shared memory between ranks of one host by TCP loopback (over "
            "10 times fewer messages per second); none keeps shared memory, and UCX reports no "
            "dead peer; auto is none within a host and peer between hosts. A dead peer on the "
            "same host is detected in every mode, through its process descriptor (pidfd). Must "
            "be the same on every rank."},
    {.name = "MAILRAIL_UCX_ZCOPY_THRESH",
     .default_value = "0",
     .type = MR_CONFIG_SIZE,
     .offset = offsetof(ucx_config_t, zcopy_thresh),
     .min = 0,
     .max = UINT64_C(1) << 30,
     .doc = "Messages of at least this many bytes that UCX lets the receiver keep are delivered "
            "in UCX's buffer instead of being copied into a receive slot (zero copy); each still "
            "takes one receive slot's credit. 0 keeps every buffer UCX allows."},
    {.name = "MAILRAIL_UCX_SPILL_SIZE",
     .default_value = "256K",
     .type = MR_CONFIG_SIZE,
     .offset = offsetof(ucx_config_t, spill_size),
     .min = 0,
     .max = UINT64_C(1) << 32,
     .doc = "Bytes set aside per rank for messages that arrive when every receive slot is taken "
            "(possible only with MAILRAIL_FLOWCTL=none) and that UCX will not let the receiver "
            "keep; beyond it they are copied to the heap. The rank then stops taking messages "
            "until slots free up, so little of it is used."},
    {.name = "MAILRAIL_UCX_BARE",
     .default_value = "yes",
     .type = MR_CONFIG_BOOL,
     .offset = offsetof(ucx_config_t, bare),
     .doc = "Sends a message that carries no credits without MailRail's header, naming the "
            "sender and the kind by the active-message id, so that the receiver reads no header "
            "(jobs of at most 22879 ranks). Receivers take both forms either way."},
    {.name = NULL},
};

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
    bool fail_queued;
    bool same_host;            /* Same kernel (boot id). */
    bool err_peer;             /* Its endpoint has UCP_ERR_HANDLING_MODE_PEER. */
    bool got[4];               /* HELLO, READY, BYE received (indexed by kind). */
    bool exited;               /* Its pidfd said so. */
    ucs_status_t fail_status;
    ucp_ep_h ep;
    void *close_req;
    void *conn_req[2];         /* HELLO, READY or BYE round: our send and the flush. */
    uint8_t conn_hdr[UCX_WIRE_HDR_LEN];
    uint32_t pid;
    int pidfd;
} ucx_peer_t;

struct mr_substrate {
    mr__substrate_base_t base; /* base.closing: peer failures are expected. */
    ucx_config_t cfg;
    uint32_t hello_token;

    ucp_context_h context;
    ucp_worker_h worker;
    size_t ucx_req_size;       /* Bytes UCX needs before each user request. */
    int efd;                   /* The worker's event fd, or -1. */
    int epfd;                  /* epoll over efd and the pidfds. */
    size_t npidfds;

    uint8_t addr[MR_SUBSTRATE_ADDR_MAX];
    size_t addr_len;
    uint64_t boot_hash, pidns;

    bool connect_started, connected;
    bool closed;               /* close() runs: data is dropped, failures are expected. */
    bool upcalls_ok;           /* Inside progress(): callbacks may call the core. */
    int cb_events;             /* Upcalls made from callbacks in this progress() call. */

    ucx_peer_t *peers;
    int *failq;                /* Ranks whose failure awaits reporting (FIFO of size). */
    int failq_head, failq_count;

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

    /* Control messages that arrived outside progress() (only possible in connect()). */
    uint32_t *ctrlq;           /* (source, imm) pairs. */
    size_t ctrlq_cap, ctrlq_head, ctrlq_count;

    /* Spill area: a ring of bytes, allocated and freed in FIFO order. */
    uint8_t *spill;
    size_t spill_cap, spill_head, spill_tail, spill_used;
    bool spill_warned;

    uint64_t next_pidfd_check;
    uint64_t next_hinted_check;
    uint8_t failures_seen;     /* Peer failures found (saturating); sent in every header. */
    bool bare;                 /* Sends without a header when it has nothing to say. */
    uint64_t proto_errors;
    uint64_t spilled, spilled_heap, paused_calls, zcopy_delivered, rndv_received, held;
    uint64_t bare_received;
};
MR__BASE_CHECK();

static void ucx_close(mr_substrate_t *s);
static void check_events(mr_substrate_t *s, int timeout_ms);

/* ------------------------------------------------------------------------ */
/* Small helpers.                                                            */

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* Writes the header of a message from this rank. */
static void hdr_pack(const mr_substrate_t *s, uint8_t *h, unsigned kind, uint32_t imm)
{
    ucx_wire_hdr_t w = {.kind = (uint8_t)kind, .imm = imm, .source = s->base.rank,
                        .failures_seen = s->failures_seen};

    mr__ucx_wire_hdr_encode(h, &w);
}

static bool is_peer_gone_status(ucs_status_t st)
{
    return st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_ENDPOINT_TIMEOUT ||
           st == UCS_ERR_UNREACHABLE || st == UCS_ERR_REJECTED || st == UCS_ERR_CANCELED ||
           st == UCS_ERR_IO_ERROR || st == UCS_ERR_NOT_CONNECTED;
}

/* Logs a malformed message, the first few at error level, then only at debug level. */
static void proto_error(mr_substrate_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void proto_error(mr_substrate_t *s, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    mr_log_level_t level;

    s->proto_errors++;
    level = s->proto_errors <= UCX_PROTO_LOG_BURST ? MR_LOG_ERROR : MR_LOG_DEBUG;
    if (s->base.log == NULL || !mr__log_enabled(&s->base, level)) return;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    s->base.log(level, "UCX substrate: dropped a malformed message (%s)%s.", what,
                s->proto_errors == UCX_PROTO_LOG_BURST
                    ? "; further ones are logged at debug level"
                    : "");
}

/* ------------------------------------------------------------------------ */
/* Host identity, for the error mode and the pidfd watch.                   */

static void host_identity(uint64_t *boot_hash, uint64_t *pidns)
{
    char buf[64];
    struct stat st;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);

    *boot_hash = 0;
    *pidns = 0;
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) *boot_hash = mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, buf, (size_t)n);
        close(fd);
    }
    if (stat("/proc/self/ns/pid", &st) == 0) *pidns = ((uint64_t)st.st_dev << 32) ^ st.st_ino;
}

static int pidfd_open_compat(uint32_t pid)
{
#ifdef SYS_pidfd_open
    static bool unsupported; /* ENOSYS once (old kernel, valgrind): do not ask again. */
    int fd;

    if (unsupported) {
        errno = ENOSYS;
        return -1;
    }
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 && errno == ENOSYS) unsupported = true;
    return fd;
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* ------------------------------------------------------------------------ */
/* Telling UCX that the plugin's MAILRAIL_UCX_* settings are not its own.   */

static int known_read(const char *buf, void *dest, const void *arg)
{
    (void)buf;
    (void)dest;
    (void)arg;
    return 1;
}

static int known_write(char *buf, size_t max, const void *src, const void *arg)
{
    (void)src;
    (void)arg;
    if (max > 0) buf[0] = '\0';
    return 1;
}

static ucs_status_t known_clone(const void *src, void *dest, const void *arg)
{
    (void)src;
    (void)dest;
    (void)arg;
    return UCS_OK;
}

static void known_release(void *ptr, const void *arg)
{
    (void)ptr;
    (void)arg;
}

static void known_help(char *buf, size_t max, const void *arg)
{
    (void)arg;
    if (max > 0) buf[0] = '\0';
}

/*
 * UCX warns, once per process, about every set variable that starts with
 * MAILRAIL_UCX_ and that no UCX table read. Parsing our names through a
 * throw-away UCX table with a no-op parser marks them as read.
 */
static void mark_own_settings(void)
{
    enum { MAX_OWN = 8 };
    ucs_config_field_t fields[MAX_OWN + 1];
    size_t n = 0, plen = strlen(UCX_OWN_PREFIX);
    uint64_t dummy = 0;

    memset(fields, 0, sizeof(fields));
    for (const mr_config_entry_t *e = ucx_config_table; e->name != NULL && n < MAX_OWN; e++) {
        if (strncmp(e->name, UCX_OWN_PREFIX, plen) != 0) continue;
        fields[n].name = e->name + plen;
        fields[n].dfl_value = "";
        fields[n].doc = "";
        fields[n].offset = 0;
        fields[n].parser.read = known_read;
        fields[n].parser.write = known_write;
        fields[n].parser.clone = known_clone;
        fields[n].parser.release = known_release;
        fields[n].parser.help = known_help;
        fields[n].parser.arg = NULL;
        n++;
    }
    if (ucs_config_parser_fill_opts(&dummy, fields, UCX_OWN_PREFIX, NULL, 1) == UCS_OK) {
        ucs_config_parser_release_opts(&dummy, fields);
    }
}

/* ------------------------------------------------------------------------ */
/* Send state.                                                               */

static ucx_sreq_t *sreq_at(const mr_substrate_t *s, const ucx_sreq_block_t *b, size_t i)
{
    return (ucx_sreq_t *)(void *)(b->mem + i * s->sreq_stride + align_up(s->ucx_req_size, 64));
}

static ucx_rreq_t *rreq_at(mr_substrate_t *s, size_t i)
{
    return (ucx_rreq_t *)(void *)(s->rreq_mem + i * s->rreq_stride +
                                  align_up(s->ucx_req_size, 64));
}

/* Takes a send state from a free list, or NULL (its link comes first). */
static ucx_sreq_t *sreq_pop(mr__sreq_t **free_list)
{
    return (ucx_sreq_t *)(void *)mr__sreq_pop(free_list);
}

static void ctrl_free(mr_substrate_t *s, ucx_sreq_t *r)
{
    mr__sreq_push(&s->free_ctrl, &r->link);
}

/*
 * Adds a block of `ndata` data and `nctrl` control send states to the free
 * lists. Not on the hot path: at open, and when a peer's sends are retired.
 */
static mr_status_t sreq_block_add(mr_substrate_t *s, size_t ndata, size_t nctrl)
{
    ucx_sreq_block_t *blocks = realloc(s->sreq_blocks,
                                       (s->nsreq_blocks + 1) * sizeof(*s->sreq_blocks));
    ucx_sreq_block_t *b;

    if (blocks == NULL) return MR_ERR_NO_MEMORY;
    s->sreq_blocks = blocks;
    b = &blocks[s->nsreq_blocks];
    b->n = ndata + nctrl;
    b->mem = aligned_alloc(64, s->sreq_stride * b->n);
    if (b->mem == NULL) return MR_ERR_NO_MEMORY;
    s->nsreq_blocks++;
    memset(b->mem, 0, s->sreq_stride * b->n);
    for (size_t i = b->n; i-- > 0;) {
        ucx_sreq_t *r = sreq_at(s, b, i);
        r->s = s;
        r->ctrl = i >= ndata;
        if (r->ctrl) {
            ctrl_free(s, r);
        } else {
            mr__sreq_push(&s->free_sreqs, &r->link);
        }
    }
    return MR_OK;
}

/* Queues the failure of `rank` for the next progress call. Idempotent. */
static void peer_fail(mr_substrate_t *s, int rank, ucs_status_t why)
{
    ucx_peer_t *p;

    if (rank < 0 || rank >= s->base.size || rank == s->base.rank) return;
    p = &s->peers[rank];
    if (p->state != P_OK || p->fail_queued) return;
    p->fail_queued = true;
    p->fail_status = why;
    if (s->failures_seen < UINT8_MAX) s->failures_seen++;
    s->failq[(s->failq_head + s->failq_count) % s->base.size] = rank;
    s->failq_count++;
}

/* A sent batch: its messages complete at the next progress call. */
static void batch_done_push(mr_substrate_t *s, mr__batch_t *b)
{
    b->next_free = s->batches_done;
    s->batches_done = b;
}

/* Completes every message of the batches sent (or given up); returns how many. */
static int batches_complete(mr_substrate_t *s)
{
    int n = 0;

    while (s->batches_done != NULL) {
        mr__batch_t *b = s->batches_done;
        s->batches_done = b->next_free;
        n += mr__batcher_complete(&s->batcher, b, &s->base.up, s->base.core);
    }
    return n;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_sreq_t *r = request;
    mr_substrate_t *s = r->s;

    (void)user_data;
    if (r->retired) return; /* Already reported; its memory is never used again. */
    r->inflight = false;
    if (status != UCS_OK && !s->base.closing && !s->closed && is_peer_gone_status(status)) {
        peer_fail(s, r->dest, status);
    }
    if (r->ctrl) {
        ctrl_free(s, r);
        return;
    }
    if (r->batch != NULL) {
        batch_done_push(s, r->batch);
        r->batch = NULL;
        mr__sreq_push(&s->free_sreqs, &r->link);
        return;
    }
    mr__done_push(&s->done, &r->link);
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *p = arg;

    (void)ep;
    peer_fail(p->s, p->rank, status);
}

/* ------------------------------------------------------------------------ */
/* The spill area.                                                           */

/* Copies `len` bytes aside for a waiting entry; false only when out of memory. */
static bool spill_store(mr_substrate_t *s, ucx_rx_t *e, const void *data, size_t len)
{
    size_t need = align_up(len ? len : 1, 16), off = SIZE_MAX, end = 0;

    if (s->spill_cap >= need) {
        if (s->spill_used == 0) s->spill_head = s->spill_tail = 0;
        if (s->spill_tail >= s->spill_head && s->spill_used < s->spill_cap) {
            if (s->spill_cap - s->spill_tail >= need) {
                off = s->spill_tail;
            } else if (s->spill_head >= need) {
                /* Wrap: the gap at the end is freed with this entry. */
                s->spill_used += s->spill_cap - s->spill_tail;
                off = 0;
            }
        } else if (s->spill_tail < s->spill_head && s->spill_head - s->spill_tail >= need) {
            off = s->spill_tail;
        }
    }
    e->state = RX_SPILL;
    e->length = len;
    if (off != SIZE_MAX) {
        end = off + need;
        s->spill_tail = end;
        s->spill_used += need;
        e->heap = false;
        e->data = s->spill + off;
        e->spill_end = end;
    } else {
        e->heap = true;
        e->data = malloc(len ? len : 1);
        if (e->data == NULL) return false;
        s->spilled_heap++;
        if (!s->spill_warned) {
            s->spill_warned = true;
            MR__LOG(s, MR_LOG_WARN, "UCX substrate: every receive slot is taken and the %zu-byte "
                    "spill area is full: messages are copied to the heap. Use credit flow control "
                    "(MAILRAIL_FLOWCTL=rank or node) or raise MAILRAIL_UCX_SPILL_SIZE.",
                    s->spill_cap);
        }
    }
    if (len > 0) memcpy(e->data, data, len);
    s->spilled++;
    return true;
}

/* Releases the copy of a spilled entry (in FIFO order for the arena). */
static void spill_release(mr_substrate_t *s, ucx_rx_t *e)
{
    if (e->heap) {
        free(e->data);
    } else {
        size_t start = s->spill_head;
        size_t freed = e->spill_end > start ? e->spill_end - start
                                            : (s->spill_cap - start) + e->spill_end;
        s->spill_used -= freed < s->spill_used ? freed : s->spill_used;
        s->spill_head = e->spill_end;
        if (s->spill_used == 0) s->spill_head = s->spill_tail = 0;
    }
    e->data = NULL;
}

/* ------------------------------------------------------------------------ */
/* The arrival queue.                                                        */

static ucx_rx_t *rxq_at(mr_substrate_t *s, size_t i)
{
    return &s->rxq[(s->rxq_head + i) & (s->rxq_cap - 1)];
}

/* A new entry at the tail, or NULL when out of memory (the queue doubles when full). */
static ucx_rx_t *rxq_push(mr_substrate_t *s)
{
    if (s->rxq_count == s->rxq_cap) {
        size_t cap = s->rxq_cap * 2;
        ucx_rx_t *q = malloc(cap * sizeof(*q));
        if (q == NULL) return NULL;
        for (size_t i = 0; i < s->rxq_count; i++) q[i] = *rxq_at(s, i);
        free(s->rxq);
        s->rxq = q;
        s->rxq_cap = cap;
        s->rxq_head = 0;
    }
    ucx_rx_t *e = &s->rxq[(s->rxq_head + s->rxq_count) & (s->rxq_cap - 1)];
    s->rxq_count++;
    memset(e, 0, sizeof(*e));
    return e;
}

static void rxq_pop(mr_substrate_t *s)
{
    s->rxq_head = (s->rxq_head + 1) & (s->rxq_cap - 1);
    s->rxq_count--;
}

static void rreq_free(mr_substrate_t *s, ucx_rreq_t *r)
{
    r->next = s->free_rreqs;
    s->free_rreqs = r;
}

static void recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_rreq_t *r = request;

    (void)length;
    (void)user_data;
    r->status = status;
    r->done = true;
}

/*
 * Starts receiving a rendezvous into a fresh slot. The entry becomes
 * RX_READY, RX_RECEIVING or RX_FAILED; false (nothing changed) when no slot
 * or no receive state is free.
 */
static bool rx_start_rndv(mr_substrate_t *s, ucx_rx_t *e, void *desc)
{
    ucx_rreq_t *r = s->free_rreqs;
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    void *slot;

    if (r == NULL) return false;
    slot = s->base.up.recv_slot_acquire(s->base.core);
    if (slot == NULL) return false;
    s->free_rreqs = r->next;
    r->done = false;
    r->status = UCS_INPROGRESS;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.recv_am = recv_cb;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    e->data = slot;
    sp = ucp_am_recv_data_nbx(s->worker, desc, slot, e->length, &param);
    if (sp == NULL) {
        rreq_free(s, r);
        e->state = RX_READY;
    } else if (UCS_PTR_IS_ERR(sp)) {
        rreq_free(s, r);
        e->state = RX_FAILED;
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: cannot receive a %zu-byte rendezvous message from "
                "rank %d: %s; it is lost.", e->length, (int)e->source,
                ucs_status_string(UCS_PTR_STATUS(sp)));
    } else {
        e->state = RX_RECEIVING;
        e->rreq = r;
        s->nreceiving++;
    }
    s->rndv_received++;
    return true;
}

/* A receiving entry whose rendezvous completed becomes ready or failed. */
static void rx_finish_rndv(mr_substrate_t *s, ucx_rx_t *e)
{
    ucx_rreq_t *r = e->rreq;

    e->rreq = NULL;
    s->nreceiving--;
    if (r->status == UCS_OK) {
        e->state = RX_READY;
    } else {
        e->state = RX_FAILED;
        if (!s->base.closing && !s->closed) {
            MR__LOG(s, MR_LOG_WARN, "UCX substrate: a %zu-byte rendezvous message from rank %d "
                    "failed: %s; it is lost.", e->length, (int)e->source,
                    ucs_status_string(r->status));
        }
    }
    rreq_free(s, r);
}

/* Whether a held UCX buffer is delivered in place rather than copied. */
static bool zcopy_ok(const mr_substrate_t *s, size_t length)
{
    return length > 0 && length >= s->cfg.zcopy_thresh;
}

/*
 * Gives a waiting entry a slot: copies a held buffer or a spilled copy into
 * it, or starts the rendezvous. false when no slot is free.
 */
static bool rx_claim(mr_substrate_t *s, ucx_rx_t *e)
{
    void *slot;

    if (e->state == RX_RNDV_WAIT) return rx_start_rndv(s, e, e->data);
    slot = s->base.up.recv_slot_acquire(s->base.core);
    if (slot == NULL) return false;
    if (e->length > 0) memcpy(slot, e->data, e->length);
    if (e->state == RX_HELD) ucp_am_data_release(s->worker, e->data);
    else spill_release(s, e);
    e->data = slot;
    e->state = RX_READY;
    return true;
}

static void deliver_slot(mr_substrate_t *s, int source, unsigned kind, uint32_t imm, void *slot,
                         size_t length)
{
    mr_status_t st = s->base.up.deliver(s->base.core, source, kind, imm, slot, length, NULL);
    if (st != MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank %d "
                "(status %d).", source, (int)st);
    }
}

/*
 * Delivers what the head of the queue allows and hands slots to waiting
 * entries in arrival order. Upcalls: progress() only. Returns the deliveries.
 */
static int rx_drain(mr_substrate_t *s)
{
    int n = 0;

    while (s->rxq_count > 0) {
        ucx_rx_t *e = rxq_at(s, 0);

        if (e->state == RX_RECEIVING) {
            if (!e->rreq->done) break;
            rx_finish_rndv(s, e);
        }
        if (e->state == RX_READY || e->state == RX_FAILED) {
            ucx_rx_t c = *e;
            rxq_pop(s);
            s->rxq_claimed--;
            if (c.state == RX_READY) {
                deliver_slot(s, c.source, c.kind, c.imm, c.data, c.length);
                n++;
            } else {
                s->base.up.recv_slot_abandon(s->base.core, c.data);
            }
            continue;
        }
        /* The head waits for a slot. */
        if (e->state == RX_HELD && zcopy_ok(s, e->length)) {
            mr_status_t st = s->base.up.deliver(s->base.core, e->source, e->kind, e->imm, e->data,
                                                e->length, e->data);
            if (st == MR_AGAIN) break;
            if (st != MR_OK) {
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank %d "
                        "(status %d).", (int)e->source, (int)st);
                ucp_am_data_release(s->worker, e->data);
            } else {
                s->zcopy_delivered++;
                n++;
            }
            rxq_pop(s);
            continue;
        }
        if (!rx_claim(s, e)) break;
        s->rxq_claimed++;
    }
    /* Waiting entries behind a rendezvous in flight may take slots, in order. */
    while (s->rxq_claimed < s->rxq_count && s->rxq_claimed > 0) {
        if (!rx_claim(s, rxq_at(s, s->rxq_claimed))) break;
        s->rxq_claimed++;
    }
    return n;
}

/* Whether entries wait for slots that only the application can free. */
static bool rx_paused(const mr_substrate_t *s)
{
    return s->rxq_count > s->rxq_claimed && s->nreceiving == 0;
}

/* ------------------------------------------------------------------------ */
/* Active-message handlers (inside ucp_worker_progress()).                   */

/* Checks a header; fills kind, imm and source, or logs and returns false. */
static bool hdr_parse(mr_substrate_t *s, const char *what, const void *header, size_t header_len,
                      uint8_t *kind, uint32_t *imm, int *source)
{
    ucx_wire_hdr_t h;
    ucx_wire_error_t err;

    if (mr__ucx_wire_hdr_decode(header, header_len, s->base.rank, s->base.size, &h, &err) !=
        MR_OK) {
        if (err.fault == UCX_WIRE_BAD_HDR_LEN) {
            proto_error(s, "%s header of %zu bytes instead of %d", what, header_len,
                        UCX_WIRE_HDR_LEN);
        } else {
            proto_error(s, "%s from rank %d, which is not a peer in a job of %d", what,
                        (int)err.value, s->base.size);
        }
        return false;
    }
    *kind = h.kind;
    *imm = h.imm;
    *source = h.source;
    /*
     * The sender knows of more failed peers than we do: look at the pidfds
     * now, so that a failure is reported no later than a message sent after
     * its discovery (rate-limited for failures a pidfd cannot show).
     */
    if (h.failures_seen > s->failures_seen && s->npidfds > 0) {
        uint64_t now = mr__now_ns();
        if (now >= s->next_hinted_check) {
            s->next_hinted_check = now + UCX_HINTED_CHECK_US * 1000;
            check_events(s, 0);
        }
    }
    return true;
}

/* A new arrival at the tail of the queue, or NULL (logged: it is lost) when out of memory. */
static ucx_rx_t *rx_enqueue(mr_substrate_t *s, int source, unsigned kind, uint32_t imm,
                            size_t length)
{
    ucx_rx_t *e = rxq_push(s);

    if (e == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for the arrival queue; a %zu-byte "
                "message from rank %d is lost.", length, source);
        return NULL;
    }
    e->kind = (uint8_t)kind;
    e->imm = imm;
    e->source = source;
    e->length = length;
    return e;
}

/* Copies the tail arrival `e` into the spill area; out of memory, it is dropped and logged. */
static void rx_spill(mr_substrate_t *s, ucx_rx_t *e, const void *data)
{
    if (spill_store(s, e, data, e->length)) return;
    s->rxq_count--; /* Undo the push. */
    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for a %zu-byte message from rank %d "
            "arriving while every receive slot is taken; it is lost.", e->length, (int)e->source);
}

/*
 * A batch of small messages (mr_batch.h): each frame is copied into a
 * receive slot of its own, or, behind earlier arrivals or with no slot free,
 * into the spill area to wait in the arrival queue like any message.
 */
static ucs_status_t batch_recv(mr_substrate_t *s, int source, const uint8_t *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    bool direct = s->upcalls_ok && s->rxq_count == 0;
    size_t off = 0, plen;
    const uint8_t *payload;
    unsigned kind;
    int r;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        proto_error(s, "a batch from rank %d sent by rendezvous", source);
        return UCS_OK;
    }
    while ((r = mr__batch_frame_next(data, length, &off, &kind, &payload, &plen)) == 1) {
        if (direct &&
            s->base.up.deliver_copy(s->base.core, source, kind, 0, payload, plen) == MR_OK) {
            s->cb_events++;
            continue;
        }
        direct = false; /* The rest queue behind this one, in order. */
        ucx_rx_t *e = rx_enqueue(s, source, kind, 0, plen);
        if (e != NULL) rx_spill(s, e, payload);
    }
    if (r < 0) proto_error(s, "a batch from rank %d whose frames do not add up", source);
    return UCS_OK;
}

/* One arriving data message, from either handler: delivered, queued or held. */
static ucs_status_t data_recv(mr_substrate_t *s, unsigned kind, uint32_t imm, int source,
                             void *data, size_t length, const ucp_am_recv_param_t *param)
{
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool holdable = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    bool may_claim;
    ucx_rx_t *e;
    void *slot;

    if (length > s->base.datagram_size) {
        proto_error(s, "%zu-byte data from rank %d, more than the %zu-byte datagram", length,
                    source, s->base.datagram_size);
        return UCS_OK;
    }
    if (kind == UCX_WIRE_DATA_BATCH) return batch_recv(s, source, data, length, param);
    /* A slot may be taken now only when no earlier arrival still waits for one. */
    may_claim = s->upcalls_ok && s->rxq_claimed == s->rxq_count;

    if (may_claim && s->rxq_count == 0) {
        /* Fast path: nothing queued, deliver at once. */
        if (!rndv) {
            if (holdable && zcopy_ok(s, length)) {
                mr_status_t st = s->base.up.deliver(s->base.core, source, kind, imm, data,
                                                    length, data);
                if (st == MR_OK) {
                    s->zcopy_delivered++;
                    s->cb_events++;
                    return UCS_INPROGRESS;
                }
                if (st != MR_AGAIN) {
                    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the core refused a message from rank "
                            "%d (status %d).", source, (int)st);
                    return UCS_OK;
                }
            } else if (s->base.up.deliver_copy(s->base.core, source, kind, imm, data, length) ==
                       MR_OK) {
                s->cb_events++;
                return UCS_OK;
            }
            may_claim = false; /* No slot: the message waits. */
        }
    }

    e = rx_enqueue(s, source, kind, imm, length);
    if (e == NULL) return UCS_OK;
    if (rndv) {
        e->state = RX_RNDV_WAIT;
        e->data = data;
        if (may_claim && rx_start_rndv(s, e, data)) {
            s->rxq_claimed++;
            /* Completed at once with nothing ahead: deliver now. */
            if (e->state == RX_READY && s->rxq_count == 1) s->cb_events += rx_drain(s);
        }
        return UCS_INPROGRESS; /* UCX keeps the descriptor, or the receive owns it. */
    }
    if (may_claim && (slot = s->base.up.recv_slot_acquire(s->base.core)) != NULL) {
        /* Behind a rendezvous in flight: copy now, deliver in turn. */
        if (length > 0) memcpy(slot, data, length);
        e->state = RX_READY;
        e->data = slot;
        s->rxq_claimed++;
        return UCS_OK;
    }
    if (holdable) {
        e->state = RX_HELD;
        e->data = data;
        s->held++;
        return UCS_INPROGRESS;
    }
    rx_spill(s, e, data);
    return UCS_OK;
}

static ucs_status_t data_am_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    mr_substrate_t *s = arg;
    uint8_t kind;
    uint32_t imm;
    int source;

    if (s->closed) return UCS_OK; /* Finalizing: nobody receives any more. */
    if (!hdr_parse(s, "data", header, header_length, &kind, &imm, &source)) return UCS_OK;
    return data_recv(s, kind, imm, source, data, length, param);
}

/* Header-less data (UCX_AM_BARE): the handler's argument is the sender's peer entry. */
static ucs_status_t bare_recv(ucx_peer_t *p, unsigned kind, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
    mr_substrate_t *s = p->s;

    if (s->closed) return UCS_OK;
    if (header_length != 0) {
        proto_error(s, "header-less data from rank %d with a %zu-byte header", p->rank,
                    header_length);
        return UCS_OK;
    }
    s->bare_received++;
    return data_recv(s, kind, 0, p->rank, data, length, param);
}

static ucs_status_t bare_data_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    return bare_recv(arg, MR_KIND_DATA, header_length, data, length, param);
}

static ucs_status_t bare_items_am_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    return bare_recv(arg, MR_KIND_ITEMS, header_length, data, length, param);
}

static void ctrlq_push(mr_substrate_t *s, int source, uint32_t imm)
{
    if (s->ctrlq_count == s->ctrlq_cap) {
        size_t cap = s->ctrlq_cap ? s->ctrlq_cap * 2 : 64;
        uint32_t *q = malloc(cap * 2 * sizeof(*q));
        if (q == NULL) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory; a control message from rank "
                    "%d is lost.", source);
            return;
        }
        for (size_t i = 0; i < s->ctrlq_count; i++) {
            size_t k = (s->ctrlq_head + i) % s->ctrlq_cap;
            q[2 * i] = s->ctrlq[2 * k];
            q[2 * i + 1] = s->ctrlq[2 * k + 1];
        }
        free(s->ctrlq);
        s->ctrlq = q;
        s->ctrlq_cap = cap;
        s->ctrlq_head = 0;
    }
    size_t k = (s->ctrlq_head + s->ctrlq_count) % s->ctrlq_cap;
    s->ctrlq[2 * k] = (uint32_t)source;
    s->ctrlq[2 * k + 1] = imm;
    s->ctrlq_count++;
}

static ucs_status_t ctrl_am_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    mr_substrate_t *s = arg;
    uint8_t kind;
    uint32_t imm;
    int source;

    (void)data;
    if (!hdr_parse(s, "control", header, header_length, &kind, &imm, &source)) return UCS_OK;
    if (length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        proto_error(s, "control message from rank %d with a %zu-byte payload", source, length);
        return UCS_OK;
    }
    switch (kind) {
    case UCX_WIRE_CTRL_CREDIT:
        if (s->closed) break;
        if (s->upcalls_ok) {
            s->base.up.control(s->base.core, source, imm);
            s->cb_events++;
        } else {
            ctrlq_push(s, source, imm);
        }
        break;
    case UCX_WIRE_CTRL_HELLO:
    case UCX_WIRE_CTRL_READY:
    case UCX_WIRE_CTRL_BYE:
        if (imm != s->hello_token) {
            proto_error(s, "connection message from rank %d of another job (token %08x)",
                        source, (unsigned)imm);
            break;
        }
        s->peers[source].got[kind] = true;
        break;
    default:
        proto_error(s, "control message of unknown kind %u from rank %d", kind, source);
        break;
    }
    return UCS_OK;
}

/* ------------------------------------------------------------------------ */
/* Upcall drains (progress() only).                                          */

static void peer_force_close(mr_substrate_t *s, ucx_peer_t *p)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;

    if (p->ep == NULL) return;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    sp = ucp_ep_close_nbx(p->ep, &param);
    p->ep = NULL;
    if (UCS_PTR_IS_PTR(sp)) p->close_req = sp;
    (void)s;
}

/*
 * Gives the core back the buffers of the sends in flight to `rank`, which
 * died, when its endpoint has no error handling (shared memory): UCX then
 * neither completes them nor lets the endpoint be closed by force, and they
 * would hold the send pool forever. Their request memory stays UCX's until
 * the worker is destroyed, so a new block replaces it. UCX only reads a send
 * buffer, and only towards the dead rank, so reusing one is safe.
 */
static int peer_retire_sends(mr_substrate_t *s, int rank)
{
    size_t ndata = 0, nctrl = 0, nblocks = s->nsreq_blocks;

    for (size_t b = 0; b < nblocks; b++) {
        for (size_t i = 0; i < s->sreq_blocks[b].n; i++) {
            ucx_sreq_t *r = sreq_at(s, &s->sreq_blocks[b], i);
            if (!r->inflight || r->dest != rank) continue;
            r->inflight = false;
            r->retired = true;
            if (r->ctrl) {
                nctrl++;
            } else if (r->batch != NULL) {
                batch_done_push(s, r->batch); /* Its messages complete just below. */
                r->batch = NULL;
            } else {
                ndata++;
                s->base.up.send_complete(s->base.core, r->link.cookie);
            }
        }
    }
    ndata += (size_t)batches_complete(s);
    if (ndata + nctrl == 0) return 0;
    MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %zu sends and %zu credit returns to rank %d given up.",
            ndata, nctrl, rank);
    if (sreq_block_add(s, ndata, nctrl) != MR_OK) {
        MR__LOG(s, MR_LOG_WARN, "UCX substrate: no memory to replace %zu send states given up on "
                "rank %d; fewer sends can be in flight from now on.", ndata + nctrl, rank);
    }
    return (int)ndata;
}

static int drain_failed(mr_substrate_t *s)
{
    int n = 0;

    while (s->failq_count > 0) {
        int rank = s->failq[s->failq_head];
        ucx_peer_t *p = &s->peers[rank];

        s->failq_head = (s->failq_head + 1) % s->base.size;
        s->failq_count--;
        p->fail_queued = false;
        if (p->state != P_OK) continue;
        p->state = P_FAILED;
        if (s->base.closing) {
            MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d went away while finalizing (%s).",
                    rank, p->exited ? "its process exited" : ucs_status_string(p->fail_status));
        } else {
            if (p->exited) {
                MR__LOG(s, MR_LOG_WARN, "UCX substrate: the process of rank %d (pid %u) exited.",
                        rank, (unsigned)p->pid);
            } else {
                MR__LOG(s, MR_LOG_WARN, "UCX substrate: rank %d failed (UCX: %s).", rank,
                        ucs_status_string(p->fail_status));
            }
            s->base.up.peer_failed(s->base.core, rank, MR_ERR_PEER_FAILED);
            n++;
        }
        if (p->err_peer) {
            /* Its sends complete (canceled) and come back as completions. */
            peer_force_close(s, p);
        } else {
            n += peer_retire_sends(s, rank);
        }
    }
    return n;
}

static int drain_ctrlq(mr_substrate_t *s)
{
    int n = 0;

    while (s->ctrlq_count > 0) {
        size_t k = s->ctrlq_head;
        s->ctrlq_head = (s->ctrlq_head + 1) % s->ctrlq_cap;
        s->ctrlq_count--;
        s->base.up.control(s->base.core, (int)s->ctrlq[2 * k], s->ctrlq[2 * k + 1]);
        n++;
    }
    return n;
}

/* Polls the pidfds of peers on this host (and drains the epoll set). */
static void check_events(mr_substrate_t *s, int timeout_ms)
{
    struct epoll_event evs[UCX_MAX_EVENTS];
    int n;

    if (s->epfd < 0) {
        if (timeout_ms != 0) sched_yield();
        return;
    }
    n = epoll_wait(s->epfd, evs, UCX_MAX_EVENTS, timeout_ms);
    for (int i = 0; i < n; i++) {
        uint64_t tag = evs[i].data.u64;
        if (tag == 0) continue; /* The worker's event fd: the caller progresses. */
        int rank = (int)(tag - 1);
        if (rank >= 0 && rank < s->base.size && s->peers[rank].pidfd >= 0) {
            ucx_peer_t *p = &s->peers[rank];
            epoll_ctl(s->epfd, EPOLL_CTL_DEL, p->pidfd, NULL);
            close(p->pidfd);
            p->pidfd = -1;
            s->npidfds--;
            if (p->state == P_OK && !p->fail_queued) p->exited = true;
            peer_fail(s, rank, UCS_ERR_CONNECTION_RESET);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Operations.                                                               */

/* Copies the settings and learns the host's identity; nothing is open yet. */
static void ucx_init_state(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    s->efd = -1;
    s->epfd = -1;
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    s->bare = s->cfg.bare && s->base.size <= UCX_BARE_MAX_RANKS;
    /* Not authentication: only keeps ranks of two jobs from taking each other for peers. */
    s->hello_token = mr__ucx_wire_hello_token(p->job_key, MR_JOB_KEY_LEN);
    host_identity(&s->boot_hash, &s->pidns);
}

/* Peers and queues: nothing on the data path is allocated later (but the queues' growth). */
static mr_status_t ucx_alloc_queues(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    s->nctrl = 2 * (size_t)s->base.size;
    if (s->nctrl < UCX_CTRL_SLOTS_MIN) s->nctrl = UCX_CTRL_SLOTS_MIN;
    if (s->nctrl > UCX_CTRL_SLOTS_MAX) s->nctrl = UCX_CTRL_SLOTS_MAX;
    s->nrreqs = p->recv_slots < UCX_RREQS_MAX ? p->recv_slots : UCX_RREQS_MAX;
    /*
     * Entries that own a slot are at most recv_slots, and waiting ones only
     * exist under MAILRAIL_FLOWCTL=none, a burst at a time: the queue only
     * grows in odd cases.
     */
    s->rxq_cap = 1;
    while (s->rxq_cap < UCX_RXQ_MAX_INIT && s->rxq_cap < p->recv_slots + UCX_RXQ_SLACK) {
        s->rxq_cap *= 2;
    }
    s->peers = calloc((size_t)s->base.size, sizeof(*s->peers));
    s->failq = calloc((size_t)s->base.size, sizeof(*s->failq));
    s->rxq = malloc(s->rxq_cap * sizeof(*s->rxq));
    s->spill_cap = (size_t)s->cfg.spill_size;
    s->spill = s->spill_cap ? malloc(s->spill_cap) : NULL;
    if (s->peers == NULL || s->failq == NULL || s->rxq == NULL ||
        (s->spill_cap && s->spill == NULL)) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %d peers.", s->base.size);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < s->base.size; r++) {
        s->peers[r].s = s;
        s->peers[r].rank = r;
        s->peers[r].pidfd = -1;
    }
    size_t cap = p->datagram_size < UCX_BATCH_BYTES ? p->datagram_size : UCX_BATCH_BYTES;
    if (mr__batcher_init(&s->batcher, s->base.size, UCX_BATCHES, cap, p->coalesce_bytes) !=
        MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %u batches of %zu bytes "
                "(MAILRAIL_COALESCE_BYTES).", UCX_BATCHES, cap);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

/* The UCP context, from MAILRAIL_UCX_<NAME> over UCX_<NAME>; sets the request size. */
static mr_status_t ucx_create_context(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    ucp_config_t *config = NULL;
    ucp_params_t cparams;
    ucp_context_attr_t cattr;
    size_t ppn = 0;
    ucs_status_t us;

    for (int r = 0; r < s->base.size; r++) {
        if (p->node_of_rank == NULL || p->node_of_rank[r] == p->node_of_rank[s->base.rank]) ppn++;
    }
    mark_own_settings();
    us = ucp_config_read(UCX_ENV_PREFIX, NULL, &config);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot read the UCX settings (UCX_* and "
                "MAILRAIL_UCX_*): %s.", ucs_status_string(us));
        return MR_ERR_CONFIG;
    }
    memset(&cparams, 0, sizeof(cparams));
    cparams.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                         UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_ESTIMATED_NUM_PPN |
                         UCP_PARAM_FIELD_NAME;
    cparams.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    cparams.mt_workers_shared = 0;
    cparams.estimated_num_eps = (size_t)s->base.size;
    cparams.estimated_num_ppn = ppn ? ppn : 1;
    cparams.name = "mailrail";
    us = ucp_init(&cparams, config, &s->context);
    ucp_config_release(config);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_init failed: %s (check MAILRAIL_UCX_TLS and "
                "UCX_TLS).", ucs_status_string(us));
        s->context = NULL;
        return MR_ERR_TRANSPORT;
    }
    memset(&cattr, 0, sizeof(cattr));
    cattr.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE;
    us = ucp_context_query(s->context, &cattr);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_context_query failed: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    s->ucx_req_size = cattr.request_size;
    return MR_OK;
}

/* One single-threaded worker, and the epoll set over its wake-up fd (if any). */
static mr_status_t ucx_create_worker(mr_substrate_t *s)
{
    ucp_worker_params_t wparams;
    ucs_status_t us;

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(s->context, &wparams, &s->worker);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_worker_create failed: %s.",
                ucs_status_string(us));
        s->worker = NULL;
        return MR_ERR_TRANSPORT;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: epoll_create1 failed: %s.", strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    us = ucp_worker_get_efd(s->worker, &s->efd);
    if (us == UCS_OK) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->efd, &ev) != 0) s->efd = -1;
    } else {
        s->efd = -1;
    }
    if (s->efd < 0) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: no wake-up fd from UCX (%s); an idle progress "
                "call yields instead of sleeping.", ucs_status_string(us));
    }
    return MR_OK;
}

/* The handlers of the data and the control active messages. */
static mr_status_t ucx_set_handlers(mr_substrate_t *s)
{
    ucp_am_handler_param_t hparam;
    ucs_status_t us;

    memset(&hparam, 0, sizeof(hparam));
    hparam.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                        UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hparam.flags = UCP_AM_FLAG_WHOLE_MSG;
    hparam.arg = s;
    hparam.id = UCX_AM_DATA;
    hparam.cb = data_am_cb;
    us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
    if (us == UCS_OK) {
        hparam.id = UCX_AM_CTRL;
        hparam.cb = ctrl_am_cb;
        us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
    }
    /* Header-less data from each peer, in jobs small enough to name them all. */
    for (int r = 0; us == UCS_OK && s->base.size <= UCX_BARE_MAX_RANKS && r < s->base.size; r++) {
        hparam.arg = &s->peers[r];
        for (int items = 0; us == UCS_OK && items < 2; items++) {
            hparam.id = (unsigned)(UCX_AM_BARE + 2 * r + items);
            hparam.cb = items ? bare_items_am_cb : bare_data_am_cb;
            us = ucp_worker_set_am_recv_handler(s->worker, &hparam);
        }
    }
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot set the active-message handlers: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}

/* This rank's address blob: the header and the worker's address (see ucx_wire.h). */
static mr_status_t ucx_make_address(mr_substrate_t *s)
{
    ucp_address_t *uaddr = NULL;
    size_t ualen = 0;
    ucs_status_t us = ucp_worker_get_address(s->worker, &uaddr, &ualen);

    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_worker_get_address failed: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    if (ualen > MR_SUBSTRATE_ADDR_MAX - UCX_WIRE_ADDR_HDR_LEN) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the UCX worker address is %zu bytes, more than "
                "the %d bytes MailRail can exchange; restrict the transports or devices it "
                "advertises, e.g. MAILRAIL_UCX_TLS=sm,self,tcp or MAILRAIL_UCX_NET_DEVICES.",
                ualen, MR_SUBSTRATE_ADDR_MAX - UCX_WIRE_ADDR_HDR_LEN);
        ucp_worker_release_address(s->worker, uaddr);
        return MR_ERR_CONFIG;
    }
    ucx_wire_addr_t w = {.pid = (uint32_t)getpid(), .boot_hash = s->boot_hash,
                         .pidns = s->pidns, .worker = (const uint8_t *)uaddr, .worker_len = ualen};
    s->addr_len = mr__ucx_wire_addr_encode(s->addr, &w);
    ucp_worker_release_address(s->worker, uaddr);
    return MR_OK;
}

/* Send and receive state, handed to UCX as user-allocated requests. */
static mr_status_t ucx_alloc_requests(mr_substrate_t *s)
{
    s->sreq_stride = align_up(s->ucx_req_size, 64) + align_up(sizeof(ucx_sreq_t), 64);
    s->rreq_stride = align_up(s->ucx_req_size, 64) + align_up(sizeof(ucx_rreq_t), 64);
    s->rreq_mem = aligned_alloc(64, s->rreq_stride * s->nrreqs);
    if (sreq_block_add(s, s->base.max_sends, s->nctrl) != MR_OK || s->rreq_mem == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %zu sends.", s->base.max_sends);
        return MR_ERR_NO_MEMORY;
    }
    memset(s->rreq_mem, 0, s->rreq_stride * s->nrreqs);
    for (size_t i = s->nrreqs; i-- > 0;) {
        rreq_free(s, rreq_at(s, i));
    }
    return MR_OK;
}

static mr_status_t ucx_open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s = NULL;
    mr_status_t st = mr__substrate_alloc(p, sizeof(*s), "UCX substrate", UINT32_MAX, true, &s);

    if (st != MR_OK) return st;
    if (p->recv_slots == 0) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: no receive slots.");
        free(s);
        return MR_ERR_INVALID_PARAM;
    }
    ucx_init_state(s, p);
    st = ucx_alloc_queues(s, p);
    if (st == MR_OK) st = ucx_create_context(s, p);
    if (st == MR_OK) st = ucx_create_worker(s);
    if (st == MR_OK) st = ucx_set_handlers(s);
    if (st == MR_OK) st = ucx_make_address(s);
    if (st == MR_OK) st = ucx_alloc_requests(s);
    if (st != MR_OK) {
        ucx_close(s);
        return st;
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d has a %zu-byte worker address, error mode "
                "%s, %zu-byte UCX requests.", s->base.rank, s->addr_len - UCX_WIRE_ADDR_HDR_LEN,
                ucx_error_modes[s->cfg.error_mode], s->ucx_req_size);
    }
    *out = s;
    return MR_OK;
}

static mr_status_t ucx_get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    memcpy(addr, s->addr, s->addr_len);
    *length = s->addr_len;
    return MR_OK;
}

static void ucx_format_address(const void *addr, size_t length, char *buf, size_t len)
{
    ucx_wire_addr_t w;

    if (buf == NULL || len == 0) return;
    if (mr__ucx_wire_addr_decode(addr, length, &w, NULL) != MR_OK) {
        snprintf(buf, len, "ucx (not a UCX substrate address)");
        return;
    }
    snprintf(buf, len, "ucx worker address (%zu bytes, digest %08x), pid %u", w.worker_len,
             (unsigned)(mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, w.worker, w.worker_len) &
                        0xffffffffu),
             (unsigned)w.pid);
}

/* Whether a UCX request handle is done (freeing it when it is). */
static bool req_done(void **req, ucs_status_t *status)
{
    ucs_status_t st;

    if (*req == NULL) return true;
    st = ucp_request_check_status(*req);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(*req);
    *req = NULL;
    if (status != NULL && st != UCS_OK) *status = st;
    return true;
}

static const char *round_name(unsigned kind)
{
    return kind == UCX_WIRE_CTRL_HELLO ? "HELLO" : kind == UCX_WIRE_CTRL_READY ? "READY" : "BYE";
}

/* Whether a peer takes part in a round: it has a working endpoint. */
static bool round_peer(const mr_substrate_t *s, const ucx_peer_t *p)
{
    return p->rank != s->base.rank && p->ep != NULL && p->state == P_OK && !p->fail_queued;
}

/*
 * Sends HELLO, READY or BYE to every peer, followed by a flush of the
 * endpoint when asked: a flush completes the wire-up and makes sure that
 * everything sent before has left.
 */
static mr_status_t round_start(mr_substrate_t *s, unsigned kind, bool flush)
{
    for (int r = 0; r < s->base.size; r++) {
        ucx_peer_t *p = &s->peers[r];
        ucp_request_param_t param;
        ucs_status_ptr_t sp;

        if (!round_peer(s, p)) continue;
        hdr_pack(s, p->conn_hdr, kind, s->hello_token);
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_EAGER;
        sp = ucp_am_send_nbx(p->ep, UCX_AM_CTRL, p->conn_hdr, UCX_WIRE_HDR_LEN, NULL, 0, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: cannot send %s to "
                    "rank %d: %s.", round_name(kind), r, ucs_status_string(UCS_PTR_STATUS(sp)));
            if (s->closed) continue;
            return MR_ERR_TRANSPORT;
        }
        p->conn_req[0] = sp;
        if (!flush) continue;
        memset(&param, 0, sizeof(param));
        sp = ucp_ep_flush_nbx(p->ep, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: cannot flush the "
                    "endpoint to rank %d: %s.", r, ucs_status_string(UCS_PTR_STATUS(sp)));
            if (s->closed) continue;
            return MR_ERR_TRANSPORT;
        }
        p->conn_req[1] = sp;
    }
    return MR_OK;
}

/*
 * Progresses until every peer's message of the round has arrived and ours
 * have left, or the deadline. While connecting, a failure fails the round;
 * in close(), a peer that failed or went away is simply done.
 */
static mr_status_t round_wait(mr_substrate_t *s, unsigned kind, uint64_t deadline)
{
    for (;;) {
        int waiting = 0;

        while (ucp_worker_progress(s->worker) != 0) {
        }
        for (int r = 0; r < s->base.size; r++) {
            ucx_peer_t *p = &s->peers[r];
            ucs_status_t err = UCS_OK;
            bool sent;

            if (r == s->base.rank || (s->closed && !round_peer(s, p))) continue;
            if (p->fail_queued || p->state != P_OK) {
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: rank %d failed while connecting (%s).", r,
                        p->exited ? "its process exited" : ucs_status_string(p->fail_status));
                return MR_ERR_TRANSPORT;
            }
            sent = req_done(&p->conn_req[0], &err);
            sent = req_done(&p->conn_req[1], &err) && sent;
            if (err != UCS_OK) {
                if (s->closed) continue;
                MR__LOG(s, MR_LOG_ERROR, "UCX substrate: connecting to rank %d failed: %s.", r,
                        ucs_status_string(err));
                return MR_ERR_TRANSPORT;
            }
            if (!sent || !p->got[kind]) waiting++;
        }
        if (waiting == 0) return MR_OK;
        if (mr__now_ns() >= deadline) {
            char list[512];
            size_t used = 0;
            int listed = 0;
            list[0] = '\0';
            for (int r = 0; r < s->base.size && listed < 16; r++) {
                ucx_peer_t *p = &s->peers[r];
                if (!round_peer(s, p) || (p->got[kind] && !p->conn_req[0] && !p->conn_req[1])) {
                    continue;
                }
                int n = snprintf(list + used, sizeof(list) - used, "%s%d (%s%s%s)",
                                 listed ? ", " : "", r, p->got[kind] ? "" : "nothing received; ",
                                 p->conn_req[0] ? "own message not sent; " : "",
                                 p->conn_req[1] ? "endpoint not flushed" : "");
                if (n > 0) used += (size_t)n;
                if (used >= sizeof(list)) used = sizeof(list) - 1;
                listed++;
            }
            MR__LOG(s, s->closed ? MR_LOG_DEBUG : MR_LOG_ERROR, "UCX substrate: rank %d timed out "
                    "after %u s in the %s round, with %d of its %d peers missing: %s%s.",
                    s->base.rank, s->closed ? UCX_CLOSE_FLUSH_S : s->base.timeout_s,
                    round_name(kind), waiting, s->base.size - 1, list,
                    waiting > listed ? ", ..." : "");
            return MR_ERR_TIMEOUT;
        }
        /* Nothing moved: sleep a little (or until UCX or a watched process has news). */
        if (s->efd >= 0 && ucp_worker_arm(s->worker) == UCS_OK) {
            check_events(s, UCX_CONNECT_POLL_MS);
        } else {
            check_events(s, 0);
            sched_yield();
        }
    }
}

/* Creates the endpoint to peer `p` from its address, with the error mode it calls for. */
static mr_status_t peer_create_endpoint(mr_substrate_t *s, ucx_peer_t *p, const ucx_wire_addr_t *w)
{
    ucp_ep_params_t ep;
    ucs_status_t us;

    p->same_host = w->boot_hash != 0 && w->boot_hash == s->boot_hash;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = (const ucp_address_t *)w->worker;
    if (s->cfg.error_mode == ERRMODE_PEER ||
        (s->cfg.error_mode == ERRMODE_AUTO && !p->same_host)) {
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        p->err_peer = true;
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_handler.cb = ep_err_cb;
        ep.err_handler.arg = p;
    } else {
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    }
    us = ucp_ep_create(s->worker, &ep, &p->ep);
    if (us != UCS_OK) {
        p->ep = NULL;
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot create an endpoint to rank %d: %s.",
                p->rank, ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    p->state = P_OK;
    return MR_OK;
}

/* A peer in this pid namespace is watched through a pidfd: its exit is its failure. */
static void peer_watch_process(mr_substrate_t *s, ucx_peer_t *p, uint64_t pidns)
{
    int fd;

    if (!p->same_host || pidns == 0 || pidns != s->pidns || p->pid == 0) return;
    fd = pidfd_open_compat(p->pid);
    if (fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)p->rank + 1};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) == 0) {
            p->pidfd = fd;
            s->npidfds++;
        } else {
            close(fd);
        }
    } else {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: cannot watch process %u (rank %d): %s.",
                (unsigned)p->pid, p->rank, strerror(errno));
    }
}

static mr_status_t ucx_connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    uint64_t start = mr__now_ns(), deadline;
    mr_status_t st;

    if (s == NULL || s->connect_started) return MR_ERR_INVALID_PARAM;
    s->connect_started = true;
    if (s->base.size == 1) {
        s->connected = true;
        return MR_OK;
    }
    if (addrs == NULL || addr_len < UCX_WIRE_ADDR_HDR_LEN) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the address table holds %zu-byte entries, fewer "
                "than the %d-byte header of a UCX address.", addr_len, UCX_WIRE_ADDR_HDR_LEN);
        return MR_ERR_PROTOCOL;
    }
    for (int r = 0; r < s->base.size; r++) {
        const uint8_t *blob = (const uint8_t *)addrs + (size_t)r * addr_len;
        ucx_peer_t *p = &s->peers[r];
        ucx_wire_addr_t w;

        if (mr__ucx_wire_addr_decode(blob, addr_len, &w, NULL) != MR_OK) {
            MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the address of rank %d is not a valid UCX "
                    "substrate address (wrong magic, version or length).", r);
            return MR_ERR_PROTOCOL;
        }
        p->pid = w.pid;
        if (r == s->base.rank) continue;
        st = peer_create_endpoint(s, p, &w);
        if (st != MR_OK) return st;
        peer_watch_process(s, p, w.pidns);
    }
    /* Two rounds over UCX itself; see docs/architecture.md. */
    deadline = start + (uint64_t)(s->base.timeout_s ? s->base.timeout_s : 60) * MR_NS_PER_S;
    st = round_start(s, UCX_WIRE_CTRL_HELLO, true);
    if (st == MR_OK) st = round_wait(s, UCX_WIRE_CTRL_HELLO, deadline);
    if (st == MR_OK) st = round_start(s, UCX_WIRE_CTRL_READY, false);
    if (st == MR_OK) st = round_wait(s, UCX_WIRE_CTRL_READY, deadline);
    if (st != MR_OK) return st;
    s->connected = true;
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d connected to its %d peers in %.3f s "
                "(%zu watched through pidfds).", s->base.rank, s->base.size - 1,
                (double)(mr__now_ns() - start) / 1e9, s->npidfds);
    }
    return MR_OK;
}

/* The endpoint to `dest` if it can take a message, or the status saying why not. */
static mr_status_t peer_for_send(mr_substrate_t *s, int dest, ucx_peer_t **out)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    ucx_peer_t *p = &s->peers[dest];
    if (p->state == P_FAILED || p->fail_queued) return MR_ERR_PEER_FAILED;
    if (p->state != P_OK || !s->connected || s->closed) return MR_ERR_INVALID_RANK;
    *out = p;
    return MR_OK;
}

/* Maps a failed ucp_am_send_nbx() to a status for the core. */
static mr_status_t send_error(mr_substrate_t *s, int dest, ucs_status_t us)
{
    if (is_peer_gone_status(us)) {
        peer_fail(s, dest, us);
        return MR_ERR_PEER_FAILED;
    }
    MR__LOG(s, MR_LOG_ERROR, "UCX substrate: sending to rank %d failed: %s.", dest,
            ucs_status_string(us));
    return MR_ERR_TRANSPORT;
}

/*
 * Sends the batch being filled for `dest` as one eager message (mr_batch.h).
 * MR_AGAIN when no send state is free: it stays open. Its messages complete
 * at a later progress call, even when UCX is done at once.
 */
static mr_status_t batch_send(mr_substrate_t *s, ucx_peer_t *p)
{
    mr__batch_t *b = s->batcher.open[p->rank];
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r = sreq_pop(&s->free_sreqs);

    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->link.cookie = NULL;
    r->dest = p->rank;
    hdr_pack(s, r->hdr, UCX_WIRE_DATA_BATCH, 0);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.send = send_cb;
    param.flags = UCP_AM_SEND_FLAG_EAGER; /* The receiver copies frames out of UCX's buffer. */
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    sp = ucp_am_send_nbx(p->ep, UCX_AM_DATA, r->hdr, UCX_WIRE_HDR_LEN, b->data, b->used, &param);
    if (UCS_PTR_IS_ERR(sp)) {
        mr__sreq_push(&s->free_sreqs, &r->link);
        return send_error(s, p->rank, UCS_PTR_STATUS(sp));
    }
    mr__batcher_detach(&s->batcher, p->rank);
    if (sp == NULL) {
        mr__sreq_push(&s->free_sreqs, &r->link);
        batch_done_push(s, b);
    } else {
        r->batch = b;
        r->inflight = true;
    }
    return MR_OK;
}

/* batch_send() for mr__batcher_route(). */
static mr_status_t batch_send_to(void *ctx, int dest)
{
    mr_substrate_t *s = ctx;

    return batch_send(s, &s->peers[dest]);
}

/*
 * At the start of a progress call: sends every batch being filled that can
 * go; those to failed ranks complete unsent.
 */
static void flush_batches(mr_substrate_t *s)
{
    /* Backwards: detaching moves the last open rank into the slot just visited. */
    for (unsigned i = s->batcher.nopen; i-- > 0;) {
        int dest = s->batcher.open_ranks[i];
        ucx_peer_t *p = NULL;
        if (peer_for_send(s, dest, &p) == MR_OK) {
            batch_send(s, p); /* Refused: it waits for the next call. */
        } else {
            batch_done_push(s, mr__batcher_detach(&s->batcher, dest));
        }
    }
}

static mr_status_t ucx_send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                            const void *data, size_t length, void *cookie)
{
    ucx_peer_t *p = NULL;
    mr_status_t st = peer_for_send(s, dest, &p);
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r;
    bool packed;

    if (st != MR_OK) return st;
    if (length > s->base.datagram_size) return MR_ERR_MESSAGE_TOO_LONG;
    if ((kind != MR_KIND_DATA && kind != MR_KIND_ITEMS) || (data == NULL && length > 0)) {
        return MR_ERR_INVALID_PARAM;
    }
    /* A small message after another to the same rank joins a batch (mr_batch.h). */
    st = mr__batcher_route(&s->batcher, dest, kind, imm, data, length, cookie, batch_send_to, s,
                           &packed);
    if (st != MR_OK || packed) return st;
    r = sreq_pop(&s->free_sreqs);
    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->link.cookie = cookie;
    r->dest = dest;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.request = r;
    param.cb.send = send_cb;
    param.memory_type = UCS_MEMORY_TYPE_HOST;
    if (s->bare && imm == 0 && s->failures_seen == 0) {
        /* Nothing to say but who sent it and what it is: the AM id says both. */
        unsigned id = UCX_AM_BARE + 2 * (unsigned)s->base.rank + (kind == MR_KIND_ITEMS);
        sp = ucp_am_send_nbx(p->ep, id, NULL, 0, data, length, &param);
    } else {
        hdr_pack(s, r->hdr, kind, imm);
        sp = ucp_am_send_nbx(p->ep, UCX_AM_DATA, r->hdr, UCX_WIRE_HDR_LEN, data, length, &param);
    }
    if (UCS_PTR_IS_ERR(sp)) {
        mr__sreq_push(&s->free_sreqs, &r->link);
        return send_error(s, dest, UCS_PTR_STATUS(sp));
    }
    if (sp == NULL) {
        /* UCX copied it out already: the core may reuse the buffer now. */
        mr__sreq_push(&s->free_sreqs, &r->link);
        return MR_SUBSTRATE_SENT;
    }
    r->inflight = true;
    return MR_OK;
}

static mr_status_t ucx_send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    ucx_peer_t *p = NULL;
    mr_status_t st = peer_for_send(s, dest, &p);
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    ucx_sreq_t *r;

    if (st != MR_OK) return st;
    r = sreq_pop(&s->free_ctrl);
    if (r == NULL) return MR_AGAIN;
    r->link.next = NULL;
    r->dest = dest;
    hdr_pack(s, r->hdr, UCX_WIRE_CTRL_CREDIT, imm);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_REQUEST | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.request = r;
    param.cb.send = send_cb;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    sp = ucp_am_send_nbx(p->ep, UCX_AM_CTRL, r->hdr, UCX_WIRE_HDR_LEN, NULL, 0, &param);
    if (UCS_PTR_IS_ERR(sp)) {
        ctrl_free(s, r);
        return send_error(s, dest, UCS_PTR_STATUS(sp));
    }
    if (sp == NULL) ctrl_free(s, r);
    else r->inflight = true;
    return MR_OK;
}

static int ucx_progress(mr_substrate_t *s, int timeout_ms)
{
    int events = 0;
    uint64_t now;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    s->upcalls_ok = true;
    s->cb_events = 0;
    if (s->failq_count > 0) events += drain_failed(s);
    /* Batches leave now, and the next message to each rank leaves alone again. */
    mr__batcher_next_epoch(&s->batcher);
    if (s->batcher.nopen > 0) flush_batches(s);
    if (s->batches_done != NULL) events += batches_complete(s);
    if (!mr__done_empty(&s->done)) events += mr__done_drain(s, &s->done, &s->free_sreqs);
    if (s->ctrlq_count > 0) events += drain_ctrlq(s);
    if (s->rxq_count > 0) events += rx_drain(s);

    for (int round = 0; round < 2; round++) {
        /*
         * Receiver backpressure: while arrivals wait for slots that only the
         * application can free, take nothing more from UCX.
         */
        if (rx_paused(s)) s->paused_calls++;
        for (int i = 0; i < UCX_PROGRESS_BURST && !rx_paused(s); i++) {
            if (ucp_worker_progress(s->worker) == 0) break;
        }
        /*
         * Reading the clock on every poll is a small delay that spares the
         * shared FIFO's cache lines: reading it on every 64th poll only made
         * a 512-byte stream under `none` 25% slower (docs/performance.md).
         */
        if (s->npidfds > 0 && (now = mr__coarse_now_ns()) >= s->next_pidfd_check) {
            s->next_pidfd_check = now + UCX_PIDFD_CHECK_MS * MR_NS_PER_MS;
            check_events(s, 0);
        }
        events += s->cb_events;
        s->cb_events = 0;
        if (s->failq_count > 0) events += drain_failed(s);
        if (s->batches_done != NULL) events += batches_complete(s);
        if (!mr__done_empty(&s->done)) events += mr__done_drain(s, &s->done, &s->free_sreqs);
        if (s->rxq_count > 0) events += rx_drain(s);
        if (events > 0 || timeout_ms == 0 || round == 1) break;
        /* Idle with time to wait: sleep until UCX or a watched process has news. */
        if (rx_paused(s)) {
            sched_yield();
            break;
        }
        if (s->efd >= 0) {
            ucs_status_t us = ucp_worker_arm(s->worker);
            if (us == UCS_OK) {
                check_events(s, timeout_ms);
                s->next_pidfd_check = mr__coarse_now_ns() + UCX_PIDFD_CHECK_MS * MR_NS_PER_MS;
            } else if (us != UCS_ERR_BUSY) {
                sched_yield();
            }
        } else {
            sched_yield();
        }
    }
    s->upcalls_ok = false;
    return events;
}

static void ucx_release_recv(mr_substrate_t *s, void *handle)
{
    if (s == NULL || handle == NULL || s->worker == NULL) return;
    ucp_am_data_release(s->worker, handle);
}

/* Whether a rendezvous receive is still under way (close() only). */
static bool rx_any_receiving(mr_substrate_t *s)
{
    for (size_t i = 0; i < s->rxq_count; i++) {
        ucx_rx_t *e = rxq_at(s, i);
        if (e->state == RX_RECEIVING && !e->rreq->done) return true;
    }
    return false;
}

static void ucx_close(mr_substrate_t *s)
{
    if (s == NULL) return;
    s->closed = true;
    s->upcalls_ok = false;
    if (s->worker != NULL) {
        unsigned flush_s = s->base.timeout_s < UCX_CLOSE_FLUSH_S ? s->base.timeout_s
                                                                 : UCX_CLOSE_FLUSH_S;
        uint64_t deadline = mr__now_ns() + (uint64_t)(flush_s ? flush_s : 1) * MR_NS_PER_S;
        bool bye_done = false;

        /* UCX buffers still held: queued arrivals nobody will receive. */
        for (size_t i = 0; i < s->rxq_count; i++) {
            ucx_rx_t *e = rxq_at(s, i);
            if (e->state == RX_HELD || e->state == RX_RNDV_WAIT) {
                ucp_am_data_release(s->worker, e->data);
                e->data = NULL;
            } else if (e->state == RX_SPILL && e->heap) {
                free(e->data);
                e->data = NULL;
            }
        }
        /*
         * A normal finalize (every rank called closing()): every rank sends
         * BYE behind everything else and flushes, and waits for every peer's
         * BYE. After that nothing is in flight either way, so the endpoints
         * are released without a flush: a flush towards a peer that already
         * destroyed its worker fails, and UCX logs an error for it.
         */
        if (s->base.closing && s->connected) {
            if (round_start(s, UCX_WIRE_CTRL_BYE, true) == MR_OK &&
                round_wait(s, UCX_WIRE_CTRL_BYE, deadline) == MR_OK) {
                bye_done = true;
            }
        }
        for (int r = 0; r < s->base.size; r++) {
            ucx_peer_t *p = &s->peers[r];
            ucp_request_param_t param;
            ucs_status_ptr_t sp;

            for (int k = 0; k < 2; k++) {
                if (p->conn_req[k] != NULL) ucp_request_free(p->conn_req[k]);
                p->conn_req[k] = NULL;
            }
            if (p->ep == NULL) continue;
            /* Otherwise (a failure, or init giving up) flush what can still go. */
            memset(&param, 0, sizeof(param));
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = !bye_done && round_peer(s, p) ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
            sp = ucp_ep_close_nbx(p->ep, &param);
            p->ep = NULL;
            p->state = P_CLOSED;
            if (UCS_PTR_IS_PTR(sp)) p->close_req = sp;
        }
        /* Short: after a failure the other ranks may be anywhere, not waiting for us. */
        deadline = mr__now_ns() + UCX_CLOSE_EP_MS * MR_NS_PER_MS;
        for (;;) {
            int left = 0;
            while (ucp_worker_progress(s->worker) != 0) {
            }
            for (int r = 0; r < s->base.size; r++) {
                if (!req_done(&s->peers[r].close_req, NULL)) left++;
            }
            if (left == 0 && !rx_any_receiving(s)) break;
            if (mr__now_ns() >= deadline) {
                /* Destroying the worker releases them by force. */
                MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %d endpoints did not close within %d ms.",
                        left, UCX_CLOSE_EP_MS);
                for (int r = 0; r < s->base.size; r++) {
                    if (s->peers[r].close_req != NULL) ucp_request_free(s->peers[r].close_req);
                    s->peers[r].close_req = NULL;
                }
                break;
            }
            sched_yield();
        }
        /* After this UCX holds no reference to our request memory. */
        ucp_worker_destroy(s->worker);
        s->worker = NULL;
    }
    if (s->context != NULL) ucp_cleanup(s->context);
    s->context = NULL;
    if (s->peers != NULL) {
        for (int r = 0; r < s->base.size; r++) {
            if (s->peers[r].pidfd >= 0) close(s->peers[r].pidfd);
        }
    }
    if (s->epfd >= 0) close(s->epfd);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: %llu messages arrived without a header, %llu "
                "delivered in place, %llu received "
                "by rendezvous, %llu held and %llu spilled (%llu to the heap) while waiting for a "
                "receive slot, %llu progress calls paused for want of one.",
                (unsigned long long)s->bare_received,
                (unsigned long long)s->zcopy_delivered, (unsigned long long)s->rndv_received,
                (unsigned long long)s->held, (unsigned long long)s->spilled,
                (unsigned long long)s->spilled_heap, (unsigned long long)s->paused_calls);
    }
    for (size_t b = 0; b < s->nsreq_blocks; b++) free(s->sreq_blocks[b].mem);
    free(s->sreq_blocks);
    mr__batcher_fini(&s->batcher); /* After the worker: UCX no longer reads any batch. */
    free(s->rreq_mem);
    free(s->peers);
    free(s->failq);
    free(s->rxq);
    free(s->ctrlq);
    free(s->spill);
    free(s);
}

static void ucx_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    mr__batcher_stats(&s->batcher, stats);
}

static const mr_substrate_ops_t ucx_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "ucx",
    .description = "UCX active messages, one UCP worker per rank; MAILRAIL_UCX_<NAME> sets "
                   "UCX's <NAME> for MailRail alone (over UCX_<NAME>)",
    .config_table = ucx_config_table,
    .config_size = sizeof(ucx_config_t),
    .open = ucx_open,
    .get_address = ucx_get_address,
    .connect = ucx_connect,
    .send = ucx_send,
    .send_control = ucx_send_control,
    .progress = ucx_progress,
    .release_recv = ucx_release_recv,
    .format_address = ucx_format_address,
    .closing = mr__substrate_closing,
    .stats = ucx_stats,
    .close = ucx_close,
    .settings_passthrough_prefix = UCX_OWN_PREFIX,
    .job_wide_settings = ucx_job_wide_settings,
};

MR__SUBSTRATE_ENTRY(ucx_ops)
