/*
 * MailRail: asynchronous, fire-and-forget messaging with user-space,
 * receiver-driven credit flow control.
 *
 * The public API is this header and mailrail_items.h (aggregated small
 * items, built on the same datagrams). Every other header in the source tree
 * is internal and is not installed.
 *
 * The cycle of one message is:
 *
 *   1. mr_reserve() hands out a send buffer of MAILRAIL_DATAGRAM_SIZE bytes.
 *      MR_AGAIN means the send pool is exhausted: that is backpressure, not an
 *      error. Call mr_receive() (which is also the progress engine) and try
 *      again.
 *   2. The application fills the buffer and calls mr_send(). The call never
 *      blocks; the buffer goes back to the pool once the substrate is done.
 *   3. mr_receive() returns a pointer into MailRail's receive pool (zero copy),
 *      the length and the source rank.
 *   4. mr_release() gives the receive buffer back.
 *
 * Order. Messages from one rank to another are received in the order they
 * were sent (FIFO per destination, whatever flow control defers); messages
 * from different sources are received in the order they arrived, which no
 * rank controls.
 *
 * Buffers. A send buffer belongs to the application from mr_reserve() until
 * mr_send() returns MR_OK (then to MailRail: do not touch it) or until
 * mr_release(); on any error from mr_send() it is still the application's. A
 * received buffer is valid until mr_release(), and holds its credit and the
 * receive slot it arrived in until then (small messages that travelled
 * coalesced share one slot, which is free once all of them are released).
 * mr_finalize() takes back every buffer, reserved or received, that the
 * application still holds.
 *
 * Threads. MailRail is not thread-safe: call all its functions from one
 * thread per process, the same one from mr_init() to mr_finalize() (the UCX
 * worker is single-threaded). MailRail calls MPI from that thread in
 * mr_init(), mr_quiesce() and mr_finalize(), and in every progress call under
 * MAILRAIL_SUBSTRATE=mpi: when mr_init() starts MPI itself, that is all it
 * needs. When the application initializes MPI, MPI_THREAD_SINGLE or
 * MPI_THREAD_FUNNELED suffices if MailRail runs on the thread that called
 * MPI_Init; MailRail on another thread needs MPI_THREAD_SERIALIZED (mr_init()
 * refuses with MR_ERR_UNSUPPORTED below it), and other threads calling MPI
 * while MailRail does need MPI_THREAD_MULTIPLE.
 */
#ifndef MAILRAIL_H
#define MAILRAIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions libmailrail.so exports; everything else is hidden. */
#if defined(__GNUC__)
#define MR_API __attribute__((visibility("default")))
#else
#define MR_API
#endif

#define MR_VERSION_MAJOR 0
#define MR_VERSION_MINOR 1
#define MR_VERSION_PATCH 0

/*
 * Status codes. MR_OK is 0, MR_AGAIN is positive and means "nothing now, make
 * progress and try again"; every error is negative. mr_status_string() names
 * each of them.
 */
typedef enum mr_status {
    MR_OK = 0,
    MR_AGAIN = 1,
    MR_ERR_INVALID_PARAM = -1,
    MR_ERR_INVALID_RANK = -2,
    MR_ERR_MESSAGE_TOO_LONG = -3,
    MR_ERR_INVALID_BUFFER = -4,
    MR_ERR_BUFFER_STATE = -5,
    MR_ERR_NOT_INITIALIZED = -6,
    MR_ERR_ALREADY_INITIALIZED = -7,
    MR_ERR_CONFIG = -8,
    MR_ERR_NO_MEMORY = -9,
    MR_ERR_PLUGIN = -10,
    MR_ERR_BOOTSTRAP = -11,
    MR_ERR_TRANSPORT = -12,
    MR_ERR_PEER_FAILED = -13,
    MR_ERR_PROTOCOL = -14,
    MR_ERR_TIMEOUT = -15,
    MR_ERR_UNSUPPORTED = -16,
    MR_ERR_SYSTEM = -17,
    MR_ERR_LIMIT = -18,
    MR_ERR_IN_HANDLER = -19
} mr_status_t;

