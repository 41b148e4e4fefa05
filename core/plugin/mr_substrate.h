/*
 * The substrate plugin ABI. Internal: compiled into the core and into each
 * plugin under substrates/, which are built with it, never installed.
 *
 * A substrate is a shared module named mailrail_substrate_<name>.so that
 * exports one function, mr_substrate_get_ops(), returning a constant ops
 * table. The table starts with the ABI version and its size; the core
 * loads a plugin only when both are this header's (a plugin built from
 * another MailRail is refused, by name), its name is the file's, and every
 * op that may not be NULL is there. Any change to this header that a plugin
 * would see raises MR_SUBSTRATE_ABI_VERSION.
 *
 * The header holds, in order: the wire's message kinds and frames, the
 * append windows through which the core packs messages without a call, the
 * core's upcalls, the parameters of open(), and the ops table, grouped by
 * role (settings, lifecycle, sending, progress, queries).
 *
 * Each message carries a kind and a 32-bit immediate (flow control
 * piggybacks credits in it); control messages carry only an immediate, on a
 * channel of their own. Upcalls run only inside progress().
 */
#ifndef MR_SUBSTRATE_H
#define MR_SUBSTRATE_H

#include "mailrail.h"
#include "mr_byteorder.h"
#include "mr_config_entry.h"
#include "mr_log_level.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MR_SUBSTRATE_ABI_VERSION 12
#define MR_SUBSTRATE_ENTRY "mr_substrate_get_ops"
#define MR_SUBSTRATE_PREFIX "mailrail_substrate_"

/* Longest substrate address, in bytes, exchanged through the bootstrap. */
#define MR_SUBSTRATE_ADDR_MAX 1024

/* Length of the per-job secret distributed by the bootstrap. */
#define MR_JOB_KEY_LEN 32

/*
 * What send() returns for a message the transport has already finished
 * with (UCX copied it out): the buffer is free again at once, and no
 * send_complete() follows. Positive, like MR_AGAIN: not an error.
 */
#define MR_SUBSTRATE_SENT ((mr_status_t)2)

/* Message kinds carried in the header. */
enum {
    MR_KIND_DATA = 1,    /* Application payload; imm is owned by flow control. */
    MR_KIND_ITEMS = 2,   /* An aggregator's datagram (mailrail_items.h); imm as for data. */
    MR_KIND_HANDLER = 3, /* A message for an active-message handler, its id in the last
                            byte (mailrail.h); imm as for data. */
    MR_KIND_BATCH = 4    /* Data messages of one sender in one transport message, as
                            frames (below); imm as for data. */
};

_Static_assert(MR_KIND_DATA == 1 && MR_KIND_ITEMS == 2 && MR_KIND_HANDLER == 3,
               "mr_frame_start() maps the kinds of frames through a table");

/*
 * Frames: messages packed back to back, each an 8-byte header and the
 * payload, padded with zeros to a multiple of 8 bytes, so that every payload
 * starts 8-byte aligned when the batch does. Header bytes 0-3: little-endian,
 * bits 0-29 the payload length, bit 31 set for MR_KIND_ITEMS, bit 30 for
 * MR_KIND_HANDLER; bytes 4-7: zero on the wire (the receiving core marks
 * frames there). A substrate that coalesces (mr_batch.h) delivers a batch
 * whose frames are all data as one message of kind MR_KIND_BATCH, into a
 * receive slot (never with a handle): the core hands its frames to
 * mr_receive() one by one and counts a credit per frame.
 */
#define MR_FRAME_HDR 8u
#define MR_FRAME_ALIGN 8u
#define MR_FRAME_ITEMS_BIT UINT32_C(0x80000000)
#define MR_FRAME_HANDLER_BIT UINT32_C(0x40000000)
#define MR_FRAME_KIND_BITS (MR_FRAME_ITEMS_BIT | MR_FRAME_HANDLER_BIT)

