/*
 * The substrate plugin ABI. Internal: compiled into the core and into each
 * plugin under substrates/, never installed.
 *
 * A substrate is a shared module named mailrail_substrate_<name>.so that
 * exports one function, mr_substrate_get_ops(), returning a constant ops
 * table. The table starts with its ABI version and its size so that it can
 * grow; the core validates both, the name and every mandatory function when
 * it loads the plugin.
 *
 * Data path. The core hands a substrate a message with a small header: a kind
 * and a 32-bit immediate field (flow control piggybacks credits in it). The
 * substrate reports progress through upcalls into the core: arrivals, send
 * completions, control messages and peer failures. Control messages carry no
 * payload, only an immediate, on a channel of their own so that they are not
 * queued behind data. Upcalls run only inside progress(), never inside send().
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

#define MR_SUBSTRATE_ABI_VERSION 9
#define MR_SUBSTRATE_ENTRY "mr_substrate_get_ops"
#define MR_SUBSTRATE_PREFIX "mailrail_substrate_"

/* Longest substrate address, in bytes, exchanged through the bootstrap. */
#define MR_SUBSTRATE_ADDR_MAX 1024

/* Length of the per-job secret distributed by the bootstrap. */
#define MR_JOB_KEY_LEN 32

/*
 * What send() returns for a message the transport has already finished
 * with (UCX copied it out): the buffer is free again at once, and no
 * send_complete() follows. Positive, like MR_AGAIN: not an error. ABI 3.
 */
#define MR_SUBSTRATE_SENT ((mr_status_t)2)

