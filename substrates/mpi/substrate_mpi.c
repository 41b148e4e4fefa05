/*
 * The MPI substrate: MailRail over MPICH point-to-point messages, with
 * credits in tags on a control communicator. Its send window, the splitting
 * of large immediates, the receive ring and its arrival order, the zero-copy
 * staging buffers, failures and teardown are described in
 * docs/architecture.md, "The MPI substrate" (#the-mpi-substrate).
 */
#include "mr_batch.h"
#include "mr_substrate_base.h"

#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Constants.                                                                */

#define MRMPI_ADDR_MAGIC 0x4d524d50u /* "MRMP" as a number, host byte order. */
#define MRMPI_ADDR_VERSION 1
#define MRMPI_ADDR_HOST_LEN 64

#define MRMPI_CTRL_RECVS 7           /* Control receives kept posted (see MRMPI_TEST_BATCH). */
#define MRMPI_CTRL_SENDS 64          /* Control sends in flight, besides room for a split. */
#define MRMPI_SPIN_YIELDS 16         /* sched_yield() rounds before progress() sleeps. */
#define MRMPI_NAP_NS 50000L          /* Sleep between polls while waiting (50 us). */
#define MRMPI_CLOSE_WAIT_NS UINT64_C(2000000000) /* Bound on close() waiting for MPI. */
#define MRMPI_MARKS_PER_WINDOW 4     /* Synchronous sends per send window. */
/* MAILRAIL_MAX_RECVS=0: posted receives holding this many bytes, within these bounds. */
#define MRMPI_AUTO_RECV_BYTES (2u << 20)
#define MRMPI_AUTO_RECVS_MIN 16u
#define MRMPI_AUTO_RECVS_MAX 256u
/*
 * Receives tested by one MPI_Testsome. MPICH 4.0 runs its progress engine
 * before testing and again after every MPIR_CVAR_REQUEST_POLL_FREQ (8)
 * requests it tests: an MPI_Testsome over 64 receives costs 9 progress
 * passes, however few of them completed.
 */
#define MRMPI_TEST_BATCH 7
/* Coalescing (mr_batch.h): batches being filled or in flight, and their size at most. */
#define MRMPI_BATCHES 32u
#define MRMPI_BATCH_BYTES 8192u

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

typedef struct mpi_config {
    uint64_t max_recvs;
    uint64_t send_window;
} mpi_config_t;

static const mr_config_entry_t mpi_config_table[] = {
    {.name = "MAILRAIL_MAX_RECVS",
     .default_value = "0",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(mpi_config_t, max_recvs),
     .min = 0,
     .max = 65536,
     .doc = "The most receives the MPI substrate keeps posted at once (at most "
            "MAILRAIL_RECV_SLOTS), each into a staging buffer of MAILRAIL_DATAGRAM_SIZE bytes; "
            "twice this many buffers are allocated at init, since the application holds "
            "received messages in them (zero copy). Messages beyond the posted receives wait "
            "inside MPI. 0: as many as 2 MiB of datagrams, at least 16 and at most 256 (256 "
            "with 4 KiB datagrams). Keep it at least twice MAILRAIL_MPI_SEND_WINDOW, or a fast "
            "sender's small messages land in MPI's unexpected queue and are copied twice."},
    {.name = "MAILRAIL_MPI_SEND_WINDOW",
     .default_value = "128",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(mpi_config_t, send_window),
     .min = 0,
     .max = 1048576,
     .doc = "The most data messages the MPI substrate sends to one rank before MPI confirms "
            "that the receiver matched the older ones (every window/4-th message is an "
            "MPI_Issend whose completion confirms it; below 8, every message is); 0 sends "
            "without limit, letting a fast sender fill the receiver's unexpected-message "
            "queue."},
    {.name = NULL},
};

/* ------------------------------------------------------------------------ */
/* State.                                                                    */

/* The address blob: identifies the substrate; MPI needs no address. */
typedef struct mpi_wire_addr {
    uint32_t magic;
    uint8_t version;
    uint8_t reserved[3];
    uint64_t datagram_size;
    int32_t pid;
    char host[MRMPI_ADDR_HOST_LEN];
} mpi_wire_addr_t;

_Static_assert(sizeof(mpi_wire_addr_t) <= MR_SUBSTRATE_ADDR_MAX, "address too long");

/* One receive of the data ring. */
typedef struct mpi_recv {
    MPI_Status status;
    unsigned buf;              /* Staging buffer it receives into. */
    bool posted;               /* req is an active MPI_Irecv. */
    bool done;                 /* Completed, status saved, not delivered yet. */
    int rc;                    /* What MPI_Test returned for it. */
    size_t offset;             /* A batch: where its first frame not yet delivered starts. */
} mpi_recv_t;

/* A failure found outside progress(), reported by the next progress call. */
enum { PEER_OK = 0, PEER_FAIL_PENDING = 1, PEER_FAILED = 2 };

struct mr_substrate {
    mr__substrate_base_t base; /* base.rejected: ranks failed for a protocol error. */
    mpi_config_t cfg;

    MPI_Comm data_comm, ctrl_comm;
    bool have_data_comm, have_ctrl_comm;
    int tag_ub;                /* MPI_TAG_UB of the data and control communicators. */
    uint32_t kind_bit;         /* Data tags: this bit set for MR_KIND_ITEMS, */
    uint32_t data_imm_ub;      /* and the immediate in the bits below it, */
    uint32_t data_imm_max;     /* at most this, since */
    uint32_t batch_tag;        /* every bit set marks a batch of frames (mr_batch.h). */
    size_t coalesce_bytes;     /* MAILRAIL_COALESCE_BYTES. */
    mr__batcher_t batcher;
    bool connected;
    bool broken;               /* A local MPI failure: progress() only returns an error. */
    bool ctrl_hot;             /* Test control receives on the next pass (see progress_once). */
    uint32_t ctrl_polls;       /* progress_once() calls, to test control receives on some. */

    /*
     * Data receives: a ring in post order. The entries from `head` on,
     * `nposted` of them, are posted, and only the next entry after them is
     * ever posted, so that ring order stays MPI's matching order. Each posted
     * receive lands in a staging buffer, which is handed to the application
     * as it is (zero copy) and comes back through release_recv(): there are
     * twice as many staging buffers as ring entries, so that the ring stays
     * posted while the application holds messages.
     */
    mpi_recv_t *recvs;
    MPI_Request *recv_req;       /* Per ring entry, contiguous for MPI_Testsome. */
    unsigned nrecv;
    unsigned head;
    unsigned nposted;
    unsigned lead_done;          /* Entries from head on known to have completed. */
    uint8_t *staging;            /* nstage buffers of datagram_size bytes. */
    unsigned nstage;
    unsigned *stage_free;        /* Stack of free staging buffers. */
    unsigned nstage_free;

    /* Control receives: zero bytes, any source, any tag. */
    MPI_Request ctrl_recv[MRMPI_CTRL_RECVS];
    bool ctrl_posted;
    bool data_posted;          /* The ring is posted (not in a job of one rank). */
    char ctrl_dummy;