/*
 * Returns a constant, human-readable name and explanation of a status. Any
 * integer is accepted; unknown values give "unknown status".
 */
MR_API const char *mr_status_string(mr_status_t status);

/*
 * Initializes MailRail on every rank of MPI_COMM_WORLD. Collective.
 *
 * Reads every MAILRAIL_* setting from the environment (list them with
 * `mailrail_info -c`), loads the substrate plugin named by MAILRAIL_SUBSTRATE,
 * bootstraps through MPI (MPI_Init is called only if the application has not
 * called it; MailRail then also calls MPI_Finalize in mr_finalize), learns
 * rank, size and the node of every rank, and exchanges substrate addresses.
 *
 * Returns:
 *   MR_OK                       initialized.
 *   MR_ERR_ALREADY_INITIALIZED  mr_init() was already called without mr_finalize().
 *   MR_ERR_CONFIG               a MAILRAIL_* value is malformed or out of range
 *                               (the log names the variable, the value and what
 *                               is allowed), or a setting that must be the same
 *                               on every rank (substrate, flow control, datagram
 *                               size, ranks per node, receive slots and credits
 *                               under rank and node) differs between ranks: every
 *                               rank fails and names it with both values.
 *   MR_ERR_PLUGIN               the substrate plugin is unknown, missing or invalid
 *                               (the log lists the substrates that were found).
 *   MR_ERR_BOOTSTRAP            MPI could not be initialized or used.
 *   MR_ERR_NO_MEMORY            the pools could not be allocated.
 *   MR_ERR_SYSTEM               the operating system refused a resource, such as
 *                               the node policy's shared-memory segment (the log
 *                               names the call and why).
 *   MR_ERR_UNSUPPORTED          the substrate cannot run this way (the MPI
 *                               substrate without the MPI bootstrap).
 *   MR_ERR_TRANSPORT, MR_ERR_TIMEOUT, MR_ERR_PROTOCOL
 *                               the substrate could not connect the ranks.
 *   MR_ERR_PEER_FAILED          another rank failed to initialize (its log says why).
 * All ranks fail together: once the bootstrap is up, every step that can fail
 * on some ranks only is followed by an agreement. On failure nothing is left
 * allocated and MPI stays initialized, even when mr_init() started it, so
 * that mr_init() may be called again; MailRail then finalizes MPI in the
 * mr_finalize() of the session that succeeds. After MR_ERR_TIMEOUT or
 * MR_ERR_PEER_FAILED a rank is missing and MPI cannot be used again.
 *
 * Before the bootstrap is up (a malformed setting, a missing plugin) a rank
 * fails alone, while the others wait in MPI_Init or the first collective:
 * give every rank the same MAILRAIL_* environment (mpiexec does), and use
 * MPIEXEC_TIMEOUT or the batch system's limit to bound such a job.
 */
MR_API mr_status_t mr_init(void);

/*
 * Like mr_init(), for an application that already uses MPI: MailRail runs on
 * the ranks of the given communicator (it duplicates it and never touches the
 * original). `mpi_comm` points to an MPI_Comm; `mpi_comm_size` must be
 * sizeof(MPI_Comm). MPI must already be initialized. Typical use:
 *
 *     MPI_Comm comm = MPI_COMM_WORLD;
 *     mr_init_mpi(&comm, sizeof comm);
 *
 * Returns the same codes as mr_init(), and MR_ERR_INVALID_PARAM when the
 * pointer is NULL, the size is not that of an MPI_Comm, or the communicator
 * is MPI_COMM_NULL.
 */
MR_API mr_status_t mr_init_mpi(const void *mpi_comm, size_t mpi_comm_size);

