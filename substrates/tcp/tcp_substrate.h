/*
 * The TCP substrate: one authenticated TCP connection per pair of ranks that
 * talk, made when the first message or credit between them leaves (either
 * rank dials; when both do at once, the lower rank's connection is kept),
 * non-blocking sockets driven by one epoll instance. The protocol (address,
 * handshake, frames) and how failures are reported are described in
 * docs/substrate-tcp.md; tcp_wire.c
 * reads and writes every byte of it.
 *
 * This header is what the plugin's files share: the constants, the settings,
 * the state, and the functions that cross files (named tcp__*). Internal to
 * the plugin, whose only exported symbol is mr_substrate_get_ops() (tcp_ops.c).
 * The files, one job each:
 *
 *   tcp_settings.c   the settings table (MAILRAIL_TCP_*).
 *   tcp_open.c       open(): the address, the descriptor limit, the allocation,
 *                    epoll and the listener; get_address(), format_address().
 *   tcp_connect.c    connect() (the address table), watch() and preconnect().
 *   tcp_connector.c  outgoing connections: dialling on first use, at most
 *                    TCP_MAX_DIALS handshakes at once, one attempt, the
 *                    connector's side of the handshake (nonce in, AUTH out,
 *                    ACCEPT in), the back-off, and the deadline.
 *   tcp_accept.c     incoming connections: the listener, the acceptor's side of
 *                    the handshake (nonce out, AUTH checked, ACCEPT out), who
 *                    wins when both ranks dial, dropped strangers, and an
 *                    authenticated connection becoming established.
 *   tcp_epoll.c      the epoll set: each descriptor's events, the dispatch of
 *                    what epoll reports; tcp__sin_str() for log lines.
 *   tcp_output.c     send requests and the writing of frames.
 *   tcp_input.c      the reading of frames and their delivery; the retry list.
 *   tcp_failure.c    failed connections: closed, queued, reported by progress().
 *   tcp_liveness.c   a peer silent for MAILRAIL_TIMEOUT ends its connection.
 *   tcp_ops.c        send(), send_control(), progress(), close(), the ops table.
 *   tcp_wire.c       the bytes of the protocol (tcp_wire.h), a library of its own.
 */
#ifndef MR_TCP_SUBSTRATE_H
#define MR_TCP_SUBSTRATE_H

#include "mr_failq.h"
#include "mr_substrate_base.h"
#include "tcp_wire.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>

/* ------------------------------------------------------------------------ */
/* Constants of the wire format and of the implementation.                  */

#define TCP_NONCE_LEN TCP_WIRE_NONCE_LEN
#define TCP_AUTH_LEN TCP_WIRE_AUTH_LEN
#define TCP_HDR_LEN TCP_WIRE_HDR_LEN

#define TCP_CTRL_RING 64          /* Control frames queued per connection. */
#define TCP_RXBUF_LEN (16 * 1024) /* Read-ahead buffer per connection. */
#define TCP_RX_BUDGET 64          /* Frames read per connection per progress call. */
#define TCP_MAX_IOV 64            /* iovecs gathered per sendmsg. */
#define TCP_MAX_PENDING 64        /* Incoming connections authenticating at once (more wait
                                     in the listen backlog). */
#define TCP_MAX_DIALS 64          /* Outgoing connections handshaking at once (more queue). */
#define TCP_SPARE_FDS 64          /* Descriptors left for the application and MPI. */
#define TCP_MAX_EVENTS 64         /* epoll events per wait. */
#define TCP_ACCEPT_BURST 64       /* accept() calls per listener event. */
#define TCP_RETRY_MS 100          /* Base back-off between connection attempts. */
#define TCP_REFUSALS_FAILED 3     /* Refused attempts in a row that make a peer failed. */
#define TCP_LISTEN_PAUSE_MS 100   /* Listener rest after running out of descriptors. */
#define TCP_DROP_LOG_BURST 10     /* Dropped-connection warnings per second. */

/* epoll tags: type in bits 56-63, generation in bits 32-55, index in bits 0-31. */
enum { TAG_LISTEN = 1, TAG_PEER = 2, TAG_PENDING = 3, TAG_WAKE = 4 };
#define TAG(type, gen, idx)                                                              \
    (((uint64_t)(type) << 56) | ((uint64_t)((gen) & 0xffffffu) << 32) | (uint64_t)(uint32_t)(idx))

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

typedef struct tcp_config {
    char addr[MR_CONFIG_STRING_MAX];
    uint64_t port;
    uint64_t auth_timeout_s;
} tcp_config_t;