    /* Data sends in flight, dense in [0, nsend): request, cookie, destination. */
    size_t nsend;
    MPI_Request *send_req;
    void **send_cookie;
    int *send_dest;
    uint64_t *send_mark;       /* For an MPI_Issend marker, peer_sent after it; else 0. */
    mr__batch_t **send_batch;  /* The batch it carries (its cookie is unused), or NULL. */

    /*
     * The send window, per destination: data messages sent, and how many of
     * them the receiver is known to have matched (those up to the newest
     * completed marker). A send waits while they differ by send_window.
     */
    uint64_t send_window;
    uint64_t mark_every;
    uint64_t *peer_sent;
    uint64_t *peer_matched;

    /* Control sends in flight, dense in [0, nctrl). */
    size_t max_ctrl;
    size_t nctrl;
    MPI_Request *ctrl_req;
    int *ctrl_dest;

    /* Scratch for MPI_Testsome and the completions it finds (sized for the largest set). */
    int *indices;
    MPI_Status *statuses;
    void **done_cookie;
    mr__batch_t **done_batch;
    int *done_dest;
    int *done_err;

    /* Peers. */
    uint8_t *peer;             /* PEER_* per rank. */
    mr_status_t *peer_why;     /* Why, while PEER_FAIL_PENDING. */
    unsigned fail_pending;

    uint64_t discarded;        /* Messages from failed ranks, thrown away. */
    uint64_t split_imm;        /* Immediates too large for a tag, sent as control messages. */
    uint64_t dropped_ctrl;     /* Control messages not sent because closing() was called. */
};
MR__BASE_CHECK();

/* ------------------------------------------------------------------------ */
/* Helpers.                                                                  */


static void nap(long ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
    nanosleep(&ts, NULL);
}

/* Writes MPI's text for an error code into buf. */
static const char *mpi_errstr(int rc, char *buf, int len)
{
    int n = 0;

    if (MPI_Error_string(rc, buf, &n) != MPI_SUCCESS || n <= 0) {
        snprintf(buf, (size_t)len, "MPI error %d", rc);
    } else {
        buf[n < len ? n : len - 1] = '\0';
    }
    return buf;
}

static int mpi_errclass(int rc)
{
    int cls = rc;
    if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;
    return cls;
}

/* Logs a local MPI failure and marks the substrate broken. */
static mr_status_t mpi_fatal(mr_substrate_t *s, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];

    MR__LOG(s, MR_LOG_ERROR, "MPI substrate: %s failed: %s.", what,
            mpi_errstr(rc, text, (int)sizeof(text)));
    s->broken = true;
    return MR_ERR_TRANSPORT;
}

/*
 * Marks `rank` failed; the next progress call reports it. Safe outside
 * progress() (from send()), since it runs no upcall.
 */
static void peer_mark_failed(mr_substrate_t *s, int rank, mr_status_t why)
{
    if (rank < 0 || rank >= s->base.size || s->peer[rank] != PEER_OK) return;
    s->peer[rank] = PEER_FAIL_PENDING;
    s->peer_why[rank] = why;
    s->fail_pending++;
    if (why == MR_ERR_PROTOCOL) s->base.rejected++;
}

/* A send to or a message from `rank` failed with MPI error `rc`. */
static void peer_mpi_error(mr_substrate_t *s, int rank, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];

    if (rank < 0 || rank >= s->base.size || s->peer[rank] != PEER_OK) return;
    if (s->base.closing) {
        MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: %s rank %d failed while closing: %s.", what,
                rank, mpi_errstr(rc, text, (int)sizeof(text)));
    } else {
        MR__LOG(s, MR_LOG_WARN, "MPI substrate: %s rank %d failed: %s.", what, rank,
                mpi_errstr(rc, text, (int)sizeof(text)));
    }
    peer_mark_failed(s, rank, MR_ERR_PEER_FAILED);
}

/* Runs the peer_failed() upcalls queued by peer_mark_failed(). progress() only. */
static int drain_failures(mr_substrate_t *s)
{
    int n = 0;

    if (s->fail_pending == 0) return 0;
    for (int r = 0; r < s->base.size && s->fail_pending > 0; r++) {
        if (s->peer[r] != PEER_FAIL_PENDING) continue;
        s->peer[r] = PEER_FAILED;
        s->fail_pending--;
        s->base.up.peer_failed(s->base.core, r, s->peer_why[r]);
        n++;
    }
    return n;
}

static inline bool peer_usable(const mr_substrate_t *s, int rank)
{
    return s->peer[rank] == PEER_OK;
}

/* Control messages needed to carry `imm` in tags of at most tag_ub. */
static size_t split_count(const mr_substrate_t *s, uint32_t imm)
{
    uint64_t ub = (uint64_t)s->tag_ub;
    if (imm == 0) return 1;
    return (size_t)(((uint64_t)imm + ub - 1) / ub);
}

/* ------------------------------------------------------------------------ */
/* Posting receives.                                                         */

/*
 * Posts the ring entry after the posted ones into a free staging buffer.
 * MR_AGAIN when the application holds every spare buffer.
 */
static mr_status_t data_post_next(mr_substrate_t *s)
{
    unsigned i = (s->head + s->nposted) % s->nrecv;
    mpi_recv_t *e = &s->recvs[i];
    int rc;

    if (s->nposted == s->nrecv || s->nstage_free == 0) return MR_AGAIN;
    e->buf = s->stage_free[--s->nstage_free];
    rc = MPI_Irecv(s->staging + (size_t)e->buf * s->base.datagram_size, (int)s->base.datagram_size,
                   MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, s->data_comm, &s->recv_req[i]);
    if (rc != MPI_SUCCESS) {
        s->stage_free[s->nstage_free++] = e->buf;
        s->recv_req[i] = MPI_REQUEST_NULL;
        e->posted = false;
        return mpi_fatal(s, rc, "posting a data receive (MPI_Irecv)");
    }
    e->posted = true;
    e->done = false;
    e->offset = 0;
    s->nposted++;
    return MR_OK;
}

/* Posts ring entries while staging buffers are free. */
static mr_status_t data_post_all(mr_substrate_t *s)
{
    mr_status_t st;

    while ((st = data_post_next(s)) == MR_OK) {
    }
    return st == MR_AGAIN ? MR_OK : st;
}