/*
 * Collective. Sends what is still deferred or in flight, waits until every
 * rank has done the same, discards messages that arrived but were never
 * returned by mr_receive() (a warning gives their number), closes the
 * substrate and frees every pool. Buffers handed out earlier become invalid.
 * After it, every call but mr_init()/mr_init_mpi() returns
 * MR_ERR_NOT_INITIALIZED.
 *
 * Returns:
 *   MR_OK
 *   MR_ERR_NOT_INITIALIZED
 *   MR_ERR_PEER_FAILED   a peer died; MailRail's resources are still released,
 *                        but MPI, if MailRail initialized it, is not finalized
 *                        (MPI_Finalize would wait for the dead rank).
 *   MR_ERR_TIMEOUT       sends or other ranks did not finish within
 *                        MAILRAIL_TIMEOUT; resources are released as above.
 *   MR_ERR_BOOTSTRAP     an MPI call failed.
 */
MR_API mr_status_t mr_finalize(void);

/* This process's rank, or -1 before mr_init() / after mr_finalize(). */
MR_API int mr_rank(void);

/* The number of ranks, or -1 before mr_init() / after mr_finalize(). */
MR_API int mr_size(void);

/* The number of nodes (physical, or virtual with MAILRAIL_RANKS_PER_NODE), or -1. */
MR_API int mr_node_count(void);

/*
 * The node of `rank`, numbered from 0 to mr_node_count() - 1, or -1 when
 * `rank` is out of range or MailRail is not initialized.
 */
MR_API int mr_node_of(int rank);

/* The datagram size: the capacity of every send and receive buffer, or 0. */
MR_API size_t mr_datagram_size(void);

/*
 * Reserves a send buffer of mr_datagram_size() bytes.
 *
 * Returns:
 *   MR_OK                   *buffer is the reserved buffer.
 *   MR_AGAIN                backpressure: every send buffer is in use, or the
 *                           messages in flight hold MAILRAIL_SEND_BYTES. Call
 *                           mr_receive() and try again. Not an error.
 *   MR_ERR_INVALID_PARAM    `buffer` is NULL.
 *   MR_ERR_NOT_INITIALIZED  called before mr_init() or after mr_finalize().
 * *buffer is written only on MR_OK.
 */
MR_API mr_status_t mr_reserve(void **buffer);

/*
 * Sends the first `length` bytes of a reserved buffer to rank `dest`. Never
 * blocks: the message may be transmitted now or deferred until flow control
 * and the substrate allow it, in FIFO order per destination. Ownership of the
 * buffer passes to MailRail; do not touch it after MR_OK. Sending to oneself
 * is allowed.
 *
 * Returns:
 *   MR_OK                    the message is accepted and will be delivered once.
 *   MR_ERR_INVALID_RANK      `dest` is not in [0, mr_size()).
 *   MR_ERR_MESSAGE_TOO_LONG  `length` is larger than mr_datagram_size().
 *   MR_ERR_INVALID_BUFFER    `buffer` was not handed out by mr_reserve().
 *   MR_ERR_BUFFER_STATE      `buffer` is not currently reserved (already sent
 *                            or released).
 *   MR_ERR_PEER_FAILED       rank `dest` has failed.
 *   MR_ERR_NOT_INITIALIZED   called before mr_init() or after mr_finalize().
 * On any error the buffer stays reserved by the caller, untouched: send it
 * again with valid arguments, or give it back with mr_release().
 */
MR_API mr_status_t mr_send(void *buffer, size_t length, int dest);

/* One received message. `data` points into MailRail's receive pool. */
typedef struct mr_message {
    void *data;      /* Valid until mr_release(data). */
    size_t length;   /* Payload length in bytes, 0 to mr_datagram_size(). */
    int source;      /* Rank that sent it. */
} mr_message_t;