/* Message kinds carried in the header. */
enum {
    MR_KIND_DATA = 1,    /* Application payload; imm is owned by flow control. */
    MR_KIND_ITEMS = 2,   /* An aggregator's datagram (mailrail_items.h); imm as for data.
                            Every substrate carries both kinds (ABI version 2). */
    MR_KIND_HANDLER = 3, /* A message for an active-message handler, its id in the last
                            byte (mailrail.h); imm as for data. ABI 4. */
    MR_KIND_BATCH = 4    /* Data messages of one sender in one transport message, as
                            frames (below); imm as for data. ABI 5. */
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
 * An append window (ABI 6): the batch a coalescing substrate is filling for
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

/* Calls from a substrate back into the core. `core` is params->core. */
typedef struct mr_substrate_upcalls {
    /*
     * Takes a receive-pool slot of params->datagram_size bytes to copy an
     * arriving payload into, or returns NULL when none is free. A substrate
     * that gets NULL stops reading that message and tries again in a later
     * progress call.
     */
    void *(*recv_slot_acquire)(void *core);
    /* Gives back a slot taken with recv_slot_acquire() that was not delivered. */
    void (*recv_slot_abandon)(void *core, void *slot);
    /*
     * One message arrived from `source`. `data` is a slot from
     * recv_slot_acquire() when `handle` is NULL. Otherwise the bytes are owned
     * by the substrate, which keeps them until the core calls release_recv()
     * with `handle`; then the core returns MR_AGAIN when it has no slot to
     * account for the message, and the substrate must deliver it again later.
     */
    mr_status_t (*deliver)(void *core, int source, unsigned kind, uint32_t imm, void *data,
                           size_t length, void *handle);
    /*
     * Copies `length` bytes at `data` into a fresh receive slot and delivers
     * them, as recv_slot_acquire(), a copy and deliver() would, in one call.
     * MR_AGAIN when no slot is free: nothing was taken. ABI 3.
     */
    mr_status_t (*deliver_copy)(void *core, int source, unsigned kind, uint32_t imm,
                                const void *data, size_t length);
    /* A send accepted with MR_OK has left its buffer; the cookie is send()'s. */
    void (*send_complete)(void *core, void *cookie);
    /* A control message from `source` with its immediate. */
    void (*control)(void *core, int source, uint32_t imm);
    /* Rank `rank` is gone (EOF, reset, protocol error); `why` says which. */
    void (*peer_failed)(void *core, int rank, mr_status_t why);
    /*
     * Offers a message of kind MR_KIND_HANDLER to be consumed at once, from
     * the transport's own receive callback, without a receive slot: MR_OK when
     * the core consumed it (its bytes may be reused on return), MR_AGAIN when
     * it must be delivered the usual way (earlier handler messages wait, or
     * the handler asked to be called again later). Only from progress(). ABI 4.
     */
    mr_status_t (*deliver_now)(void *core, int source, uint32_t imm, const void *data,
                               size_t length);
    /*
     * deliver_now() of a batch of frames, from its start: the core consumes
     * frames of kind MR_KIND_HANDLER while it can, and returns how many, with
     * the bytes they take in *consumed (whole frames). The substrate delivers
     * the rest the usual way, from there. Only from progress(). ABI 6.
     */
    unsigned (*deliver_now_frames)(void *core, int source, const void *frames, size_t length,
                                   size_t *consumed);
    /*
     * deliver_now() of a handler's message that carried its handler's id
     * apart from its payload (not as its last byte): `length` bytes at `data`
     * are the payload alone. Lets a substrate put the id where the receiver
     * reads anyway, instead of in the payload's last cache line. ABI 8.
     */
    mr_status_t (*deliver_handler_now)(void *core, int source, uint32_t imm, unsigned id,
                                       const void *data, size_t length);
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

typedef struct mr_substrate_ops {
    uint32_t abi_version;             /* MR_SUBSTRATE_ABI_VERSION. */
    uint32_t ops_size;                /* sizeof(mr_substrate_ops_t) the plugin was built with. */
    const char *name;                 /* Must match the file name's <name>. */
    const char *description;          /* One line for mailrail_info. */
    const mr_config_entry_t *config_table; /* Plugin settings; may be NULL. */
    size_t config_size;               /* Size of the struct the table fills. */

    /*
     * Creates the substrate's local state and its address. Does not talk to
     * peers yet. Sets *out only on MR_OK.
     */
    mr_status_t (*open)(const mr_substrate_params_t *params, mr_substrate_t **out);

    /* Copies this rank's address (at most MR_SUBSTRATE_ADDR_MAX bytes). */
    mr_status_t (*get_address)(mr_substrate_t *s, void *addr, size_t *length);

    /*
     * Takes the address table: `addrs` holds params->size addresses of
     * `addr_len` bytes each (shorter ones zero-padded), indexed by rank; it
     * stays valid until close(). Returns once any rank can be sent to.
     * A substrate should connect to a peer only when the first message to it
     * leaves (or in watch() or preconnect()), so that a rank holds nothing for
     * the peers it never talks to; sends to a peer not connected yet wait in the substrate
     * (MR_OK) until it is, or fail it (peer_failed) after timeout_s.
     */
    mr_status_t (*connect)(mr_substrate_t *s, const void *addrs, size_t addr_len);

    /*
     * Starts sending `length` bytes at `data` to `dest` (never this rank).
     * MR_OK: accepted; send_complete(cookie) follows in a later progress call
     * and until then the bytes must stay untouched. MR_SUBSTRATE_SENT:
     * accepted and done, the bytes are free now. MR_AGAIN: not accepted now;
     * the core tries again only after the next progress call. Errors:
     * MR_ERR_PEER_FAILED and transport errors.
     */
    mr_status_t (*send)(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                        const void *data, size_t length, void *cookie);

    /*
     * Sends a zero-payload control message on the control channel. MR_OK:
     * accepted, no completion follows. MR_AGAIN: try again later.
     */
    mr_status_t (*send_control)(mr_substrate_t *s, int dest, uint32_t imm);

    /*
     * Makes progress, running upcalls. Waits up to `timeout_ms` for an event
     * when nothing is ready (0: never waits). Returns the number of events
     * handled (>= 0) or a negative status for a local failure.
     */
    int (*progress)(mr_substrate_t *s, int timeout_ms);

    /* Releases a substrate-owned receive buffer passed to deliver(). May be NULL. */
    void (*release_recv)(mr_substrate_t *s, void *handle);

    /*
     * Writes a printable form of an address obtained from get_address().
     */
    void (*format_address)(const void *addr, size_t length, char *buf, size_t len);

    /*
     * Every rank has finished sending and is about to close: from now on a
     * peer's end-of-stream is expected and is not a failure. May be NULL.
     */
    void (*closing)(mr_substrate_t *s);

    /* Adds the substrate's counters (connections_rejected, ...) to *stats. May be NULL. */
    void (*stats)(mr_substrate_t *s, mr_stats_t *stats);

    /*
     * Closes every connection and frees everything. Called after all ranks
     * agreed to finalize, so end-of-stream from peers is expected then.
     */
    void (*close)(mr_substrate_t *s);

    /*
     * Fields below were added after the first version of this table. The
     * core reads one only when ops_size covers it, so that a plugin built
     * against an older header still loads.
     */

    /*
     * A prefix of MAILRAIL_* names that the plugin hands on to a library of
     * its own, which checks them itself (the UCX plugin: "MAILRAIL_UCX_", for
     * UCX). The core does not report names under it as unknown. May be NULL.
     */
    const char *settings_passthrough_prefix;

    /*
     * Names of config_table entries whose value must be the same on every
     * rank, NULL-terminated: mr_init() checks them with the core's job-wide
     * settings and fails on every rank, naming the setting, when they differ.
     * May be NULL.
     */
    const char *const *job_wide_settings;

    /*
     * Makes sure that the failure of `rank` is detected and reported through
     * peer_failed() although this rank may never send to it. The core calls
     * it after connect() for its two neighbours on a ring of all ranks and
     * passes failure notices around that ring, so that every rank learns of
     * every failure (core/runtime/failures.c). A substrate that connects on first
     * send connects to `rank` here, or lets `rank` connect (both ends are
     * asked). Does not block. May be NULL: the substrate detects no failures
     * of ranks it does not talk to.
     */
    mr_status_t (*watch)(mr_substrate_t *s, int rank);

    /*
     * Adds descriptor `fd` to what a sleeping progress() waits on: when it is
     * readable, progress() returns at least 1 without sleeping. The substrate
     * reads nothing from it (its owner drains it) and does not close it. Lets
     * flow control wake a rank that sleeps in mr_wait() for credits another
     * process put in shared memory. May be NULL: such a rank then sleeps until
     * its timeout.
     */
    mr_status_t (*wake_fd)(mr_substrate_t *s, int fd);

    /*
     * The messages this substrate took from the transport that wait for a
     * receive slot now (held, spilled or read ahead): with the slots in use,
     * what is in flight to this rank, which the core checks against what flow
     * control granted (mr_stats_t.recv_inflight). Called after a progress()
     * in which a slot was refused, and after every one while it returns more
     * than 0. May be NULL: the substrate takes a message only into a slot.
     */
    uint64_t (*held)(mr_substrate_t *s);

    /*
     * The substrate's append windows, one per rank (mr_append_window_t), which
     * stay valid until close(), and in *max_frame the largest payload they
     * take; NULL when it packs nothing. Called once, after open(). May be
     * NULL. ABI 6.
     */
    mr_append_window_t *(*append_windows)(mr_substrate_t *s, size_t *max_frame);

    /*
     * The array that every buffer this substrate passes to deliver() with a
     * handle lies at the start of: `*count` buffers of `*stride` bytes from
     * `*base`, valid until close(). The core then finds the receive slot of a
     * buffer the application releases by its index, not by a hash. Returns
     * false, setting nothing, when the substrate has no such array. Called
     * once, after open(). May be NULL. ABI 7.
     */
    bool (*recv_region)(mr_substrate_t *s, void **base, size_t *stride, uint32_t *count);

    /*
     * Connects to `rank` ahead of its first message, for mr_connect(): starts
     * what the first send to `rank` would start (a dial, an endpoint), without
     * blocking, and says how far it got. MR_OK: the connection is established
     * and usable both ways, so that a message to `rank` pays for no dialling
     * or wire-up (TCP: the handshake done and its ACCEPT written; UCX: the
     * endpoint wired up, as a flush of it proves). MR_AGAIN: under way, ask
     * again after a progress call, which moves it along. MR_ERR_PEER_FAILED:
     * `rank` failed or cannot be reached (its failure is reported through
     * peer_failed() as well); MR_ERR_INVALID_RANK for this rank or one outside
     * the job; MR_ERR_NO_MEMORY and transport errors. Called after connect(),
     * any number of times for the same rank; it may be asked of both ranks
     * of a pair at once. A substrate with nothing to dial (MPI) returns MR_OK.
     * May be NULL: mr_connect() then only synchronizes the ranks. ABI 9.
     */
    mr_status_t (*preconnect)(mr_substrate_t *s, int rank);
} mr_substrate_ops_t;

/* The smallest ops table the core accepts: the first version's fields. */
#define MR_SUBSTRATE_OPS_MIN_SIZE offsetof(mr_substrate_ops_t, settings_passthrough_prefix)

/* True when the plugin's ops table has `field` (it was built with a header that had it). */
#define MR_SUBSTRATE_OPS_HAS(ops, field)                                                  \
    ((ops)->ops_size >= offsetof(mr_substrate_ops_t, field) + sizeof((ops)->field))

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
        u->recv_slot_abandon && u->deliver && u->send_complete && u->control && u->peer_failed) {
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