static mr_status_t ctrl_post(mr_substrate_t *s, unsigned i)
{
    int rc = MPI_Irecv(&s->ctrl_dummy, 0, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, s->ctrl_comm,
                       &s->ctrl_recv[i]);

    if (rc != MPI_SUCCESS) {
        s->ctrl_recv[i] = MPI_REQUEST_NULL;
        return mpi_fatal(s, rc, "posting a control receive (MPI_Irecv)");
    }
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* Progress: sends.                                                          */

/*
 * Moves the requests still active to the front of [0, *n), keeping their
 * side tables in step. Completed requests are MPI_REQUEST_NULL after
 * MPI_Testsome.
 */
static void compact_sends(mr_substrate_t *s)
{
    size_t j = 0;

    for (size_t i = 0; i < s->nsend; i++) {
        if (s->send_req[i] == MPI_REQUEST_NULL) continue;
        if (i != j) {
            s->send_req[j] = s->send_req[i];
            s->send_cookie[j] = s->send_cookie[i];
            s->send_dest[j] = s->send_dest[i];
            s->send_mark[j] = s->send_mark[i];
            s->send_batch[j] = s->send_batch[i];
        }
        j++;
    }
    s->nsend = j;
}

static void compact_ctrl(mr_substrate_t *s)
{
    size_t j = 0;

    for (size_t i = 0; i < s->nctrl; i++) {
        if (s->ctrl_req[i] == MPI_REQUEST_NULL) continue;
        if (i != j) {
            s->ctrl_req[j] = s->ctrl_req[i];
            s->ctrl_dest[j] = s->ctrl_dest[i];
        }
        j++;
    }
    s->nctrl = j;
}

/* Completes every message of a batch that was sent or given up, and frees it. */
static int batch_complete(mr_substrate_t *s, mr__batch_t *b)
{
    return mr__batcher_complete(&s->batcher, b, &s->base.up, s->base.core);
}

/* The error of one completion reported by MPI_Testsome. */
static inline int testsome_err(int rc, const MPI_Status *st)
{
    return rc == MPI_ERR_IN_STATUS ? st->MPI_ERROR : MPI_SUCCESS;
}

/*
 * Completes data sends: every completion runs send_complete(), after
 * peer_failed() when the send failed. Returns the number of events or a
 * negative status.
 */
static int progress_sends(mr_substrate_t *s)
{
    int outcount = 0, rc, events = 0;
    size_t ndone = 0;

    if (s->nsend == 0) return 0;
    rc = MPI_Testsome((int)s->nsend, s->send_req, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi_fatal(s, rc, "testing data sends (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        int i = s->indices[k];
        s->done_cookie[ndone] = s->send_cookie[i];
        s->done_batch[ndone] = s->send_batch[i];
        s->done_dest[ndone] = s->send_dest[i];
        s->done_err[ndone] = testsome_err(rc, &s->statuses[k]);
        /* A completed marker: the receiver matched every message up to it. */
        if (s->send_mark[i] > s->peer_matched[s->send_dest[i]]) {
            s->peer_matched[s->send_dest[i]] = s->send_mark[i];
        }
        /* An erroneous request is freed by MPI too, but make sure it is not tested again. */
        s->send_req[i] = MPI_REQUEST_NULL;
        ndone++;
    }
    compact_sends(s);
    /* Upcalls last: the core may send again from them, which appends to the pool. */
    for (size_t k = 0; k < ndone; k++) {
        if (s->done_err[k] != MPI_SUCCESS) {
            peer_mpi_error(s, s->done_dest[k], s->done_err[k], "a data send to");
            events += drain_failures(s);
        }
        if (s->done_batch[k] != NULL) {
            events += batch_complete(s, s->done_batch[k]);
        } else {
            s->base.up.send_complete(s->base.core, s->done_cookie[k]);
            events++;
        }
    }
    return events;
}

/* Completes control sends; they have no completion upcall. */
static int progress_ctrl_sends(mr_substrate_t *s)
{
    int outcount = 0, rc;

    if (s->nctrl == 0) return 0;
    rc = MPI_Testsome((int)s->nctrl, s->ctrl_req, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi_fatal(s, rc, "testing control sends (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        int i = s->indices[k];
        int err = testsome_err(rc, &s->statuses[k]);
        if (err != MPI_SUCCESS) peer_mpi_error(s, s->ctrl_dest[i], err, "a control send to");
        s->ctrl_req[i] = MPI_REQUEST_NULL;
    }
    compact_ctrl(s);
    return 0; /* Failures found here count when drain_failures() reports them. */
}

/* ------------------------------------------------------------------------ */
/* Progress: receives.                                                       */

/* A receive completed with an error: blame the sender if MPI names one. */
static mr_status_t recv_error(mr_substrate_t *s, const MPI_Status *st, int rc, bool control)
{
    char text[MPI_MAX_ERROR_STRING];
    int src = st->MPI_SOURCE;

    if (src < 0 || src >= s->base.size) {
        return mpi_fatal(s, rc, control ? "a control receive" : "a data receive");
    }
    if (mpi_errclass(rc) == MPI_ERR_TRUNCATE) {
        if (s->peer[src] == PEER_OK) {
            if (control) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a control message with a "
                        "payload; its messages are discarded from now on.", src);
            } else {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a message longer than the "
                        "datagram size, %zu bytes (is its MAILRAIL_DATAGRAM_SIZE larger?); its "
                        "messages are discarded from now on.", src, s->base.datagram_size);
            }
        }
        peer_mark_failed(s, src, MR_ERR_PROTOCOL);
        return MR_OK;
    }
    MR__LOG(s, MR_LOG_WARN, "MPI substrate: a %s receive from rank %d failed: %s.",
            control ? "control" : "data", src, mpi_errstr(rc, text, (int)sizeof(text)));
    peer_mark_failed(s, src, MR_ERR_PEER_FAILED);
    return MR_OK;
}

