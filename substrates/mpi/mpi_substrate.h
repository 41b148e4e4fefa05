/*
 * The MPI substrate: MailRail over MPICH point-to-point messages, with
 * credits in tags on a control communicator. Its send window, the splitting
 * of large immediates, the receive ring and its arrival order, the zero-copy
 * staging buffers, failures and teardown are described in
 * docs/substrate-mpi.md.
 *
 * This header is internal to the plugin. Its files, one job each:
 *   mpi_substrate.h  constants, the settings and state types, helpers the files share
 *   mpi_ctrl_tag.h   how an immediate travels in control tags (pure, unit-tested)
 *   mpi_settings.c   the settings table (MAILRAIL_MAX_RECVS, MAILRAIL_MPI_SEND_WINDOW)
 *   mpi_errors.c     MPI error text, local failures, peers marked failed by send/receive errors
 *   mpi_open.c       open() and its steps, the address blob, connect()
 *   mpi_send.c       send() and send_control(): the send window, split immediates, batches
 *   mpi_recv.c       posting data receives into staging buffers, release_recv()
 *   mpi_progress.c   progress(): testing sends and receives together, delivering, failure upcalls
 *   mpi_ctrl.c       control receives: probed for (MPI_Improbe), never posted
 *   mpi_close.c      the bounded close()
 *   mpi_ops.c        the operations table, stats(), preconnect() (nothing to dial)
 * A function one file gives another is named mpi__*; the plugin is built
 * with hidden visibility and exports only mr_substrate_get_ops().
 */
#ifndef MR_MPI_SUBSTRATE_H
#define MR_MPI_SUBSTRATE_H

#include "mpi_ctrl_tag.h"
#include "mr_batch.h"
#include "mr_failq.h"
#include "mr_substrate_base.h"

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Constants.                                                                */

#define MRMPI_ADDR_MAGIC 0x4d524d50u /* "MRMP" as a number, host byte order. */
#define MRMPI_ADDR_VERSION 1
#define MRMPI_ADDR_HOST_LEN 64

#define MRMPI_CTRL_BURST 64          /* Control messages received by one progress pass at most. */
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
/* Control sends in the first MPI_Testsome of a progress call, while data sends wait too. */
#define MRMPI_JOINT_CTRL 2u
/* progress() tests one batch of sends beyond the oldest on every this many calls. */
#define MRMPI_SEND_SWEEP 8u
/* Coalescing (mr_batch.h): batches being filled or in flight, and their size at most. */
#define MRMPI_BATCHES 32u
#define MRMPI_BATCH_BYTES 8192u

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

typedef struct mpi_config {
    uint64_t max_recvs;
    uint64_t send_window;
} mpi_config_t;

/* The settings table (mpi_settings.c). */
extern const mr_config_entry_t mpi__config_table[];

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
    uint32_t frames_left;      /* A batch: its frames not yet delivered, once held() counted
                                  them (MPI_FRAMES_UNCOUNTED: not yet). */
} mpi_recv_t;

#define MPI_FRAMES_UNCOUNTED UINT32_MAX

/* A failure found outside progress(), reported by the next progress call. */
enum { PEER_OK = 0, PEER_FAIL_PENDING = 1, PEER_FAILED = 2 };

struct mr_substrate {
    mr__substrate_base_t base; /* base.rejected: ranks failed for a protocol error. */
    int wake_fd;               /* Flow control's wake-up descriptor, or -1. */
    mpi_config_t cfg;

    MPI_Comm data_comm, ctrl_comm;
    bool have_data_comm, have_ctrl_comm;
    int tag_ub;                /* MPI_TAG_UB of the data and control communicators. */
    uint32_t kind_bit;         /* Data tags: this bit set for MR_KIND_ITEMS, */
    uint32_t handler_bit;      /* this one for MR_KIND_HANDLER (mpi_open.c), */
    uint32_t data_imm_ub;      /* and the immediate in the bits below it, */
    uint32_t data_imm_max;     /* at most this, since */
    uint32_t batch_tag;        /* every bit set marks a batch of frames (mr_batch.h). */
    /*
     * Control tags: an immediate of more than ctrl_bits travels in several
     * control messages (mpi_ctrl_tag.h); the receiver puts them together per
     * source (ctrl_acc), in the order MPI keeps between two ranks.
     */
    unsigned ctrl_bits;        /* mpi_ctrl_tag.h */
    uint32_t *ctrl_acc;        /* Per source: the bits of a split immediate so far. */
    size_t coalesce_bytes;     /* MAILRAIL_COALESCE_BYTES. */
    mr__batcher_t batcher;
    bool connected;
    bool broken;               /* A local MPI failure: progress() only returns an error. */
    bool ctrl_hot;             /* Probe for control messages on the next pass (progress_once). */
    uint32_t ctrl_polls;       /* progress_once() calls, to probe for control messages on some. */

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
    unsigned nheld;              /* Entries completed and not delivered: waiting for a slot
                                    (a batch counts once, however many frames it has left). */
    uint8_t *staging;            /* nstage buffers of datagram_size bytes. */
    unsigned nstage;
    unsigned *stage_free;        /* Stack of free staging buffers. */
    unsigned nstage_free;