/*
 * Drives progress (substrate, deferred sends, credit returns) and returns the
 * oldest arrived message, if any. Non-blocking.
 *
 * Returns:
 *   MR_OK                   *message holds a message; release it with mr_release().
 *   MR_AGAIN                no message now.
 *   MR_ERR_PEER_FAILED      a peer failed: mr_failed_ranks() says which (and the
 *                           log). Returned once per failed peer; later calls go
 *                           on serving the others, and messages that arrived
 *                           before are still returned.
 *   MR_ERR_TRANSPORT        the substrate failed locally (the log says how).
 *   MR_ERR_INVALID_PARAM    `message` is NULL.
 *   MR_ERR_NOT_INITIALIZED  called before mr_init() or after mr_finalize().
 * *message is written only on MR_OK.
 */
MR_API mr_status_t mr_receive(mr_message_t *message);

/*
 * Makes progress like mr_receive(), but when nothing is ready, sleeps until
 * the substrate has news (a message or items, a credit return, a completed send) or
 * `timeout_ms` milliseconds have passed. For ranks that outnumber cores: a
 * rank with nothing to do gives its core to the others instead of spinning.
 * There, by default (MAILRAIL_WAIT_NAP), it first naps and polls for about
 * 1 ms, so that news may wait up to a nap (20 to 200 us) but a busy rank is
 * not woken once per message.
 * Returns at once when mr_reserve() last returned MR_AGAIN and a send buffer
 * is free now (an earlier call freed it). Under MAILRAIL_FLOWCTL=node, credits
 * that a neighbour on the same node puts in the shared pool wake it too. Takes
 * no message: call mr_receive() (or pull items) next.
 *
 * Returns:
 *   MR_OK                   something may be ready (a message is waiting, a
 *                           peer failure is to be reported by mr_receive(), or
 *                           progress was made).
 *   MR_AGAIN                the timeout passed with nothing to report (with
 *                           MAILRAIL_WAIT_NAP=never, also sooner when the
 *                           substrate could not sleep: UCX with work of its
 *                           own, or every receive slot held by the caller).
 *   MR_ERR_TRANSPORT        the substrate failed locally (the log says how).
 *   MR_ERR_INVALID_PARAM    `timeout_ms` is negative or above 60000.
 *   MR_ERR_NOT_INITIALIZED  called before mr_init() or after mr_finalize().
 */
MR_API mr_status_t mr_wait(int timeout_ms);

/*
 * Gives a buffer back to MailRail: a receive buffer returned by mr_receive(),
 * or a reserved send buffer that will not be sent.
 *
 * Returns:
 *   MR_OK                   released.
 *   MR_ERR_INVALID_BUFFER   `buffer` was never handed out by MailRail.
 *   MR_ERR_BUFFER_STATE     `buffer` is not held by the application (double
 *                           release, or a send buffer already sent).
 *   MR_ERR_NOT_INITIALIZED  called before mr_init() or after mr_finalize().
 */
MR_API mr_status_t mr_release(void *buffer);