/* Handles completed control receives and posts them again. */
static int progress_ctrl_recvs(mr_substrate_t *s)
{
    int outcount = 0, rc, events = 0;
    int src[MRMPI_CTRL_RECVS], tag[MRMPI_CTRL_RECVS];
    int n = 0;

    if (!s->ctrl_posted) return 0;
    rc = MPI_Testsome(MRMPI_CTRL_RECVS, s->ctrl_recv, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi_fatal(s, rc, "testing control receives (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        const MPI_Status *st = &s->statuses[k];
        int err = testsome_err(rc, st);
        if (err != MPI_SUCCESS) {
            if (recv_error(s, st, err, true) != MR_OK) return MR_ERR_TRANSPORT;
        } else if (st->MPI_SOURCE >= 0 && st->MPI_SOURCE < s->base.size) {
            src[n] = st->MPI_SOURCE;
            tag[n] = st->MPI_TAG;
            n++;
        }
    }
    /* Posted again before the upcalls, which may send. */
    for (int k = 0; k < outcount; k++) {
        if (ctrl_post(s, (unsigned)s->indices[k]) != MR_OK) return MR_ERR_TRANSPORT;
    }
    for (int k = 0; k < n; k++) {
        if (!peer_usable(s, src[k])) {
            s->discarded++;
            continue;
        }
        s->base.up.control(s->base.core, src[k], (uint32_t)tag[k]);
        events++;
    }
    return events;
}

/*
 * Delivers the frames of a received batch from e->offset on, each copied
 * into a receive slot, until one finds no slot free. Returns the deliveries,
 * or MR_ERR_PROTOCOL when the frames do not add up.
 */
static int deliver_batch(mr_substrate_t *s, mpi_recv_t *e, int src, const uint8_t *buf,
                         size_t length)
{
    size_t off = e->offset, plen;
    const uint8_t *payload;
    unsigned kind;
    int n = 0, r;

    while ((r = mr__batch_frame_next(buf, length, &off, &kind, &payload, &plen)) == 1) {
        if (s->base.up.deliver_copy(s->base.core, src, kind, 0, payload, plen) != MR_OK) break;
        e->offset = off;
        n++;
    }
    return r < 0 ? MR_ERR_PROTOCOL : n;
}

/*
 * Delivers completed data receives in ring (arrival) order, stopping at the
 * first one that has not completed or when no receive slot is free. Returns
 * the number of messages delivered or discarded, or a negative status.
 */
static int progress_data_recvs(mr_substrate_t *s)
{
    int events = 0;

    if (!s->data_posted) return 0;
    /*
     * MPI matches receives in ring order, so the oldest ones complete first:
     * test a batch of MRMPI_TEST_BATCH from the oldest not completed, one
     * MPI_Testsome (one progress pass) each, and go on to the next batch
     * only when the whole batch completed. An MPI_Test per message made the
     * receiver three times slower, and one MPI_Testsome over the whole ring
     * costs a progress pass per 8 receives (see MRMPI_TEST_BATCH).
     */
    for (;;) {
        unsigned skip = s->lead_done, first, len = 0, active = 0;
        int outcount = 0, rc;

        while (skip < s->nposted && s->recvs[(s->head + skip) % s->nrecv].done) skip++;
        s->lead_done = skip;
        if (skip == s->nposted) break;
        first = (s->head + skip) % s->nrecv;
        /* A batch never wraps: MPI_Testsome takes a contiguous array. */
        while (len < MRMPI_TEST_BATCH && skip + len < s->nposted && first + len < s->nrecv) {
            if (!s->recvs[first + len].done) active++;
            len++;
        }
        rc = MPI_Testsome((int)len, s->recv_req + first, &outcount, s->indices, s->statuses);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            return mpi_fatal(s, rc, "testing data receives (MPI_Testsome)");
        }
        if (outcount == MPI_UNDEFINED) outcount = 0;
        for (int k = 0; k < outcount; k++) {
            unsigned i = first + (unsigned)s->indices[k];
            mpi_recv_t *e = &s->recvs[i];
            e->status = s->statuses[k];
            e->rc = testsome_err(rc, &s->statuses[k]);
            e->posted = false;
            e->done = true;
            s->recv_req[i] = MPI_REQUEST_NULL;
        }
        if ((unsigned)outcount < active) break;
    }
    while (s->nposted > 0) {
        unsigned i = s->head;
        mpi_recv_t *e = &s->recvs[i];
        int count = 0, src;

        if (!e->done) break;
        src = e->status.MPI_SOURCE;
        if (e->rc != MPI_SUCCESS) {
            /* Nothing to deliver. */
            if (recv_error(s, &e->status, e->rc, false) != MR_OK) return MR_ERR_TRANSPORT;
            events++;
        } else if (src < 0 || src >= s->base.size) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: a data receive completed from rank %d, "
                    "which is not in the job.", src);
            s->broken = true;
            return MR_ERR_TRANSPORT;
        } else if (!peer_usable(s, src)) {
            s->discarded++;
            events++;
        } else {
            if (MPI_Get_count(&e->status, MPI_BYTE, &count) != MPI_SUCCESS || count < 0 ||
                (size_t)count > s->base.datagram_size) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: cannot tell the length of a message "
                        "from rank %d.", src);
                s->broken = true;
                return MR_ERR_TRANSPORT;
            }
            uint8_t *buf = s->staging + (size_t)e->buf * s->base.datagram_size;
            uint32_t tag = (uint32_t)e->status.MPI_TAG;
            if (tag != s->batch_tag) {
                /* Zero copy: the staging buffer itself, until release_recv(). */
                unsigned kind = (tag & s->kind_bit) ? MR_KIND_ITEMS : MR_KIND_DATA;
                mr_status_t st = s->base.up.deliver(s->base.core, src, kind,
                                                    tag & s->data_imm_ub, buf, (size_t)count,
                                                    (void *)(uintptr_t)(e->buf + 1));
                /* No receive slot to account for it: the head waits, and everything after. */
                if (st == MR_AGAIN) break;
                if (st != MR_OK) return MR_ERR_TRANSPORT;
                e->done = false;
                s->head = (i + 1) % s->nrecv;
                s->nposted--;
                if (s->lead_done > 0) s->lead_done--;
                events++;
                continue;
            }
            /* A batch: its frames are copied out, and its buffer goes back at once. */
            int got = deliver_batch(s, e, src, buf, (size_t)count);
            if (got < 0) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a malformed batch of "
                        "messages; its messages are discarded from now on.", src);
                peer_mark_failed(s, src, MR_ERR_PROTOCOL);
                events++;
            } else {
                events += got;
                /* No receive slot for the rest: the head waits, and everything after. */
                if (e->offset < (size_t)count) break;
            }
        }
        /* Discarded, failed or a batch delivered: the staging buffer is free again. */
        s->stage_free[s->nstage_free++] = e->buf;
        e->done = false;
        s->head = (i + 1) % s->nrecv;
        s->nposted--;
        if (s->lead_done > 0) s->lead_done--;
    }
    if (data_post_all(s) != MR_OK) return MR_ERR_TRANSPORT;
    return events;
}

/* One pass over everything; returns the events handled or a negative status. */
static int progress_once(mr_substrate_t *s)
{
    int events = 0, n;

    events += drain_failures(s);
    n = progress_sends(s);
    if (n < 0) return n;
    events += n;
    n = progress_ctrl_sends(s);
    if (n < 0) return n;
    /*
     * Each MPI_Testsome is a pass of MPI's progress engine, the larger part
     * of an empty poll. Credits can wait a few polls: control receives are
     * tested on every 8th call, and on every call while they keep coming.
     */
    if (s->ctrl_hot || (++s->ctrl_polls & 7) == 0) {
        n = progress_ctrl_recvs(s);
        if (n < 0) return n;
        s->ctrl_hot = n > 0;
        events += n;
    }
    n = progress_data_recvs(s);
    if (n < 0) return n;
    events += n;
    events += drain_failures(s);
    return events;
}

/* ------------------------------------------------------------------------ */
/* Operations.                                                               */

static void mpi_close(mr_substrate_t *s);

/* The MPI substrate needs the MPI bootstrap's communicator, and MPI running. */
static mr_status_t mpi_check_bootstrap(const mr_substrate_params_t *p)
{
    int initialized = 0;

    if (p->bootstrap_comm == NULL) {
        if (p->log != NULL) {
            p->log(MR_LOG_ERROR, "MPI substrate: no MPI communicator from the bootstrap; the "
                   "MPI substrate needs the MPI bootstrap.");
        }
        return MR_ERR_UNSUPPORTED;
    }
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (p->log != NULL) p->log(MR_LOG_ERROR, "MPI substrate: MPI is not initialized.");
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}

/* No memory for the state: still takes part in both duplications, so that no rank hangs. */
static mr_status_t mpi_open_out_of_memory(const mr_substrate_params_t *p)
{
    MPI_Comm base, a, b;

    if (p->log != NULL) p->log(MR_LOG_ERROR, "MPI substrate: out of memory.");
    memcpy(&base, p->bootstrap_comm, sizeof(base));
    if (MPI_Comm_dup(base, &a) == MPI_SUCCESS) MPI_Comm_free(&a);
    if (MPI_Comm_dup(base, &b) == MPI_SUCCESS) MPI_Comm_free(&b);
    return MR_ERR_NO_MEMORY;
}