/* The bytes a frame of a `length`-byte payload takes, header and padding included. */
static inline size_t mr_frame_size(size_t length)
{
    return MR_FRAME_HDR + ((length + MR_FRAME_ALIGN - 1) & ~(size_t)(MR_FRAME_ALIGN - 1));
}

/*
 * Writes the header and the padding of a frame of `length` payload bytes of
 * `kind` at `p`; the payload goes at p + MR_FRAME_HDR. Returns the frame's size.
 */
static inline size_t mr_frame_start(uint8_t *p, unsigned kind, size_t length)
{
    /* By kind: MR_KIND_DATA, ITEMS and HANDLER are 1, 2 and 3; a batch is never a frame. */
    static const uint32_t kind_bits[4] = {0, 0, MR_FRAME_ITEMS_BIT, MR_FRAME_HANDLER_BIT};
    size_t size = mr_frame_size(length);
    uint32_t hdr = (uint32_t)length | kind_bits[kind & 3];
    uint64_t zero = 0;

    memcpy(p + size - sizeof(zero), &zero, sizeof(zero)); /* The padding (or the header). */
    p[0] = (uint8_t)hdr;
    p[1] = (uint8_t)(hdr >> 8);
    p[2] = (uint8_t)(hdr >> 16);
    p[3] = (uint8_t)(hdr >> 24);
    memcpy(p + 4, &zero, 4);
    return size;
}

/*
 * Reads the header of the frame at `p`, `left` bytes before its batch ends,
 * into *hdr (the length in its low bits, the kind in MR_FRAME_KIND_BITS).
 * Returns the frame's size, or 0 when the frame is malformed: its header's
 * second word is not zero, or it claims more bytes than are left.
 */
static inline size_t mr_frame_read(const uint8_t *p, size_t left, uint32_t *hdr)
{
    size_t size;
    uint32_t h;

    if (left < MR_FRAME_HDR) return 0;
    h = mr__get_le32(p);
    size = mr_frame_size(h & ~MR_FRAME_KIND_BITS);
    if (mr__get_le32(p + 4) != 0 || size > left) return 0;
    *hdr = h;
    return size;
}

/*
 * An append window: the batch a coalescing substrate is filling for
 * one rank, open to the core, so that the common message of a stream is
 * packed without a call into the plugin (mr_substrate_ops_t.append_windows).
 * A message of `kind` without an immediate, of at most the max_frame bytes
 * append_windows() gave, whose frame fits `room` bytes while `frames` > 0,
 * may be written at `pos` (mr_append_window_take() or _put()) instead of
 * going through send(): it is then packed, as send() would have packed it,
 * and done. kind 0: no batch open. The substrate changes a window only
 * inside its own calls.
 */
typedef struct mr_append_window {
    uint8_t *pos;
    uint32_t room;
    uint16_t frames;
    uint16_t kind;
} mr_append_window_t;

/*
 * Takes a frame of `length` payload bytes of `kind` from window `w` if the
 * window takes it (above): writes its header and padding and returns where
 * the payload goes; NULL when not.
 */
static inline uint8_t *mr_append_window_take(mr_append_window_t *w, unsigned kind, size_t length)
{
    size_t size = mr_frame_size(length);
    uint8_t *p = w->pos;

    if (w->kind != kind || w->frames == 0 || w->room < size) return NULL;
    mr_frame_start(p, kind, length);
    w->pos = p + size;
    w->room -= (uint32_t)size;
    w->frames--;
    return p + MR_FRAME_HDR;
}

/* Packs a message into window `w` if the window takes it (above); false when not. */
static inline bool mr_append_window_put(mr_append_window_t *w, unsigned kind, const void *data,
                                        size_t length)
{
    uint8_t *payload = mr_append_window_take(w, kind, length);

    if (payload == NULL) return false;
    if (length > 0) memcpy(payload, data, length);
    return true;
}

typedef struct mr_substrate mr_substrate_t; /* A plugin's own state. */