    /* Control messages: zero bytes, any source, any tag, probed for (progress_ctrl_recvs). */
    bool ctrl_probing;
    bool data_posted;          /* The ring is posted (not in a job of one rank). */
    char ctrl_dummy;

    /*
     * Data sends in flight, in send order in [send_first, nsend), send_live
     * of them active (completed ones are MPI_REQUEST_NULL holes until
     * mpi__sends_compact()): request, cookie, destination.
     */
    size_t send_first;
    size_t nsend;
    size_t send_live;
    MPI_Request *send_req;
    void **send_cookie;
    int *send_dest;
    uint64_t *send_mark;       /* For an MPI_Issend marker, peer_sent after it; else 0. */
    size_t send_sweep;         /* Where progress_sends() tests beyond the oldest next. */
    uint32_t send_polls;       /* progress_sends() calls, to test beyond the oldest on some. */
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
    mr__failq_t failq;         /* PEER_FAIL_PENDING ranks, reported by progress(). */

    uint64_t discarded;        /* Messages from failed ranks, thrown away. */
    uint64_t split_imm;        /* Immediates sent in more than one control message. */
    uint64_t dropped_ctrl;     /* Control messages not sent because closing() was called. */
};
MR__BASE_CHECK();

/* ------------------------------------------------------------------------ */
/* Helpers.                                                                  */

static inline void nap(long ns)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
    nanosleep(&ts, NULL);
}

static inline bool peer_usable(const mr_substrate_t *s, int rank)
{
    return s->peer[rank] == PEER_OK;
}

/* Ring entry `k` places after `from` (both below nrecv, k at most nrecv): no division. */
static inline unsigned ring_at(const mr_substrate_t *s, unsigned from, unsigned k)
{
    unsigned i = from + k;
    return i >= s->nrecv ? i - s->nrecv : i;
}

/* Control messages needed to carry `imm` (mpi_ctrl_tag.h). */
static inline size_t split_count(const mr_substrate_t *s, uint32_t imm)
{
    return mpi__ctrl_tag_parts(s->ctrl_bits, imm);
}

/* Frees a batch that was sent or given up (its messages were done when packed): one event. */
static inline int batch_complete(mr_substrate_t *s, mr__batch_t *b)
{
    mr__batcher_release(&s->batcher, b);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Functions one file gives another.                                         */

/* mpi_errors.c */
mr_status_t mpi__fatal(mr_substrate_t *s, int rc, const char *what);
void mpi__peer_mark_failed(mr_substrate_t *s, int rank, mr_status_t why);
void mpi__peer_mpi_error(mr_substrate_t *s, int rank, int rc, const char *what);
mr_status_t mpi__recv_error(mr_substrate_t *s, const MPI_Status *st, int rc, bool control);

/* mpi_open.c */
mr_status_t mpi__open(const mr_substrate_params_t *p, mr_substrate_t **out);
mr_status_t mpi__get_address(mr_substrate_t *s, void *addr, size_t *length);
void mpi__format_address(const void *addr, size_t length, char *buf, size_t len);
mr_status_t mpi__connect(mr_substrate_t *s, const void *addrs, size_t addr_len);

/* mpi_send.c */
mr_status_t mpi__send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                      const void *data, size_t length, void *cookie);
mr_status_t mpi__send_control(mr_substrate_t *s, int dest, uint32_t imm);
int mpi__flush_batches(mr_substrate_t *s);
void mpi__sends_compact(mr_substrate_t *s);

/* mpi_recv.c */
mr_status_t mpi__data_post_all(mr_substrate_t *s);
void mpi__release_recv(mr_substrate_t *s, void *handle);

/* mpi_ctrl.c: receives the control messages waiting in MPI; returns the upcalls run. */
int mpi__progress_ctrl_recvs(mr_substrate_t *s);

/* mpi_progress.c */
int mpi__progress(mr_substrate_t *s, int timeout_ms);
mr_status_t mpi__wake_fd(mr_substrate_t *s, int fd);

/* mpi_close.c */
void mpi__close(mr_substrate_t *s);

#endif /* MR_MPI_SUBSTRATE_H */