/*
 * Active-message handlers: the model of UCX active messages, GASNet-EX and
 * YGM. Every rank registers the same handlers under the same ids (after
 * mr_init(), before any message is sent to them); mr_send_handler() sends a
 * message to a handler id at a rank, where its handler runs with it:
 *
 *     static mr_status_t on_visit(const mr_message_t *m, void *arg) { ... }
 *     mr_handler_register(VISIT, on_visit, &graph);
 *     mr_reserve(&buf); ... mr_send_handler(buf, len, owner, VISIT);
 *     do { mr_poll(); } while (mr_quiesce() == MR_AGAIN);
 *
 * Where handlers run: in progress, that is in mr_poll(), mr_receive(),
 * mr_wait(), mr_quiesce(), mr_connect() and mr_items_end_phase() and the
 * item pulls, in the order their messages arrived (FIFO per source, as for
 * mr_send()). Over UCX a handler runs inside UCX's own receive callback
 * when nothing is queued before its message, without a receive slot or a
 * copy.
 *
 * What a handler may do: read `message` (data, length, source), valid only
 * until it returns; send, with mr_reserve(), mr_send(), mr_send_handler(),
 * mr_send_handler_copy(), mr_release() of a reserved buffer and the item
 * pushes and flushes. Any other MailRail call made inside a handler fails
 * with MR_ERR_IN_HANDLER: a handler never waits.
 *
 * Backpressure inside a handler: a handler that cannot send now (mr_reserve()
 * or mr_send_handler_copy() returns MR_AGAIN) returns MR_AGAIN, having sent
 * nothing for that message yet (reserve first, or send one message per call);
 * it is called again with the same message by a later progress call, and the
 * messages from the same source behind it wait their turn (those from other
 * sources run meanwhile, the sources with messages waiting taking turns). While
 * they wait they are parked: copied out of their receive slots, whose credits
 * go back at once, so that ranks whose handlers send to each other cannot hold
 * the very credits they wait for (no deadlock, at the cost of a copy each, and
 * of the memory of the most messages parked at once; handler_parked in
 * mr_stats_t counts them). A handler must not assume it runs once per message
 * unless it returns MR_OK.
 *
 * Quiescence counts a handler's message as received when its handler returns
 * MR_OK, so that what a handler sends keeps the phase open. A message whose
 * handler is not registered at its destination is dropped there with an
 * error in the log (and counted as received and in handler_dropped).
 */

/* Handler ids are 0 to MR_HANDLERS_MAX - 1. */
#define MR_HANDLERS_MAX 256

/*
 * Called with each message sent to its id. Returns MR_OK when done with it,
 * or MR_AGAIN to be called again later with the same message (see above).
 * Any other status is logged and counts as done.
 */
typedef mr_status_t (*mr_handler_t)(const mr_message_t *message, void *arg);

/*
 * Registers `handler` (with `arg`, passed to every call) under `id`; a second
 * registration of an id replaces the first, NULL removes it. Local: every
 * rank registers the same ids. Returns MR_OK, MR_ERR_INVALID_PARAM (an id out
 * of range), MR_ERR_IN_HANDLER or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_handler_register(int id, mr_handler_t handler, void *arg);

/*
 * Sends the first `length` bytes of a buffer from mr_reserve() to handler
 * `id` at rank `dest`, like mr_send(): the buffer is MailRail's on MR_OK and
 * still the caller's on any error. `length` is at most mr_datagram_size() - 1
 * (the id travels in the last byte).
 *
 * Returns MR_OK, MR_ERR_INVALID_PARAM (`id` is not registered on this rank),
 * and the errors of mr_send().
 */
MR_API mr_status_t mr_send_handler(void *buffer, size_t length, int dest, int id);

/*
 * Sends a copy of the `length` bytes at `data` to handler `id` at rank
 * `dest`, without a buffer from mr_reserve(): `data` is the caller's again
 * when the call returns, as with UCX's ucp_am_send_nbx() or YGM's async().
 * A small message to a rank that was just sent to goes straight into the
 * batch being filled for it; otherwise the bytes are copied into a send
 * buffer, which then goes as with mr_send_handler(). `length` is at most
 * mr_datagram_size() - 1.
 *
 * Returns MR_OK, MR_AGAIN (no send buffer is free: nothing was sent; make
 * progress and call again, or return MR_AGAIN from a handler), and the
 * errors of mr_send_handler() (MR_ERR_INVALID_PARAM also for a NULL `data`
 * with a `length`).
 */
MR_API mr_status_t mr_send_handler_copy(const void *data, size_t length, int dest, int id);