/*
 * ---- The core's upcalls ----------------------------------------------------
 *
 * Calls from a substrate into the core, made only from inside the
 * substrate's progress() (a transport callback that progress() drives
 * counts), on the one thread that calls MailRail; never from send() or any
 * other op. `core` is params->core. An upcall may call the substrate's
 * send() and send_control() (a handler answers, a return goes out), so a
 * substrate keeps its state consistent across each one.
 */
typedef struct mr_substrate_upcalls {
    /*
     * Receive slots. recv_slot_acquire() takes a slot of
     * params->datagram_size bytes to read an arriving payload into, or
     * returns NULL when none is free: the substrate then stops reading that
     * message (it stays in the transport, or is held: held()) and tries again
     * in a later progress(). recv_slot_abandon() gives back a slot it took
     * and did not deliver (a peer failed mid-message).
     */
    void *(*recv_slot_acquire)(void *core);
    void (*recv_slot_abandon)(void *core, void *slot);

    /*
     * The one way a message reaches mr_receive() or its consumer, zero copy:
     * `length` bytes from `source` of `kind`, with the immediate `imm` that
     * flow control reads. With `handle` NULL, `data` is a slot from
     * recv_slot_acquire(), now the core's. Otherwise the bytes stay the
     * substrate's until the core calls release_recv(handle); the core returns
     * MR_AGAIN when it has no slot to account for them, and the substrate
     * delivers them again in a later progress(). A batch (MR_KIND_BATCH)
     * comes only in a slot.
     */
    mr_status_t (*deliver)(void *core, int source, unsigned kind, uint32_t imm, void *data,
                           size_t length, void *handle);
    /*
     * deliver() of a copy: takes a slot, copies `length` bytes at `data` into
     * it and delivers them, in one call; the bytes are the substrate's again
     * on return. MR_AGAIN when no slot is free: nothing was taken. For a
     * transport that receives into buffers of its own that it must reuse at
     * once (a batch's frames, an eager message in UCX's callback). Kept
     * apart from recv_slot_acquire() + deliver() because it skips the check
     * that a slot is one the core handed out: 16-32 fewer instructions per
     * uncoalesced 8-byte message on UCX's receiver (docs/notes/performance-history.md).
     */
    mr_status_t (*deliver_copy)(void *core, int source, unsigned kind, uint32_t imm,
                                const void *data, size_t length);
    /*
     * A handler's message offered to its handler at once, without a slot:
     * `length` payload bytes at `data` for handler `id` (mailrail.h). MR_OK:
     * the handler ran and the bytes may be reused on return. MR_AGAIN: it
     * must come the usual way (deliver or deliver_copy, kind
     * MR_KIND_HANDLER, the id as the payload's last byte), because earlier
     * handler messages wait, or the handler asked to be called again; do not
     * offer the same message twice. mr__deliver_handler_trailer()
     * (substrates/common) offers a message whose id is its last byte.
     */
    mr_status_t (*deliver_handler_now)(void *core, int source, uint32_t imm, unsigned id,
                                       const void *data, size_t length);
    /*
     * deliver_handler_now() of the frames of a batch, from its start, while
     * they are handlers' messages that run: returns how many ran, and the
     * bytes they took in *consumed (whole frames). The substrate delivers the
     * rest the usual way, from there. One call per batch instead of one per
     * frame: a UCX receiver runs 58 instructions per 8-byte handler message
     * with it and 132 without, MPI's 60 and 300.
     */
    unsigned (*deliver_now_frames)(void *core, int source, const void *frames, size_t length,
                                   size_t *consumed);

    /* A send accepted with MR_OK is done with its buffer; `cookie` is send()'s. */
    void (*send_complete)(void *core, void *cookie);
    /* A control message from `source` (send_control()) with its immediate. */
    void (*control)(void *core, int source, uint32_t imm);
    /*
     * Rank `rank` is gone (end of stream before closing(), a reset, a
     * protocol error, no answer within timeout_s); `why` says which. Once per
     * rank; sends to it fail with MR_ERR_PEER_FAILED from then on.
     */
    void (*peer_failed)(void *core, int rank, mr_status_t why);
} mr_substrate_upcalls_t;