/* The settings, described to the core by tcp_settings.c. */
extern const mr_config_entry_t tcp__config_table[];

/* ------------------------------------------------------------------------ */
/* State.                                                                    */

_Static_assert(TCP_WIRE_ADDR_LEN <= MR_SUBSTRATE_ADDR_MAX, "address too long");

/* One data send: a frame header and a payload owned by the core. */
typedef struct tcp_req {
    mr__sreq_t link;           /* Free list, done queue, and send()'s cookie. */
    struct tcp_req *sq_next;   /* The connection's send queue. */
    const void *data;
    size_t length;
    uint8_t hdr[TCP_HDR_LEN];
} tcp_req_t;

typedef enum tcp_conn_state {
    C_NONE,        /* Never talked to: no socket, no buffers. */
    C_QUEUED,      /* Connector: waiting for one of the TCP_MAX_DIALS handshake places. */
    C_RETRY,       /* Connector: waiting to start another attempt. */
    C_CONNECTING,  /* Connector: TCP connect in progress (holds a place, as do the next). */
    C_NONCE,       /* Connector: reading the acceptor's nonce. */
    C_AUTH,        /* Connector: writing its AUTH message. */
    C_ACCEPT,      /* Connector: reading the acceptor's ACCEPT message. */
    C_ESTABLISHED, /* Authenticated: frames flow. */
    C_FAILED,      /* Closed after a failure; never reopened. */
    C_CLOSED       /* Closed by the peer after closing(); never reopened. */
} tcp_conn_state_t;

typedef enum tcp_rx_phase {
    RX_HEADER,  /* Assembling a frame header. */
    RX_SLOT,    /* Header parsed; a receive slot is needed. */
    RX_PAYLOAD  /* Copying the payload into rx_slot. */
} tcp_rx_phase_t;

/* The connection to one peer rank. */
typedef struct tcp_conn {
    int fd;
    int rank;
    uint32_t gen;              /* Bumped for every new descriptor; part of the epoll tag. */
    tcp_conn_state_t state;
    bool registered;           /* In the epoll set. */
    uint32_t interest;         /* Its events there. */
    struct sockaddr_in addr;   /* What the peer advertised. */

    /*
     * Handshake: the connector reads the nonce, writes AUTH and reads ACCEPT
     * here; the acceptor writes its ACCEPT from here before any frame
     * (hs_out bytes, hs_off of them written).
     */
    uint8_t hs[TCP_AUTH_LEN > TCP_WIRE_ACCEPT_LEN ? TCP_AUTH_LEN : TCP_WIRE_ACCEPT_LEN];
    uint8_t nonce[TCP_NONCE_LEN]; /* Connector: the challenge its ACCEPT must answer. */
    size_t hs_off, hs_out;
    uint64_t retry_at;
    uint64_t dial_deadline;    /* Connector: when the peer counts as unreachable. */
    unsigned attempts;
    unsigned refusals;         /* Connector: attempts refused in a row (no listener there). */
    int last_err;              /* errno of the last failed attempt, for the timeout log. */
    bool on_dial_list;
    struct tcp_conn *dial_next;
    bool host_silent;          /* Its host answered nothing for MAILRAIL_TIMEOUT (tcp_liveness.c). */

    /* Output: data requests in FIFO order, and a ring of control frames. */
    tcp_req_t *sq_head, *sq_tail;
    size_t sq_off;             /* Bytes of sq_head already written (header included). */
    uint8_t *ctrl;             /* TCP_CTRL_RING frames of TCP_HDR_LEN bytes (tcp__conn_buffers). */
    unsigned ctrl_head, ctrl_count;
    size_t ctrl_off;           /* Bytes of the head control frame already written. */

    /* Input. */
    uint8_t *rxbuf;            /* TCP_RXBUF_LEN bytes; [rx_start, rx_end) unparsed. */
    size_t rx_start, rx_end;
    tcp_rx_phase_t rx_phase;
    tcp_wire_frame_t rx_frame; /* The data frame being received (RX_SLOT, RX_PAYLOAD). */
    void *rx_slot;
    bool rx_paused;            /* Waiting for a receive slot; EPOLLIN is off. */
    bool on_rx_list;
    struct tcp_conn *rx_next;
} tcp_conn_t;

/* An accepted connection that has not authenticated yet. */
typedef struct tcp_pending {
    int fd;                    /* -1: free. */
    uint32_t gen;
    bool registered;
    uint32_t interest;
    struct sockaddr_in peer;
    uint8_t nonce[TCP_NONCE_LEN];
    size_t nonce_sent;
    uint8_t auth[TCP_AUTH_LEN];
    size_t auth_got;
    uint64_t deadline;
} tcp_pending_t;