/*
 * Drives progress and runs the handlers of the messages that arrived, without
 * taking a message for the application. Non-blocking.
 *
 * Returns MR_OK (something happened: a handler ran, a send completed, credits
 * came), MR_AGAIN (nothing), MR_ERR_PEER_FAILED (once per failed peer, as
 * mr_receive() would), MR_ERR_TRANSPORT, MR_ERR_IN_HANDLER or
 * MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_poll(void);

/*
 * Quiescence (termination detection). Collective and non-blocking: every rank
 * calls it repeatedly, receiving and handling messages in between, until it
 * returns MR_OK. MR_OK means that every message sent by any rank before the
 * quiescence started, and every message sent in reaction to those, has been
 * returned by mr_receive() at its destination. All ranks see MR_OK in the same
 * round. Typical use:
 *
 *     do {
 *         while (mr_receive(&m) == MR_OK) { handle(&m); mr_release(m.data); }
 *     } while (mr_quiesce() == MR_AGAIN);
 *
 * Messages sent after another rank's mr_quiesce() returned MR_OK belong to
 * the next phase; they may reach a rank still waiting in this one.
 *
 * Returns MR_OK, MR_AGAIN, MR_ERR_PEER_FAILED (a peer failed: quiescence can
 * never be reached), MR_ERR_TRANSPORT (also when the job received more
 * messages than it sent, and nothing moves: a substrate duplicated some, and
 * the counts can never meet; the log gives both sums), MR_ERR_BOOTSTRAP or
 * MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_quiesce(void);

/*
 * Connects this rank to the ranks in `dests` now, instead of when the first
 * message to each of them leaves. Collective: every rank calls it, each with
 * its own list (which may be empty: `dests` NULL and `count` 0), and it
 * returns MR_OK on every rank once every rank's listed connections are
 * established and usable both ways (over TCP the handshake with the job's
 * secret is done, over UCX the endpoint is wired up). A timed phase that
 * follows then measures its traffic, not the dialling: with a thousand ranks
 * dialling inside the phase costs a lot. Typical use, at start-up of a job
 * whose ranks talk to most others, or before a timed phase:
 *
 *     int *all = malloc(mr_size() * sizeof(int));
 *     for (int r = 0; r < mr_size(); r++) all[r] = r;
 *     mr_connect(all, mr_size());
 *
 * List only the ranks this rank will send to, or that it must hear from at
 * once: a connection costs what the first message would have made anyway
 * (over TCP one socket, a descriptor and about 17 KiB of buffers per peer,
 * at both ends; over UCX an endpoint, and a pidfd for a peer on this host),
 * and is kept until mr_finalize(). Under MAILRAIL_SUBSTRATE=mpi MailRail has
 * nothing to dial (MPI keeps its own connections): only the collective runs.
 * The list may name this rank (ignored) and a rank more than once.
 *
 * While it waits it makes progress like mr_quiesce(): other ranks' dials are
 * accepted, messages that arrive wait for mr_receive(), and handlers run
 * (register them first: a rank that returns sooner may send at once). It
 * waits at most MAILRAIL_TIMEOUT seconds. Like any collective, every rank
 * calls it in the same order relative to mr_quiesce(), and not while a
 * quiescence is under way (after an mr_quiesce() that returned MR_AGAIN).
 * Calling it again with connected ranks costs only the collective.
 *
 * Returns:
 *   MR_OK                   every rank's listed connections are established.
 *   MR_ERR_INVALID_PARAM    `count` is negative, `dests` is NULL with a
 *                           `count` above 0, or a quiescence is under way; or
 *                           another rank's arguments were invalid (its log
 *                           names the value).
 *   MR_ERR_INVALID_RANK     an entry of `dests` is not in [0, mr_size()) (the
 *                           log names the entry and its value).
 *   MR_ERR_PEER_FAILED      a listed rank has failed or could not be reached,
 *                           here or on another rank, or any rank has failed
 *                           (mr_failed_ranks() says which): the connections
 *                           that were made stay, the rest are made on first send.
 *   MR_ERR_TIMEOUT          not every rank had called it and connected within
 *                           MAILRAIL_TIMEOUT. The collective stays pending: the
 *                           next mr_connect(), mr_quiesce() or mr_finalize()
 *                           completes it first, once the late ranks arrive.
 *   MR_ERR_TRANSPORT, MR_ERR_NO_MEMORY, MR_ERR_BOOTSTRAP
 *                           the substrate, memory or MPI failed (the log says how).
 *   MR_ERR_IN_HANDLER       called inside an active-message handler.
 *   MR_ERR_NOT_INITIALIZED  called before mr_init() or after mr_finalize().
 * An error fails the call on every rank, so that none waits for another in
 * vain: the rank at fault returns its own status, the others
 * MR_ERR_INVALID_PARAM (bad arguments) or MR_ERR_PEER_FAILED (a connection
 * failed). The exceptions: MR_ERR_TIMEOUT (a late rank may still see MR_OK),
 * and the calls that return at once without joining the collective
 * (MR_ERR_NOT_INITIALIZED, MR_ERR_IN_HANDLER, a quiescence under way).
 */