/* What the core tells a substrate when it opens it. */
typedef struct mr_substrate_params {
    int rank;
    int size;
    const int *node_of_rank;          /* size entries. */
    size_t datagram_size;             /* Largest payload. */
    size_t max_sends;                 /* Most sends in flight at once (send pool slots). */
    size_t recv_slots;                /* Receive pool slots. */
    const uint8_t *job_key;           /* MR_JOB_KEY_LEN secret bytes, same on every rank. */
    const char *job_id;               /* Printable job name, same on every rank. */
    const void *bootstrap_comm;       /* The bootstrap's MPI_Comm (a duplicate), or NULL. */
    unsigned timeout_s;               /* Bound on blocking waits (connect, flush). */
    const void *config;               /* The plugin's settings, parsed from its table. */
    void *core;                       /* First argument of every upcall. */
    const mr_substrate_upcalls_t *upcalls;
    void (*log)(mr_log_level_t level, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
    const mr_log_level_t *log_threshold;
    size_t coalesce_bytes;            /* MAILRAIL_COALESCE_BYTES: 0, or the largest message a
                                         substrate may pack with others to the same rank. */
} mr_substrate_params_t;

/*
 * ---- The ops table -----------------------------------------------------------
 *
 * Every op is called by the core (core/runtime/) on the one thread that
 * calls MailRail, never concurrently and never from inside an upcall unless
 * its contract says so (send() and send_control() may be). An op marked
 * "may be NULL" is optional; the core checks the others when it loads the
 * plugin. Statuses are mailrail.h's: MR_OK, MR_AGAIN (positive: try later),
 * negative errors. An op that fails sets no output.
 */
typedef struct mr_substrate_ops {
    /*
     * The header, checked at load: the ABI version and the table's size must
     * be this header's, and the name the file name's <name>.
     */
    uint32_t abi_version;             /* MR_SUBSTRATE_ABI_VERSION. */
    uint32_t ops_size;                /* sizeof(mr_substrate_ops_t). */
    const char *name;
    const char *description;          /* One line for mailrail_info. */

    /* ---- Settings: read by the core before open() ---- */

    /* The plugin's MAILRAIL_<NAME>_* settings (mailrail_info lists them); may be NULL. */
    const mr_config_entry_t *config_table;
    size_t config_size;               /* Size of the struct the table fills. */
    /*
     * A prefix of MAILRAIL_* names that the plugin hands on to a library that
     * checks them itself (UCX: "MAILRAIL_UCX_"): the core does not call them
     * unknown. May be NULL.
     */
    const char *settings_passthrough_prefix;
    /*
     * config_table names whose value must be the same on every rank,
     * NULL-terminated: mr_init() compares them across ranks and fails on
     * every rank, naming the setting, when they differ. May be NULL.
     */
    const char *const *job_wide_settings;

    /* ---- Lifecycle: mr_init() and mr_finalize(), in this order ---- */

    /*
     * mr_init(): creates the substrate's local state and address; talks to
     * no peer yet. The parameters stay valid until close().
     */
    mr_status_t (*open)(const mr_substrate_params_t *params, mr_substrate_t **out);
    /*
     * mr_init(), once after open(): the receive region and the append
     * windows, each may be NULL. recv_region(): the array at whose start lies
     * every buffer passed to deliver() with a handle, `*count` buffers of
     * `*stride` bytes from `*base`, valid until close(), so that the core
     * finds such a buffer's slot by its index; false, setting nothing, when
     * there is none. append_windows(): one window per rank (above) and in
     * *max_frame the largest payload they take, valid until close(); NULL
     * when the substrate packs nothing.
     */
    bool (*recv_region)(mr_substrate_t *s, void **base, size_t *stride, uint32_t *count);
    mr_append_window_t *(*append_windows)(mr_substrate_t *s, size_t *max_frame);
    /* mr_init(): this rank's address, at most MR_SUBSTRATE_ADDR_MAX bytes, for the bootstrap. */
    mr_status_t (*get_address)(mr_substrate_t *s, void *addr, size_t *length);
    /* mailrail_info and logs: a printable form of an address from get_address(). */
    void (*format_address)(const void *addr, size_t length, char *buf, size_t len);
    /*
     * mr_init(): every rank's address, `addrs` holding size addresses of
     * `addr_len` bytes (shorter ones zero-padded), by rank, valid until
     * close(). Returns once any rank can be sent to. Connect to a peer only
     * when the first message to it leaves (or in watch() or preconnect()), so
     * that a rank holds nothing for peers it never talks to; sends to a peer
     * not connected yet wait in the substrate (MR_OK) until it is, or fail it
     * (peer_failed) after timeout_s.
     */
    mr_status_t (*connect)(mr_substrate_t *s, const void *addrs, size_t addr_len);
    /*
     * mr_init(), after connect(), for this rank's two neighbours on a ring of
     * all ranks (core/runtime/failures.c passes failure notices around it):
     * make sure a failure of `rank` is reported through peer_failed() although
     * this rank may never send to it, by connecting or letting `rank` connect
     * (both ends are asked). Does not block. May be NULL: the substrate then
     * reports failures only of ranks it talks to.
     */
    mr_status_t (*watch)(mr_substrate_t *s, int rank);
    /*
     * mr_init(), after open(): add descriptor `fd` to what a sleeping
     * progress() waits on; when it is readable, progress() returns at least
     * 1 without sleeping. The substrate neither reads nor closes it. Lets
     * flow control wake a rank asleep in mr_wait() for credits another
     * process put in shared memory. May be NULL: such a rank sleeps until its
     * timeout.
     */
    mr_status_t (*wake_fd)(mr_substrate_t *s, int fd);
    /*
     * mr_connect(), any number of times per rank, both ranks of a pair
     * perhaps at once: start what the first send to `rank` would (a dial, an
     * endpoint) without blocking. MR_OK: established both ways, so that a
     * message pays for no dialling or wire-up (TCP: handshake done and
     * ACCEPT written; UCX: the endpoint flushed). MR_AGAIN: under way, ask
     * again after a progress(). MR_ERR_PEER_FAILED (also reported through
     * peer_failed()), MR_ERR_INVALID_RANK for this rank or one outside the
     * job, MR_ERR_NO_MEMORY, transport errors. Nothing to dial (MPI): MR_OK.
     * May be NULL: mr_connect() then only synchronizes the ranks.
     */
    mr_status_t (*preconnect)(mr_substrate_t *s, int rank);
    /*
     * The core gave up on `rank` by its own clock (MAILRAIL_TIMEOUT passed
     * without a word from it): drop the connection or endpoint by force and
     * complete every send to it still in flight (send_complete()), in a later
     * progress(), as after a failure found here. A peer_failed() for `rank`
     * may follow; the core ignores it. Never blocks. May be NULL: sends in
     * flight to `rank` then stay until the transport ends them.
     */
    void (*abandon)(mr_substrate_t *s, int rank);
    /*
     * mr_finalize(), once every rank finished sending: from now on a peer's
     * end of stream is expected, not a failure. May be NULL.
     */
    void (*closing)(mr_substrate_t *s);
    /*
     * mr_finalize(), last, after all ranks agreed to finalize: closes every
     * connection and frees everything. No upcall may follow.
     */
    void (*close)(mr_substrate_t *s);

    /* ---- Sending: from the datapath, and from inside upcalls ---- */

    /*
     * Starts sending `length` bytes at `data` (at most datagram_size, plus a
     * handler's id byte) of `kind` with immediate `imm` to `dest`, never this
     * rank. MR_OK: accepted; send_complete(cookie) follows in a later
     * progress(), and the bytes stay untouched until then.
     * MR_SUBSTRATE_SENT: accepted and done, the bytes are free now, no
     * completion follows. MR_AGAIN: not accepted; the core tries `dest` again
     * only after the next progress(). MR_ERR_PEER_FAILED, transport errors.
     * A message taken from an append window instead never comes here.
     */
    mr_status_t (*send)(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                        const void *data, size_t length, void *cookie);
    /*
     * A control message, no payload, only `imm` (a credit return), on a
     * channel of its own so that it does not queue behind data. MR_OK:
     * accepted, no completion follows; MR_AGAIN: try later.
     */
    mr_status_t (*send_control)(mr_substrate_t *s, int dest, uint32_t imm);

    /* ---- Progress: mr_receive(), mr_poll(), mr_wait() and every wait of the core ---- */

    /*
     * Moves the transport along and runs the upcalls. Waits up to
     * `timeout_ms` for an event when nothing is ready (0: never waits).
     * Returns the events handled (>= 0) or a negative status for a local
     * failure.
     */
    int (*progress)(mr_substrate_t *s, int timeout_ms);
    /*
     * Whether a progress() that waits costs much more than one that does not
     * when news comes at once (UCX: arming the worker is several system
     * calls, and a rank is woken for nearly every message). Then, with ranks
     * that outnumber the CPUs, mr_wait() naps and polls for about 1 ms before
     * it waits (MAILRAIL_WAIT_NAP=auto). False for a single epoll_wait().
     */
    bool wait_is_costly;
    /*
     * mr_release() of a buffer deliver() passed with `handle`: the substrate
     * may reuse it. May be NULL when the substrate never passes a handle.
     */
    void (*release_recv)(mr_substrate_t *s, void *handle);
    /*
     * After a progress() in which a slot was refused, and after each one
     * while it returns more than 0: the messages this substrate took from the
     * transport that wait for a slot (held, spilled, read ahead). With the
     * slots in use, what is in flight to this rank, which the core checks
     * against what flow control granted (mr_stats_t.recv_inflight). May be
     * NULL: the substrate takes a message only into a slot.
     */
    uint64_t (*held)(mr_substrate_t *s);

    /* ---- Queries ---- */

    /* mr_get_stats(): adds the substrate's counters (connections_rejected, ...). May be NULL. */
    void (*stats)(mr_substrate_t *s, mr_stats_t *stats);
} mr_substrate_ops_t;

typedef const mr_substrate_ops_t *(*mr_substrate_entry_fn)(void);

/*
 * Logs through the core's log function (params->log) when `level` is within
 * its threshold (params->log_threshold). Plugins must not call core symbols
 * directly: the core may be linked statically into a tool, or dlopen'd
 * privately, where the plugin cannot resolve them.
 */
#define MR_SUBSTRATE_LOG(log_fn, threshold_ptr, level, ...)                              \
    do {                                                                                 \
        if ((log_fn) != NULL && (level) <= *(threshold_ptr)) (log_fn)((level), __VA_ARGS__); \
    } while (0)

/*
 * The checks every substrate's open() makes of its parameters: rank and size,
 * sends, a datagram size from 1 to `max_datagram`, every upcall, and the job
 * key when `needs_key`. Logs what is wrong as `who` ("TCP substrate") and
 * returns false.
 */
static inline bool mr_substrate_params_valid(const mr_substrate_params_t *p, const char *who,
                                             size_t max_datagram, bool needs_key)
{
    const mr_substrate_upcalls_t *u = p->upcalls;

    if (p->size >= 1 && p->rank >= 0 && p->rank < p->size && p->max_sends > 0 &&
        p->datagram_size > 0 && p->datagram_size <= max_datagram &&
        (p->job_key != NULL || !needs_key) && u != NULL && u->recv_slot_acquire &&
        u->recv_slot_abandon && u->deliver && u->deliver_copy && u->deliver_handler_now &&
        u->deliver_now_frames && u->send_complete && u->control && u->peer_failed) {
        return true;
    }
    if (p->log != NULL) {
        p->log(MR_LOG_ERROR, "%s: invalid parameters (rank %d of %d, datagram size %zu, %zu sends, "
               "missing %supcalls).", who, p->rank, p->size, p->datagram_size, p->max_sends,
               needs_key ? "key or " : "");
    }
    return false;
}

#endif /* MR_SUBSTRATE_H */