/*
 * Duplicates the bootstrap's communicator for data and for control, both
 * returning errors as codes. Collective: every rank makes both calls.
 */
static mr_status_t mpi_dup_comms(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    MPI_Comm base;
    int rc;

    memcpy(&base, p->bootstrap_comm, sizeof(base));
    rc = MPI_Comm_dup(base, &s->data_comm);
    if (rc != MPI_SUCCESS) {
        s->data_comm = MPI_COMM_NULL;
        mr_status_t st = mpi_fatal(s, rc, "duplicating the communicator for data (MPI_Comm_dup)");
        /* The second duplication still takes place, as on the other ranks. */
        MPI_Comm b;
        if (MPI_Comm_dup(base, &b) == MPI_SUCCESS) MPI_Comm_free(&b);
        return st;
    }
    s->have_data_comm = true;
    rc = MPI_Comm_dup(base, &s->ctrl_comm);
    if (rc != MPI_SUCCESS) {
        s->ctrl_comm = MPI_COMM_NULL;
        return mpi_fatal(s, rc, "duplicating the communicator for control (MPI_Comm_dup)");
    }
    s->have_ctrl_comm = true;
    MPI_Comm_set_errhandler(s->data_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(s->ctrl_comm, MPI_ERRORS_RETURN);
    return MR_OK;
}

/* The local checks, after the collectives: parameters, and rank and size as MPI sees them. */
static mr_status_t mpi_check_params(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    int crank = -1, csize = -1;

    if (!mr_substrate_params_valid(p, "MPI substrate", INT32_MAX, false)) {
        return MR_ERR_INVALID_PARAM;
    }
    MPI_Comm_rank(s->data_comm, &crank);
    MPI_Comm_size(s->data_comm, &csize);
    if (crank != p->rank || csize != p->size) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: the bootstrap communicator has this process as "
                "rank %d of %d, the core says rank %d of %d.", crank, csize, p->rank, p->size);
        return MR_ERR_INVALID_PARAM;
    }
    return MR_OK;
}

static mr_status_t mpi_read_tag_ub(mr_substrate_t *s)
{
    int *ub = NULL, flag = 0;
    int rc = MPI_Comm_get_attr(s->data_comm, MPI_TAG_UB, &ub, &flag);

    if (rc != MPI_SUCCESS || !flag || ub == NULL || *ub < 32767) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: cannot read MPI_TAG_UB.");
        return MR_ERR_TRANSPORT;
    }
    s->tag_ub = *ub;
    /* The highest bit that keeps every data tag within the bound tells the kind. */
    s->kind_bit = 1;
    while ((uint64_t)s->kind_bit * 4 - 1 <= (uint64_t)s->tag_ub) s->kind_bit *= 2;
    s->data_imm_ub = s->kind_bit - 1;
    s->data_imm_max = s->kind_bit - 2;
    s->batch_tag = s->kind_bit | s->data_imm_ub;
    return MR_OK;
}

/* The receive ring's length and the send window, from the settings. */
static void mpi_apply_settings(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    s->coalesce_bytes = p->coalesce_bytes;
    s->nrecv = (unsigned)s->cfg.max_recvs;
    if (s->nrecv == 0) {
        size_t n = MRMPI_AUTO_RECV_BYTES / p->datagram_size;
        s->nrecv = n < MRMPI_AUTO_RECVS_MIN ? MRMPI_AUTO_RECVS_MIN
                   : n > MRMPI_AUTO_RECVS_MAX ? MRMPI_AUTO_RECVS_MAX : (unsigned)n;
    }
    s->send_window = s->cfg.send_window;
    s->mark_every = s->send_window / MRMPI_MARKS_PER_WINDOW;
    if (s->mark_every == 0) s->mark_every = 1;
    /* Staged messages beyond the receive pool could not be delivered anyway. */
    if (p->recv_slots > 0 && s->nrecv > p->recv_slots) s->nrecv = (unsigned)p->recv_slots;
    /* Room for one whole split immediate besides the ordinary control sends. */
    s->max_ctrl = MRMPI_CTRL_SENDS + split_count(s, UINT32_MAX);
}

/* Everything the data path needs, allocated once. */
static mr_status_t mpi_alloc_buffers(mr_substrate_t *s)
{
    size_t max_sends = s->base.max_sends, scratch = max_sends;

    if (s->max_ctrl > scratch) scratch = s->max_ctrl;
    if (scratch < MRMPI_CTRL_RECVS) scratch = MRMPI_CTRL_RECVS;
    if (scratch < s->nrecv) scratch = s->nrecv;
    if (max_sends > INT32_MAX || (size_t)s->nrecv > SIZE_MAX / 2 / s->base.datagram_size) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: %zu send slots or %u staging buffers of %zu "
                "bytes are too many.", max_sends, s->nrecv, s->base.datagram_size);
        return MR_ERR_INVALID_PARAM;
    }
    s->recvs = calloc(s->nrecv, sizeof(*s->recvs));
    s->recv_req = malloc(s->nrecv * sizeof(*s->recv_req));
    s->nstage = 2 * s->nrecv;
    s->staging = malloc((size_t)s->nstage * s->base.datagram_size);
    s->stage_free = malloc(s->nstage * sizeof(*s->stage_free));
    s->send_req = malloc(max_sends * sizeof(*s->send_req));
    s->send_cookie = malloc(max_sends * sizeof(*s->send_cookie));
    s->send_dest = malloc(max_sends * sizeof(*s->send_dest));
    s->send_mark = malloc(max_sends * sizeof(*s->send_mark));
    s->send_batch = malloc(max_sends * sizeof(*s->send_batch));
    s->ctrl_req = malloc(s->max_ctrl * sizeof(*s->ctrl_req));
    s->ctrl_dest = malloc(s->max_ctrl * sizeof(*s->ctrl_dest));
    s->indices = malloc(scratch * sizeof(*s->indices));
    s->statuses = malloc(scratch * sizeof(*s->statuses));
    s->done_cookie = malloc(max_sends * sizeof(*s->done_cookie));
    s->done_batch = malloc(max_sends * sizeof(*s->done_batch));
    s->done_dest = malloc(max_sends * sizeof(*s->done_dest));
    s->done_err = malloc(max_sends * sizeof(*s->done_err));
    s->peer = calloc((size_t)s->base.size, sizeof(*s->peer));
    s->peer_why = calloc((size_t)s->base.size, sizeof(*s->peer_why));
    s->peer_sent = calloc((size_t)s->base.size, sizeof(*s->peer_sent));
    s->peer_matched = calloc((size_t)s->base.size, sizeof(*s->peer_matched));
    if (s->recvs == NULL || s->recv_req == NULL || s->staging == NULL ||
        s->stage_free == NULL || s->send_req == NULL ||
        s->send_cookie == NULL || s->send_dest == NULL || s->send_mark == NULL ||
        s->send_batch == NULL || s->done_batch == NULL ||
        s->peer_sent == NULL || s->peer_matched == NULL || s->ctrl_req == NULL ||
        s->ctrl_dest == NULL || s->indices == NULL || s->statuses == NULL ||
        s->done_cookie == NULL || s->done_dest == NULL || s->done_err == NULL ||
        s->peer == NULL || s->peer_why == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: out of memory for %u staging buffers of %zu "
                "bytes (MAILRAIL_MAX_RECVS) and %zu sends.", s->nrecv, s->base.datagram_size,
                max_sends);
        return MR_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < s->nrecv; i++) s->recv_req[i] = MPI_REQUEST_NULL;
    for (unsigned b = 0; b < s->nstage; b++) s->stage_free[b] = s->nstage - 1 - b;
    s->nstage_free = s->nstage;
    for (unsigned i = 0; i < MRMPI_CTRL_RECVS; i++) s->ctrl_recv[i] = MPI_REQUEST_NULL;
    size_t cap = s->base.datagram_size < MRMPI_BATCH_BYTES ? s->base.datagram_size
                                                            : MRMPI_BATCH_BYTES;
    if (mr__batcher_init(&s->batcher, s->base.size, MRMPI_BATCHES, cap, s->coalesce_bytes) !=
        MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: out of memory for %u batches of %zu bytes "
                "(MAILRAIL_COALESCE_BYTES).", MRMPI_BATCHES, cap);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