MR_API mr_status_t mr_connect(const int *dests, int count);

/*
 * Counters of this rank since mr_init(). The struct only grows at the end;
 * `size` tells how much of it the library filled.
 */
typedef struct mr_stats {
    size_t size;                      /* Set by the caller: sizeof(mr_stats_t). */
    uint64_t messages_sent;           /* Accepted by mr_send(), or an aggregator's datagrams. */
    uint64_t bytes_sent;
    uint64_t messages_received;       /* Returned by mr_receive(), or an aggregator's
                                         datagrams whose items were all pulled. */
    uint64_t bytes_received;
    uint64_t reserve_failures;        /* mr_reserve() calls that returned MR_AGAIN. */
    uint64_t deferred_sends;          /* Sends that went through the deferred queue. */
    uint64_t peak_deferred_depth;     /* Most messages deferred at once. */
    uint64_t peak_recv_slots_in_use;  /* Most receive slots held at once. */
    uint64_t recv_slots_in_use;       /* Receive slots held now. */
    uint64_t credit_returns_sent;     /* Control messages sent by flow control: returns, and
                                         asks for credit (MAILRAIL_CREDIT_GROW). */
    uint64_t credit_returns_received;
    uint64_t piggybacked_credits;     /* Credits carried on data messages. */
    uint64_t zero_credit_ns;          /* Time sends waited for credit, summed over the
                                         destinations waited for at once. */
    uint64_t connections_rejected;    /* Peers dropped for a bad handshake or frame. */
    uint64_t items_pushed;            /* Accepted by mr_items_push() (mailrail_items.h). */
    uint64_t items_pulled;            /* Handed out by the mr_items_pull*() calls. */
    uint64_t messages_coalesced;      /* Sent packed with others into one transport message
                                         (MAILRAIL_COALESCE_BYTES). */
    uint64_t peers_connected;         /* Peers this rank holds a connection or an endpoint to
                                         now: those it talked to, and its two neighbours on
                                         the ring that watches for failures (0 under MPI,
                                         which keeps its own). */
    uint64_t init_collectives;        /* Collectives of the bootstrap (MPI) that mr_init() ran. */
    uint64_t init_bootstrap_bytes;    /* Bytes this rank contributed to them. */
    uint64_t deferred_now;            /* Sends deferred now, waiting for credit or for the
                                         substrate. */
    /*
     * Flow control's promise, checked from the wire's side (docs/reliability.md).
     * A message is in flight to this rank from the moment the substrate takes
     * it from the transport until the application releases it: in a receive
     * slot, or held by the substrate for want of one (UCX's arrival queue,
     * MPI's completed receives, TCP's read-ahead).
     */
    uint64_t recv_granted;            /* Most messages this rank lets be in flight to it: the
                                         credits of all its holders under rank and node; the
                                         receive slots under none, which promises nothing. */
    uint64_t recv_inflight;           /* Messages in flight to this rank now, each frame of a
                                         batch counted as one. */
    uint64_t peak_recv_inflight;      /* Most at once; above recv_granted only under none. */
    /* Breaches of the credit invariants: each must stay 0 (tests fail on any). */
    uint64_t breach_uncredited;       /* Messages that arrived beyond the credits this rank
                                         granted their sender (rank) or its node (node). */
    uint64_t breach_over_returned;    /* Credits returned to this rank beyond what it had
                                         outstanding with that receiver. */
    uint64_t breach_unacquired;       /* Deliveries into a receive slot the substrate had not
                                         acquired (or acquired twice). */
    uint64_t breach_beyond_grant;     /* Arrivals beyond recv_granted in flight (rank, node). */
    uint64_t handler_calls;           /* Handler calls that returned MR_OK (or an error). */
    uint64_t handler_retries;         /* Handler calls that returned MR_AGAIN. */
    uint64_t handler_now;             /* Messages handled in the transport's own callback,
                                         without a receive slot (UCX). */
    uint64_t handler_dropped;         /* Messages to a handler id not registered here. */
    uint64_t handler_parked;          /* Messages copied out of their receive slot while
                                         handlers waited to send (their credit went back). */
} mr_stats_t;