struct mr_substrate {
    mr__substrate_base_t base; /* base.rejected: strangers dropped, peers cut for bad frames. */
    uint8_t key[TCP_WIRE_KEY_LEN];
    tcp_config_t cfg;
    uint64_t auth_timeout_ns;

    int epfd, lfd;
    struct sockaddr_in laddr;
    bool listen_registered;
    uint64_t listen_resume_at;  /* Nonzero: the listener rests until then. */

    bool connect_started, connected;
    bool listen_full;           /* The listener rests while TCP_MAX_PENDING authenticate. */
    int nestablished;           /* Connections established now (peers_connected). */

    tcp_conn_t *conns;          /* size entries, indexed by rank. */
    /* Connections being dialled (C_QUEUED to C_ACCEPT), oldest first, and their timers. */
    tcp_conn_t *dial_head, *dial_tail;
    unsigned ndials;            /* Handshakes under way (C_CONNECTING to C_ACCEPT). */
    uint64_t dial_check_at;     /* When the list needs a look: a retry or deadline is due. */
    uint64_t silence_check_at;  /* When the established connections' silence is checked next. */
    tcp_req_t *reqs;
    mr__sreq_t *free_reqs;
    mr__done_queue_t done;
    tcp_conn_t *rx_head, *rx_tail;
    mr__failq_t failq;          /* Failures found, reported by the next progress call. */
    tcp_pending_t pending[TCP_MAX_PENDING];
    unsigned npending;

    uint64_t drop_log_window;   /* Start of the current second of drop warnings. */
    unsigned drop_log_count;
    uint64_t drop_log_suppressed;
};
MR__BASE_CHECK();

/* ------------------------------------------------------------------------ */
/* Small helpers.                                                           */

static inline bool conn_has_output(const tcp_conn_t *c)
{
    return c->sq_head != NULL || c->ctrl_count > 0 || c->hs_off < c->hs_out;
}

/* Whether the connector holds one of the TCP_MAX_DIALS handshake places. */
static inline bool conn_handshaking(const tcp_conn_t *c)
{
    return c->state >= C_CONNECTING && c->state <= C_ACCEPT;
}

/* Whether this rank is dialling the peer (queued, backing off or handshaking). */
static inline bool conn_dialing(const tcp_conn_t *c)
{
    return c->state >= C_QUEUED && c->state <= C_ACCEPT;
}

/* ------------------------------------------------------------------------ */
/* Functions that cross files, by the file that holds them.                 */

/* tcp_epoll.c: the epoll set, and addresses for the log. */

/* "a.b.c.d:port" into buf (at least 24 bytes). */
const char *tcp__sin_str(const struct sockaddr_in *sin, char *buf, size_t len);
/* Sets the events a descriptor is watched for (0: none, out of the set); 0 or -errno. */
int tcp__set_interest(mr_substrate_t *s, int fd, uint64_t tag, bool *registered,
                      uint32_t *interest, uint32_t want);
/* The same for a connection's descriptor, under its TAG_PEER tag. */
int tcp__conn_set_interest(mr_substrate_t *s, tcp_conn_t *c, uint32_t want);
/* Brings an established connection's epoll interest in line with its state. */
void tcp__conn_update_interest(mr_substrate_t *s, tcp_conn_t *c);
/* Takes a descriptor out of the epoll set and closes it; *fd becomes -1. */
void tcp__close_fd(mr_substrate_t *s, int *fd, bool *registered);
/* Hands an epoll event to its owner; returns the frames delivered. */
int tcp__dispatch(mr_substrate_t *s, const struct epoll_event *e);

/* tcp_output.c: send requests and the writing of frames. */

/* A request from the pool, or NULL when every one is in use. */
tcp_req_t *tcp__req_alloc(mr_substrate_t *s);
void tcp__req_free(mr_substrate_t *s, tcp_req_t *r);
/* Writes as much pending output as the socket takes; fails the connection on an error. */
void tcp__conn_flush(mr_substrate_t *s, tcp_conn_t *c);

/* tcp_input.c: the reading of frames. */

/* Handles an epoll event of an established connection; returns the frames delivered. */
int tcp__conn_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev);
/* Reads again from the connections on the retry list; returns the frames delivered. */
int tcp__retry_rx(mr_substrate_t *s);
/* Whether a connection on the retry list can make progress without a new slot. */
bool tcp__rx_list_busy(const mr_substrate_t *s);
/* Data messages read from the sockets that wait for a receive slot (the held() op). */
uint64_t tcp__held(mr_substrate_t *s);