static mr_status_t mpi_open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s;
    mr_status_t st;

    if (p == NULL || out == NULL) return MR_ERR_INVALID_PARAM;
    st = mpi_check_bootstrap(p);
    if (st != MR_OK) return st;
    s = calloc(1, sizeof(*s));
    if (s == NULL) return mpi_open_out_of_memory(p);
    mr__base_init(&s->base, p);
    s->data_comm = s->ctrl_comm = MPI_COMM_NULL;
    /*
     * MPI_Comm_dup is collective: every check that could fail on some ranks
     * only comes after it, so that no rank is left waiting in it. The core
     * then agrees on the outcome and closes the substrate everywhere.
     */
    st = mpi_dup_comms(s, p);
    if (st == MR_OK) st = mpi_check_params(s, p);
    if (st == MR_OK) st = mpi_read_tag_ub(s);
    if (st == MR_OK) {
        mpi_apply_settings(s, p);
        st = mpi_alloc_buffers(s);
    }
    if (st != MR_OK) {
        mpi_close(s);
        return st;
    }
    MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: rank %d of %d, MPI_TAG_UB %d, %u receives posted "
            "into %zu bytes of staging, %zu data and %zu control send requests.", s->base.rank,
            s->base.size, s->tag_ub, s->nrecv, (size_t)s->nrecv * s->base.datagram_size,
            s->base.max_sends, s->max_ctrl);
    *out = s;
    return MR_OK;
}

static mr_status_t mpi_get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    mpi_wire_addr_t w;

    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    memset(&w, 0, sizeof(w));
    w.magic = MRMPI_ADDR_MAGIC;
    w.version = MRMPI_ADDR_VERSION;
    w.datagram_size = s->base.datagram_size;
    w.pid = (int32_t)getpid();
    if (gethostname(w.host, sizeof(w.host)) != 0) w.host[0] = '\0';
    w.host[sizeof(w.host) - 1] = '\0';
    memcpy(addr, &w, sizeof(w));
    *length = sizeof(w);
    return MR_OK;
}

static bool wire_addr_parse(const void *blob, size_t length, mpi_wire_addr_t *out)
{
    if (blob == NULL || length < offsetof(mpi_wire_addr_t, host)) return false;
    memset(out, 0, sizeof(*out));
    memcpy(out, blob, length < sizeof(*out) ? length : sizeof(*out));
    out->host[sizeof(out->host) - 1] = '\0';
    return out->magic == MRMPI_ADDR_MAGIC && out->version == MRMPI_ADDR_VERSION;
}

static void mpi_format_address(const void *addr, size_t length, char *buf, size_t len)
{
    mpi_wire_addr_t w;

    if (buf == NULL || len == 0) return;
    if (!wire_addr_parse(addr, length, &w)) {
        snprintf(buf, len, "mpi (not an MPI substrate address)");
        return;
    }
    snprintf(buf, len, "mpi rank-addressed (pid %d on %s)", (int)w.pid,
             w.host[0] ? w.host : "?");
}

/*
 * Nothing to connect: MPI addresses ranks. Checks the address table and
 * posts the receives.
 */
static mr_status_t mpi_connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    if (s == NULL || s->connected) return MR_ERR_INVALID_PARAM;
    for (int r = 0; r < s->base.size; r++) {
        mpi_wire_addr_t w;
        if (addrs == NULL ||
            !wire_addr_parse((const uint8_t *)addrs + (size_t)r * addr_len, addr_len, &w)) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: the address of rank %d is not an MPI "
                    "substrate address (does every rank use MAILRAIL_SUBSTRATE=mpi?).", r);
            return MR_ERR_PROTOCOL;
        }
        /*
         * A larger datagram elsewhere would truncate receives here, which
         * MPICH 4.0 turns into an abort of the job (see docs/architecture.md).
         */
        if (w.datagram_size != s->base.datagram_size) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d has MAILRAIL_DATAGRAM_SIZE=%llu, "
                    "rank %d has %zu; every rank must use the same datagram size.", r,
                    (unsigned long long)w.datagram_size, s->base.rank, s->base.datagram_size);
            return MR_ERR_CONFIG;
        }
    }
    if (s->base.size > 1) {
        s->head = 0;
        s->nposted = 0;
        s->lead_done = 0;
        if (data_post_all(s) != MR_OK) return MR_ERR_TRANSPORT;
        s->data_posted = true;
        for (unsigned i = 0; i < MRMPI_CTRL_RECVS; i++) {
            if (ctrl_post(s, i) != MR_OK) return MR_ERR_TRANSPORT;
        }
        s->ctrl_posted = true;
    }
    s->connected = true;
    return MR_OK;
}

/* Checks what every send needs; MR_OK when `dest` may be sent to. */
static mr_status_t send_check(mr_substrate_t *s, int dest)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    if (!s->connected) return MR_ERR_INVALID_RANK;
    if (s->broken) return MR_ERR_TRANSPORT;
    if (!peer_usable(s, dest)) return MR_ERR_PEER_FAILED;
    return MR_OK;
}

/*
 * Starts the zero-byte control sends that carry `imm` to `dest`, in tags of
 * at most tag_ub that add up to it. The caller has checked that the pool has
 * room for split_count(imm) of them.
 */
static mr_status_t ctrl_isend(mr_substrate_t *s, int dest, uint32_t imm)
{
    uint32_t left = imm;

    do {
        uint32_t part = left > (uint32_t)s->tag_ub ? (uint32_t)s->tag_ub : left;
        size_t k = s->nctrl;
        int rc = MPI_Isend(&s->ctrl_dummy, 0, MPI_BYTE, dest, (int)part, s->ctrl_comm,
                           &s->ctrl_req[k]);
        if (rc != MPI_SUCCESS) {
            s->ctrl_req[k] = MPI_REQUEST_NULL;
            peer_mpi_error(s, dest, rc, "a control send to");
            return MR_ERR_PEER_FAILED;
        }
        s->ctrl_dest[k] = dest;
        s->nctrl++;
        left -= part;
    } while (left > 0);
    return MR_OK;
}