/*
 * Copies this rank's counters into *stats. Set stats->size to sizeof(*stats)
 * first.
 *
 * Returns MR_OK, MR_ERR_INVALID_PARAM (NULL or a size smaller than the first
 * version of the struct) or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_get_stats(mr_stats_t *stats);

/*
 * This rank's grants as a receiver: for each credit holder (each sending rank
 * under MAILRAIL_FLOWCTL=rank, indexed by rank; each sending node under node,
 * indexed by mr_node_of()), the credits it was granted whose messages have not
 * arrived yet. Writes min(count, holders) entries into `outstanding` and sets
 * *holders to the number of holders. Cheap enough to sample every few
 * milliseconds, to watch what a receiver lets its senders have in flight.
 *
 * Returns MR_OK, MR_ERR_UNSUPPORTED under none (it grants nothing),
 * MR_ERR_INVALID_PARAM (NULL, or a negative count) or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_get_credit_grants(uint32_t *outstanding, int count, int *holders);

/*
 * Lists the ranks this rank knows to have failed, in ascending order, whether
 * it learnt of a failure from its substrate or from the failure notices the
 * ranks pass around (docs/reliability.md). Writes the first `max` of them to
 * `ranks` (which may be NULL when `max` is 0) and sets *count to how many
 * have failed; mr_receive() returns MR_ERR_PEER_FAILED once for each.
 * Returns MR_OK, MR_ERR_INVALID_PARAM (NULL `count`, a negative `max`, or
 * NULL `ranks` with `max` > 0) or MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_failed_ranks(int *ranks, int max, int *count);

/*
 * Writes a printable form of rank `rank`'s substrate address (for example
 * "tcp 127.0.0.1:40321") into buf, NUL-terminated and truncated to `len`.
 * Returns MR_OK, MR_ERR_INVALID_RANK, MR_ERR_INVALID_PARAM or
 * MR_ERR_NOT_INITIALIZED.
 */
MR_API mr_status_t mr_peer_address(int rank, char *buf, size_t len);

/* The name of the loaded substrate ("tcp", ...), or NULL when not initialized. */
MR_API const char *mr_substrate_name(void);

/* The name of the flow-control policy ("none", ...), or NULL when not initialized. */
MR_API const char *mr_flowctl_name(void);

/*
 * Checks `value` for the setting `name` ("MAILRAIL_FLOWCTL", ...) of the core
 * or of flow control, as mr_init() would read it from the environment, without
 * initializing: a tool can refuse a bad option before it starts. May be called
 * at any time. Substrate settings are checked by mr_init() only.
 *
 * Returns MR_OK when mr_init() would accept it, MR_ERR_CONFIG when not (the
 * log says what is allowed), and MR_ERR_INVALID_PARAM for NULL or a name that
 * is not such a setting.
 */
MR_API mr_status_t mr_check_setting(const char *name, const char *value);

#ifdef __cplusplus
}
#endif

#endif /* MAILRAIL_H */