/* tcp_failure.c: failed connections. */

/*
 * Closes a connection, established or being dialled (giving back its
 * handshake place), and queues the failure for progress(). Idempotent.
 */
void tcp__conn_fail(mr_substrate_t *s, tcp_conn_t *c, mr_status_t why);
void tcp__abandon(mr_substrate_t *s, int rank);
/*
 * Logs a socket error (err 0: the end of the stream) while `what`, and fails
 * the connection; while every rank finalizes, a close between frames with
 * nothing owed is no failure.
 */
void tcp__conn_fail_errno(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what);
/* Reports queued failures and completes their sends; returns the upcalls made. */
int tcp__drain_failed(mr_substrate_t *s);

/* tcp_liveness.c: a host silent for MAILRAIL_TIMEOUT has failed, with all its ranks. */

/* Keepalive and TCP_USER_TIMEOUT on a new connection (none without MAILRAIL_TIMEOUT). */
void tcp__conn_bound_silence(mr_substrate_t *s, tcp_conn_t *c);
/*
 * Fails the established connections whose peer sent nothing, not even an
 * acknowledgement, for MAILRAIL_TIMEOUT; once a second. Returns when to look next.
 */
uint64_t tcp__silence_check(mr_substrate_t *s, uint64_t now);
/*
 * After c's connection timed out: if its host was silent (not a peer that only
 * took nothing), the other ranks of that address that are being dialled, or
 * will be, fail at once instead of each after MAILRAIL_TIMEOUT of its own.
 */
void tcp__conn_timed_out(mr_substrate_t *s, tcp_conn_t *c);

/* tcp_accept.c: the listener and incoming connections. */

/* An authenticated connection, accepted or made, starts carrying frames. */
void tcp__conn_established(mr_substrate_t *s, tcp_conn_t *c);
/* Accepts new connections and sends each its challenge. */
void tcp__listener_event(mr_substrate_t *s);
/* Watches the listener again once its rest after running out of descriptors is over. */
void tcp__listener_maybe_resume(mr_substrate_t *s, uint64_t now);
/* Moves an incoming connection's handshake along: its nonce out, its AUTH in. */
void tcp__pending_event(mr_substrate_t *s, tcp_pending_t *p, uint32_t ev);
/* Drops strangers whose time to authenticate is up; returns the next deadline. */
uint64_t tcp__pending_expire(mr_substrate_t *s, uint64_t now);

/* tcp_connector.c: outgoing connections. */

/*
 * Gives a connection its receive buffer and control ring, once (they are
 * freed with the substrate). MR_ERR_NO_MEMORY when they cannot be had.
 */
mr_status_t tcp__conn_buffers(mr_substrate_t *s, tcp_conn_t *c);
/* Starts dialling a peer never talked to (C_NONE); other states are left alone. */
mr_status_t tcp__conn_dial(mr_substrate_t *s, tcp_conn_t *c);
/* A handshake place is free again (tcp__conn_fail() calls it for a dial that held one). */
void tcp__dial_place_free(mr_substrate_t *s);
/* The connector gives up its own attempt (the peer's connection wins); frees its place. */
void tcp__connector_abandon(mr_substrate_t *s, tcp_conn_t *c);
/* Moves an attempt and the connector's handshake along. */
void tcp__connector_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev);
/*
 * Starts queued attempts and retries that are due, fails peers not reached
 * by their deadline; returns when it needs to run again (UINT64_MAX: never).
 */
uint64_t tcp__dials_run(mr_substrate_t *s, uint64_t now);

/* The operations of the ops table (tcp_ops.c) that live in files of their own. */

/* tcp_open.c */
mr_status_t tcp__open(const mr_substrate_params_t *p, mr_substrate_t **out);
mr_status_t tcp__get_address(mr_substrate_t *s, void *addr, size_t *length);
void tcp__format_address(const void *addr, size_t length, char *buf, size_t len);
/* tcp_connect.c */
mr_status_t tcp__connect(mr_substrate_t *s, const void *addrs, size_t addr_len);
mr_status_t tcp__watch(mr_substrate_t *s, int rank);
mr_status_t tcp__preconnect(mr_substrate_t *s, int rank);
/* tcp_ops.c; tcp__open() calls it to undo a failed open. */
void tcp__close(mr_substrate_t *s);

#endif /* MR_TCP_SUBSTRATE_H */