/* Whether one more data message to `dest` fits the request pool and the send window. */
static bool data_can_send(const mr_substrate_t *s, int dest)
{
    return s->nsend < s->base.max_sends &&
           (s->send_window == 0 ||
            s->peer_sent[dest] + 1 - s->peer_matched[dest] <= s->send_window);
}

/*
 * Starts one data message with `tag`, as a marker (MPI_Issend) every
 * mark_every-th one to `dest`. It carries `batch`, or the single message of
 * `cookie` when `batch` is NULL. MR_AGAIN when data_can_send() says no.
 */
static mr_status_t data_isend(mr_substrate_t *s, int dest, uint32_t tag, const void *data,
                              size_t length, void *cookie, mr__batch_t *batch)
{
    uint64_t seq = s->peer_sent[dest] + 1;
    size_t k = s->nsend;
    bool mark;
    int rc;

    if (!data_can_send(s, dest)) return MR_AGAIN;
    mark = s->send_window > 0 && seq % s->mark_every == 0;
    if (mark) {
        rc = MPI_Issend(data, (int)length, MPI_BYTE, dest, (int)tag, s->data_comm,
                        &s->send_req[k]);
    } else {
        rc = MPI_Isend(data, (int)length, MPI_BYTE, dest, (int)tag, s->data_comm,
                       &s->send_req[k]);
    }
    if (rc != MPI_SUCCESS) {
        s->send_req[k] = MPI_REQUEST_NULL;
        peer_mpi_error(s, dest, rc, "a data send to");
        return MR_ERR_PEER_FAILED;
    }
    s->send_cookie[k] = cookie;
    s->send_dest[k] = dest;
    s->send_mark[k] = mark ? seq : 0;
    s->send_batch[k] = batch;
    s->peer_sent[dest] = seq;
    s->nsend++;
    return MR_OK;
}

/* Sends the batch being filled for `dest` as one message (MR_AGAIN: it stays open). */
static mr_status_t batch_send(mr_substrate_t *s, int dest)
{
    mr__batch_t *b = s->batcher.open[dest];
    mr_status_t st = data_isend(s, dest, s->batch_tag, b->data, b->used, NULL, b);

    if (st == MR_OK) mr__batcher_detach(&s->batcher, dest);
    return st;
}

/* batch_send() for mr__batcher_route(). */
static mr_status_t batch_send_to(void *s, int dest)
{
    return batch_send(s, dest);
}

/*
 * At the start of a progress call: sends every batch being filled that the
 * window lets go; those to failed ranks complete unsent. Returns the events.
 */
static int flush_batches(mr_substrate_t *s)
{
    int events = 0;

    /* Backwards: detaching moves the last open rank into the slot just visited. */
    for (unsigned i = s->batcher.nopen; i-- > 0;) {
        int dest = s->batcher.open_ranks[i];
        if (peer_usable(s, dest)) {
            batch_send(s, dest); /* Refused: it waits for the next call. */
        } else {
            events += batch_complete(s, mr__batcher_detach(&s->batcher, dest));
        }
    }
    return events;
}

static mr_status_t mpi_send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                            const void *data, size_t length, void *cookie)
{
    mr_status_t st = send_check(s, dest);
    uint32_t tag = imm;
    bool packed;

    if (st != MR_OK) return st;
    if ((kind != MR_KIND_DATA && kind != MR_KIND_ITEMS) || (data == NULL && length > 0)) {
        return MR_ERR_INVALID_PARAM;
    }
    if (length > s->base.datagram_size) return MR_ERR_MESSAGE_TOO_LONG;
    /* A small message after another to the same rank joins a batch (mr_batch.h). */
    st = mr__batcher_route(&s->batcher, dest, kind, imm, data, length, cookie, batch_send_to, s,
                           &packed);
    if (st != MR_OK || packed) return st;
    /* The receiver is a whole window behind: wait for a marker to complete. */
    if (!data_can_send(s, dest)) return MR_AGAIN;
    if (imm > s->data_imm_max) {
        /*
         * The credits do not fit in a tag: they go ahead as control messages
         * (credits only add up, so their order relative to the data does not
         * matter) and the data leaves with tag 0. Both or neither: refuse if
         * the control pool cannot take the whole split now.
         */
        if (s->nctrl + split_count(s, imm) > s->max_ctrl) return MR_AGAIN;
        st = ctrl_isend(s, dest, imm);
        if (st != MR_OK) return st;
        s->split_imm++;
        tag = 0;
    }
    if (kind == MR_KIND_ITEMS) tag |= s->kind_bit;
    return data_isend(s, dest, tag, data, length, cookie, NULL);
}

static mr_status_t mpi_send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    mr_status_t st = send_check(s, dest);

    if (st != MR_OK) return st;
    /*
     * After closing() every rank has finished sending data, so credits are
     * of no use to anybody. Dropping them keeps messages out of flight while
     * peers free their communicators: one arriving after that would wait in
     * MPI, and could be matched by a communicator of a later mr_init() that
     * reuses the freed one's context id.
     */
    if (s->base.closing) {
        s->dropped_ctrl++;
        return MR_OK;
    }
    if (s->nctrl + split_count(s, imm) > s->max_ctrl) return MR_AGAIN;
    if (imm > (uint32_t)s->tag_ub) s->split_imm++;
    return ctrl_isend(s, dest, imm);
}

/* The application released a staging buffer delivered by progress_data_recvs(). */
static void mpi_release_recv(mr_substrate_t *s, void *handle)
{
    unsigned buf = (unsigned)((uintptr_t)handle - 1);

    if (buf < s->nstage) s->stage_free[s->nstage_free++] = buf;
}

static int mpi_progress(mr_substrate_t *s, int timeout_ms)
{
    uint64_t deadline;
    unsigned rounds = 0;
    int events, n;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    if (s->broken) return MR_ERR_TRANSPORT;
    /* Batches leave now, and the next message to each rank leaves alone again. */
    mr__batcher_next_epoch(&s->batcher);
    events = s->batcher.nopen > 0 ? flush_batches(s) : 0;
    n = progress_once(s);
    if (n < 0) return n;
    events += n;
    if (events != 0 || timeout_ms == 0) return events;
    /*
     * MPI has no wait with a timeout that covers all of this, so poll; but
     * let other processes run between polls, since ranks may outnumber cores.
     */
    deadline = timeout_ms < 0 ? UINT64_MAX : mr__now_ns() + (uint64_t)timeout_ms * MR_NS_PER_MS;
    for (;;) {
        uint64_t now;
        if (rounds < MRMPI_SPIN_YIELDS) {
            sched_yield();
        } else {
            now = mr__now_ns();
            if (now >= deadline) return 0;
            nap(deadline - now < (uint64_t)MRMPI_NAP_NS ? (long)(deadline - now) : MRMPI_NAP_NS);
        }
        rounds++;
        s->ctrl_hot = true; /* Between naps, credits must not wait for an 8th pass. */
        events = progress_once(s);
        if (events != 0) return events;
        if (mr__now_ns() >= deadline) return 0;
    }
}

/*
 * Waits until `req` completes or `deadline` passes. Returns whether it
 * completed; if not, the request is left to MPI (MPI_Request_free).
 */
static bool wait_bounded(MPI_Request *req, uint64_t deadline)
{
    unsigned rounds = 0;

    while (*req != MPI_REQUEST_NULL) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag || rc != MPI_SUCCESS) {
            if (rc != MPI_SUCCESS && *req != MPI_REQUEST_NULL) MPI_Request_free(req);
            *req = MPI_REQUEST_NULL;
            return rc == MPI_SUCCESS;
        }
        if (mr__now_ns() >= deadline) {
            MPI_Request_free(req);
            *req = MPI_REQUEST_NULL;
            return false;
        }
        if (++rounds < MRMPI_SPIN_YIELDS) sched_yield();
        else nap(MRMPI_NAP_NS);
    }
    return true;
}

/*
 * Receives and throws away what is waiting unmatched on `comm`, each within
 * `deadline`. Sets *leak when a receive into the staging memory could not
 * complete (MPI may still write into it).
 */
static unsigned drain_unexpected(mr_substrate_t *s, MPI_Comm comm, uint64_t deadline,
                                 bool *leak)
{
    unsigned n = 0;

    while (!*leak && mr__now_ns() < deadline) {
        MPI_Message msg;
        MPI_Status st;
        MPI_Request req = MPI_REQUEST_NULL;
        int flag = 0, count = 0, rc;

        if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &msg, &st) != MPI_SUCCESS ||
            !flag) {
            break;
        }
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (count > 0 && s->staging != NULL && (size_t)count <= s->base.datagram_size) {
            rc = MPI_Imrecv(s->staging, count, MPI_BYTE, &msg, &req);
        } else {
            /* Zero bytes, or a longer message cut short: MPI reports truncation, fine here. */
            rc = MPI_Imrecv(&s->ctrl_dummy, 0, MPI_BYTE, &msg, &req);
        }
        if (rc != MPI_SUCCESS) break;
        /* A large message needs its (maybe dead) sender to finish: never wait unbounded. */
        if (!wait_bounded(&req, deadline) && count > 0) *leak = true;
        n++;
    }
    return n;
}

static void mpi_close(mr_substrate_t *s)
{
    uint64_t deadline;
    bool leak_staging = false, leak_batches = false;
    unsigned stuck = 0, dropped = 0;

    if (s == NULL) return;
    /* No upcalls here: slots and send buffers go away with the core's pools. */
    deadline = mr__now_ns() + MRMPI_CLOSE_WAIT_NS;
    if (s->recvs != NULL) {
        for (unsigned i = 0; i < s->nrecv; i++) {
            mpi_recv_t *e = &s->recvs[i];
            if (!e->posted) continue;
            MPI_Cancel(&s->recv_req[i]);
            if (!wait_bounded(&s->recv_req[i], deadline)) {
                stuck++;
                leak_staging = true; /* MPI may still write into it. */
            }
            e->posted = false;
        }
    }
    if (s->ctrl_posted) {
        for (unsigned i = 0; i < MRMPI_CTRL_RECVS; i++) {
            if (s->ctrl_recv[i] == MPI_REQUEST_NULL) continue;
            MPI_Cancel(&s->ctrl_recv[i]);
            if (!wait_bounded(&s->ctrl_recv[i], deadline)) stuck++;
        }
        s->ctrl_posted = false;
    }
    /* Sends still in flight: control sends have no buffer; data sends only after a failure. */
    for (size_t i = 0; i < s->nctrl; i++) {
        if (!wait_bounded(&s->ctrl_req[i], deadline)) stuck++;
    }
    s->nctrl = 0;
    for (size_t i = 0; i < s->nsend; i++) {
        if (wait_bounded(&s->send_req[i], deadline)) continue;
        stuck++;
        if (s->send_batch[i] != NULL) leak_batches = true; /* MPI may still read it. */
    }
    s->nsend = 0;
    /*
     * Messages nobody will receive: drop them now, so that a communicator
     * created later with the same context id cannot match them.
     */
    if (s->have_data_comm && !leak_staging) {
        dropped += drain_unexpected(s, s->data_comm, deadline, &leak_staging);
    }
    if (s->have_ctrl_comm) dropped += drain_unexpected(s, s->ctrl_comm, deadline, &leak_staging);
    if (stuck > 0) {
        MR__LOG(s, s->base.closing ? MR_LOG_WARN : MR_LOG_DEBUG,
                "MPI substrate: %u requests did not complete at close and were left to MPI.",
                stuck);
    }
    if (dropped > 0 || s->discarded > 0 || s->dropped_ctrl > 0 || s->split_imm > 0) {
        MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: %u unmatched messages dropped at close, %llu "
                "messages from failed ranks discarded, %llu credit returns not sent while "
                "closing, %llu immediates split into control messages.", dropped,
                (unsigned long long)s->discarded, (unsigned long long)s->dropped_ctrl,
                (unsigned long long)s->split_imm);
    }
    if (s->have_data_comm) MPI_Comm_free(&s->data_comm);
    if (s->have_ctrl_comm) MPI_Comm_free(&s->ctrl_comm);
    free(s->recvs);
    free(s->recv_req);
    free(s->stage_free);
    if (!leak_staging) free(s->staging);
    free(s->send_req);
    free(s->send_cookie);
    free(s->send_dest);
    free(s->send_mark);
    free(s->send_batch);
    if (!leak_batches) mr__batcher_fini(&s->batcher);
    free(s->ctrl_req);
    free(s->ctrl_dest);
    free(s->indices);
    free(s->statuses);
    free(s->done_cookie);
    free(s->done_batch);
    free(s->done_dest);
    free(s->done_err);
    free(s->peer);
    free(s->peer_why);
    free(s->peer_sent);
    free(s->peer_matched);
    free(s);
}

static void mpi_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    mr__substrate_stats(s, stats);
    mr__batcher_stats(&s->batcher, stats);
}

static const mr_substrate_ops_t mpi_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "mpi",
    .description = "MPI (MPICH) point-to-point: MPI_Isend/MPI_Irecv, credits in tags on a "
                   "control communicator",
    .config_table = mpi_config_table,
    .config_size = sizeof(mpi_config_t),
    .open = mpi_open,
    .get_address = mpi_get_address,
    .connect = mpi_connect,
    .send = mpi_send,
    .send_control = mpi_send_control,
    .progress = mpi_progress,
    .release_recv = mpi_release_recv,
    .format_address = mpi_format_address,
    .closing = mr__substrate_closing, /* Nothing to flush: the core waited for every data send. */
    .stats = mpi_stats,
    .close = mpi_close,
};

MR__SUBSTRATE_ENTRY(mpi_ops)
