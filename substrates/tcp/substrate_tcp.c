/*
 * The TCP substrate: one authenticated TCP connection per pair of ranks,
 * non-blocking sockets driven by one epoll instance. The protocol (address,
 * handshake, frames) and how failures are reported are described in
 * docs/architecture.md, "The TCP substrate" (#the-tcp-substrate); tcp_wire.c
 * reads and writes every byte of it.
 */
#include "mr_random.h"
#include "mr_substrate_base.h"
#include "tcp_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Constants of the wire format and of the implementation.                  */

#define TCP_NONCE_LEN TCP_WIRE_NONCE_LEN
#define TCP_AUTH_LEN TCP_WIRE_AUTH_LEN
#define TCP_HDR_LEN TCP_WIRE_HDR_LEN

#define TCP_CTRL_RING 64          /* Control frames queued per connection. */
#define TCP_RXBUF_LEN (16 * 1024) /* Read-ahead buffer per connection. */
#define TCP_RX_BUDGET 64          /* Frames read per connection per progress call. */
#define TCP_MAX_IOV 64            /* iovecs gathered per sendmsg. */
#define TCP_MAX_PENDING 64        /* Incoming connections authenticating at once. */
#define TCP_SPARE_FDS 64          /* Descriptors left for the application and MPI. */
#define TCP_MAX_EVENTS 64         /* epoll events per wait. */
#define TCP_ACCEPT_BURST 64       /* accept() calls per listener event. */
#define TCP_CONNECT_POLL_MS 50    /* epoll wait per round of the connect() loop. */
#define TCP_RETRY_MS 100          /* Base back-off between connection attempts. */
#define TCP_LISTEN_PAUSE_MS 100   /* Listener rest after running out of descriptors. */
#define TCP_DROP_LOG_BURST 10     /* Dropped-connection warnings per second. */

/* epoll tags: type in bits 56-63, generation in bits 32-55, index in bits 0-31. */
enum { TAG_LISTEN = 1, TAG_PEER = 2, TAG_PENDING = 3 };
#define TAG(type, gen, idx)                                                              \
    (((uint64_t)(type) << 56) | ((uint64_t)((gen) & 0xffffffu) << 32) | (uint64_t)(uint32_t)(idx))

/* ------------------------------------------------------------------------ */
/* Settings.                                                                 */

typedef struct tcp_config {
    char addr[MR_CONFIG_STRING_MAX];
    uint64_t port;
    uint64_t auth_timeout_s;
} tcp_config_t;

static const mr_config_entry_t tcp_config_table[] = {
    {.name = "MAILRAIL_TCP_ADDR",
     .default_value = "127.0.0.1",
     .type = MR_CONFIG_STRING,
     .offset = offsetof(tcp_config_t, addr),
     .doc = "The IPv4 address each rank listens on and advertises to its peers, or the name of "
            "a network interface (such as eth0) whose IPv4 address is used. The default, the "
            "loopback address, only connects ranks that run on the same host."},
    {.name = "MAILRAIL_TCP_PORT",
     .default_value = "0",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(tcp_config_t, port),
     .min = 0,
     .max = 65535,
     .doc = "The TCP port to listen on. With 0 the system picks a free port for every rank; "
            "any other value makes rank r listen on this port plus r, which must not exceed "
            "65535."},
    {.name = "MAILRAIL_TCP_AUTH_TIMEOUT",
     .default_value = "5",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(tcp_config_t, auth_timeout_s),
     .min = 1,
     .max = 3600,
     .doc = "Seconds an incoming connection may take to prove that it belongs to the job "
            "before it is closed. Connections that fail or miss this check are dropped, "
            "logged and counted as rejected, and the job carries on."},
    {.name = NULL},
};

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
    C_NONE,        /* Not connected (yet). */
    C_RETRY,       /* Connector: waiting to start another attempt. */
    C_CONNECTING,  /* Connector: TCP connect in progress. */
    C_NONCE,       /* Connector: reading the acceptor's nonce. */
    C_AUTH,        /* Connector: writing its AUTH message. */
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

    /* Connector handshake. */
    uint8_t hs[TCP_NONCE_LEN > TCP_AUTH_LEN ? TCP_NONCE_LEN : TCP_AUTH_LEN];
    size_t hs_off;
    uint64_t retry_at;
    unsigned attempts;
    int last_err;              /* errno of the last failed attempt, for the timeout log. */

    /* Output: data requests in FIFO order, and a ring of control frames. */
    tcp_req_t *sq_head, *sq_tail;
    size_t sq_off;             /* Bytes of sq_head already written (header included). */
    uint8_t *ctrl;             /* TCP_CTRL_RING frames of TCP_HDR_LEN bytes. */
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

    /* Failure, reported to the core by the next progress call. */
    mr_status_t fail_why;
    bool on_fail_list;
    struct tcp_conn *fail_next;
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
    int nestablished;

    tcp_conn_t *conns;          /* size entries, indexed by rank. */
    uint8_t *bufs;              /* Backing store of every rxbuf and ctrl ring. */
    tcp_req_t *reqs;
    mr__sreq_t *free_reqs;
    mr__done_queue_t done;
    tcp_conn_t *rx_head, *rx_tail;
    tcp_conn_t *fail_head, *fail_tail;
    tcp_pending_t pending[TCP_MAX_PENDING];
    unsigned npending;

    uint64_t drop_log_window;   /* Start of the current second of drop warnings. */
    unsigned drop_log_count;
    uint64_t drop_log_suppressed;
};
MR__BASE_CHECK();

/* ------------------------------------------------------------------------ */
/* Small helpers.                                                            */


/* "a.b.c.d:port" into buf (at least 24 bytes). */
static const char *sin_str(const struct sockaddr_in *sin, char *buf, size_t len)
{
    char ip[INET_ADDRSTRLEN];

    if (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip)) == NULL) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sin->sin_port));
    return buf;
}

static int set_interest(mr_substrate_t *s, int fd, uint64_t tag, bool *registered,
                        uint32_t *interest, uint32_t want)
{
    struct epoll_event ev;

    if (want == 0) {
        if (*registered) epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);
        *registered = false;
        *interest = 0;
        return 0;
    }
    if (*registered && *interest == want) return 0;
    memset(&ev, 0, sizeof(ev));
    ev.events = want;
    ev.data.u64 = tag;
    if (epoll_ctl(s->epfd, *registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) < 0) {
        return -errno;
    }
    *registered = true;
    *interest = want;
    return 0;
}

static inline bool conn_has_output(const tcp_conn_t *c)
{
    return c->sq_head != NULL || c->ctrl_count > 0;
}

static void conn_fail(mr_substrate_t *s, tcp_conn_t *c, mr_status_t why);

static int conn_set_interest(mr_substrate_t *s, tcp_conn_t *c, uint32_t want)
{
    return set_interest(s, c->fd, TAG(TAG_PEER, c->gen, c->rank), &c->registered, &c->interest,
                        want);
}

/* Brings an established connection's epoll interest in line with its state. */
static void conn_update_interest(mr_substrate_t *s, tcp_conn_t *c)
{
    uint32_t want = 0;
    int err;

    if (c->state != C_ESTABLISHED) return;
    if (s->connected) {
        if (!c->rx_paused) want |= EPOLLIN;
        if (conn_has_output(c)) want |= EPOLLOUT;
    }
    err = conn_set_interest(s, c, want);
    if (err != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot watch the connection to rank %d: %s.",
                c->rank, strerror(-err));
        conn_fail(s, c, MR_ERR_PEER_FAILED);
    }
}

static void close_fd(mr_substrate_t *s, int *fd, bool *registered)
{
    if (*fd < 0) return;
    if (*registered) epoll_ctl(s->epfd, EPOLL_CTL_DEL, *fd, NULL);
    *registered = false;
    close(*fd);
    *fd = -1;
}

/* ------------------------------------------------------------------------ */
/* Lists.                                                                    */

static tcp_req_t *req_alloc(mr_substrate_t *s)
{
    return (tcp_req_t *)(void *)mr__sreq_pop(&s->free_reqs);
}

static void req_free(mr_substrate_t *s, tcp_req_t *r)
{
    r->data = NULL;
    mr__sreq_push(&s->free_reqs, &r->link);
}

static void rx_list_push(mr_substrate_t *s, tcp_conn_t *c)
{
    if (c->on_rx_list) return;
    c->on_rx_list = true;
    c->rx_next = NULL;
    if (s->rx_tail != NULL) s->rx_tail->rx_next = c;
    else s->rx_head = c;
    s->rx_tail = c;
}

/*
 * Closes an established connection after a failure and queues the failure for
 * the next progress call, which runs the upcalls. Idempotent.
 */
static void conn_fail(mr_substrate_t *s, tcp_conn_t *c, mr_status_t why)
{
    if (c->state != C_ESTABLISHED) return;
    close_fd(s, &c->fd, &c->registered);
    c->state = C_FAILED;
    c->interest = 0;
    c->fail_why = why;
    if (why == MR_ERR_PROTOCOL) s->base.rejected++;
    if (!c->on_fail_list) {
        c->on_fail_list = true;
        c->fail_next = NULL;
        if (s->fail_tail != NULL) s->fail_tail->fail_next = c;
        else s->fail_head = c;
        s->fail_tail = c;
    }
}

static void conn_fail_errno(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what)
{
    char a[40];

    if (c->state != C_ESTABLISHED) return;
    if (s->base.closing && !conn_has_output(c) && c->rx_phase == RX_HEADER &&
        c->rx_end == c->rx_start) {
        /* Every rank is finalizing: an orderly close, between frames, with nothing owed. */
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d (%s) closed its connection while "
                "finalizing (%s).", c->rank, sin_str(&c->addr, a, sizeof(a)),
                err ? strerror(err) : "end of stream");
        close_fd(s, &c->fd, &c->registered);
        c->interest = 0;
        c->state = C_CLOSED;
        return;
    }
    if (err == 0) {
        MR__LOG(s, MR_LOG_WARN,
                "TCP substrate: rank %d (%s) closed its connection (end of stream%s).",
                c->rank, sin_str(&c->addr, a, sizeof(a)),
                c->rx_phase != RX_HEADER || c->rx_end > c->rx_start ? " in the middle of a frame"
                                                                 : "");
    } else {
        MR__LOG(s, MR_LOG_WARN,
                "TCP substrate: the connection to rank %d (%s) failed while %s: %s.", c->rank,
                sin_str(&c->addr, a, sizeof(a)), what, strerror(err));
    }
    conn_fail(s, c, MR_ERR_PEER_FAILED);
}

/* ------------------------------------------------------------------------ */
/* Output.                                                                   */

/* Adds the unwritten part of a data frame, `off` bytes in, to iov. */
static int req_iov(const tcp_req_t *r, size_t off, struct iovec *iov, int n)
{
    if (off < TCP_HDR_LEN) {
        iov[n].iov_base = (void *)(r->hdr + off);
        iov[n].iov_len = TCP_HDR_LEN - off;
        n++;
        off = 0;
    } else {
        off -= TCP_HDR_LEN;
    }
    if (r->length > off) {
        iov[n].iov_base = (void *)((const uint8_t *)r->data + off);
        iov[n].iov_len = r->length - off;
        n++;
    }
    return n;
}

/* The head data request is fully written: it goes to the completion list. */
static void sq_complete_head(mr_substrate_t *s, tcp_conn_t *c)
{
    tcp_req_t *r = c->sq_head;

    c->sq_head = r->sq_next;
    if (c->sq_head == NULL) c->sq_tail = NULL;
    c->sq_off = 0;
    mr__done_push(&s->done, &r->link);
}

/* Accounts for `left` bytes written from the iovecs conn_flush gathered. */
static void conn_advance(mr_substrate_t *s, tcp_conn_t *c, size_t left)
{
    if (c->sq_off > 0) {
        size_t rem = TCP_HDR_LEN + c->sq_head->length - c->sq_off;
        if (left < rem) {
            c->sq_off += left;
            return;
        }
        left -= rem;
        sq_complete_head(s, c);
    }
    if (c->ctrl_count > 0) {
        size_t rem = (size_t)c->ctrl_count * TCP_HDR_LEN - c->ctrl_off;
        if (left < rem) {
            size_t consumed = c->ctrl_off + left;
            unsigned frames = (unsigned)(consumed / TCP_HDR_LEN);
            c->ctrl_head = (c->ctrl_head + frames) % TCP_CTRL_RING;
            c->ctrl_count -= frames;
            c->ctrl_off = consumed % TCP_HDR_LEN;
            return;
        }
        left -= rem;
        c->ctrl_head = 0;
        c->ctrl_count = 0;
        c->ctrl_off = 0;
    }
    while (left > 0 && c->sq_head != NULL) {
        size_t rem = TCP_HDR_LEN + c->sq_head->length;
        if (left < rem) {
            c->sq_off = left;
            return;
        }
        left -= rem;
        sq_complete_head(s, c);
    }
}

/*
 * Writes as much pending output as the socket takes: the rest of a partly
 * written data frame, then every queued control frame, then data frames in
 * FIFO order. Fails the connection on a socket error.
 */
static void conn_flush(mr_substrate_t *s, tcp_conn_t *c)
{
    while (c->state == C_ESTABLISHED && conn_has_output(c)) {
        struct iovec iov[TCP_MAX_IOV];
        struct msghdr mh;
        tcp_req_t *r = c->sq_head;
        size_t total = 0;
        ssize_t w;
        int n = 0;

        if (r != NULL && c->sq_off > 0) {
            n = req_iov(r, c->sq_off, iov, n);
            r = r->sq_next;
        }
        if (c->ctrl_count > 0) {
            unsigned first = c->ctrl_head;
            unsigned span = TCP_CTRL_RING - first;
            if (span > c->ctrl_count) span = c->ctrl_count;
            iov[n].iov_base = c->ctrl + (size_t)first * TCP_HDR_LEN + c->ctrl_off;
            iov[n].iov_len = (size_t)span * TCP_HDR_LEN - c->ctrl_off;
            n++;
            if (c->ctrl_count > span) {
                iov[n].iov_base = c->ctrl;
                iov[n].iov_len = (size_t)(c->ctrl_count - span) * TCP_HDR_LEN;
                n++;
            }
        }
        while (r != NULL && n + 2 <= TCP_MAX_IOV) {
            n = req_iov(r, 0, iov, n);
            r = r->sq_next;
        }
        for (int i = 0; i < n; i++) total += iov[i].iov_len;

        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            conn_fail_errno(s, c, errno, "sending");
            return;
        }
        conn_advance(s, c, (size_t)w);
        if ((size_t)w < total) break; /* The socket buffer is full. */
    }
    conn_update_interest(s, c);
}

/* ------------------------------------------------------------------------ */
/* Input.                                                                    */

static void conn_protocol_error(mr_substrate_t *s, tcp_conn_t *c, const tcp_wire_error_t *err)
{
    char a[40];

    MR__LOG(s, MR_LOG_ERROR,
            "TCP substrate: rank %d (%s) broke the frame protocol (%s: %lld); closing its "
            "connection.",
            c->rank, sin_str(&c->addr, a, sizeof(a)), err->what, err->value);
    conn_fail(s, c, MR_ERR_PROTOCOL);
}

/* Handles a recv() result that is not a positive count; false: stop reading. */
static bool conn_read_error(mr_substrate_t *s, tcp_conn_t *c, ssize_t n)
{
    if (n == 0) {
        conn_fail_errno(s, c, 0, "receiving");
        return false;
    }
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    conn_fail_errno(s, c, errno, "receiving");
    return false;
}

/*
 * Reads and dispatches frames from an established connection until the socket
 * is drained, a slot is missing, the budget is spent or the connection fails.
 * Returns the number of frames delivered.
 */
static int conn_read(mr_substrate_t *s, tcp_conn_t *c)
{
    int frames = 0;

    while (c->state == C_ESTABLISHED) {
        if (frames >= TCP_RX_BUDGET) {
            rx_list_push(s, c); /* Come back next progress call, fairly. */
            break;
        }
        if (c->rx_phase == RX_HEADER) {
            size_t avail = c->rx_end - c->rx_start;
            tcp_wire_frame_t f;
            tcp_wire_error_t err;
            mr_status_t st = tcp_wire_frame_decode(c->rxbuf + c->rx_start, avail,
                                                   s->base.datagram_size, &f, &err);
            if (st == MR_OK) {
                c->rx_start += TCP_HDR_LEN;
                if (f.channel == TCP_WIRE_CH_CONTROL) {
                    frames++;
                    s->base.up.control(s->base.core, c->rank, f.imm);
                    continue;
                }
                c->rx_frame = f;
                c->rx_phase = RX_SLOT;
                continue;
            }
            if (st != MR_AGAIN) {
                conn_protocol_error(s, c, &err);
                break;
            }
            /* Not a whole header yet: compact and read more. */
            if (c->rx_start > 0) {
                memmove(c->rxbuf, c->rxbuf + c->rx_start, avail);
                c->rx_start = 0;
                c->rx_end = avail;
            }
            ssize_t n = recv(c->fd, c->rxbuf + c->rx_end, TCP_RXBUF_LEN - c->rx_end, 0);
            if (n > 0) {
                c->rx_end += (size_t)n;
                continue;
            }
            if (!conn_read_error(s, c, n)) break;
        } else if (c->rx_phase == RX_SLOT) {
            void *slot = s->base.up.recv_slot_acquire(s->base.core);
            if (slot == NULL) {
                if (!c->rx_paused) {
                    c->rx_paused = true;
                    conn_update_interest(s, c);
                }
                rx_list_push(s, c);
                break;
            }
            c->rx_slot = slot;
            c->rx_phase = RX_PAYLOAD;
            if (c->rx_paused) {
                c->rx_paused = false;
                conn_update_interest(s, c);
            }
        } else {
            size_t need = tcp_wire_frame_need(&c->rx_frame);
            size_t avail = c->rx_end - c->rx_start;
            if (avail > 0 && need > 0) {
                size_t off, k = tcp_wire_frame_take(&c->rx_frame, avail, &off);
                memcpy((uint8_t *)c->rx_slot + off, c->rxbuf + c->rx_start, k);
                c->rx_start += k;
                need -= k;
            }
            if (need == 0) {
                void *slot = c->rx_slot;
                mr_status_t st;

                c->rx_slot = NULL;
                c->rx_phase = RX_HEADER;
                if (c->rx_start == c->rx_end) c->rx_start = c->rx_end = 0;
                frames++;
                st = s->base.up.deliver(s->base.core, c->rank, c->rx_frame.kind,
                                        c->rx_frame.imm, slot, c->rx_frame.length, NULL);
                if (st != MR_OK) {
                    MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: the core refused a message from "
                            "rank %d (status %d).", c->rank, (int)st);
                }
                continue;
            }
            /* The buffer is empty: payload straight into the slot, what follows into rxbuf. */
            struct iovec iov[2];
            c->rx_start = c->rx_end = 0;
            iov[0].iov_base = (uint8_t *)c->rx_slot + c->rx_frame.got;
            iov[0].iov_len = need;
            iov[1].iov_base = c->rxbuf;
            iov[1].iov_len = TCP_RXBUF_LEN;
            ssize_t n = readv(c->fd, iov, 2);
            if (n > 0) {
                size_t off, k = tcp_wire_frame_take(&c->rx_frame, (size_t)n, &off);
                c->rx_end = (size_t)n - k;
                continue;
            }
            if (!conn_read_error(s, c, n)) break;
        }
    }
    return frames;
}

/* Handles an epoll event of an established connection. */
static int conn_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev)
{
    int frames = 0;

    if ((ev & EPOLLOUT) || ((ev & (EPOLLERR | EPOLLHUP)) && conn_has_output(c))) {
        conn_flush(s, c);
    }
    if (c->state == C_ESTABLISHED && !c->rx_paused && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
        frames = conn_read(s, c);
    }
    return frames;
}

/* ------------------------------------------------------------------------ */
/* Incoming connections and their authentication.                           */

/* Whether a dropped connection may be logged: a flood must not flood the log too. */
static bool drop_log_allowed(mr_substrate_t *s)
{
    uint64_t now = mr__now_ns();

    if (now - s->drop_log_window >= MR_NS_PER_S) {
        if (s->drop_log_suppressed > 0) {
            MR__LOG(s, MR_LOG_WARN,
                    "TCP substrate: %llu more incoming connections were dropped without a log "
                    "line of their own.",
                    (unsigned long long)s->drop_log_suppressed);
        }
        s->drop_log_window = now;
        s->drop_log_count = 0;
        s->drop_log_suppressed = 0;
    }
    if (s->drop_log_count < TCP_DROP_LOG_BURST) {
        s->drop_log_count++;
        return true;
    }
    s->drop_log_suppressed++;
    return false;
}

static void pending_drop(mr_substrate_t *s, tcp_pending_t *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Closes a connection that did not authenticate, logging why, and counts it. */
static void pending_drop(mr_substrate_t *s, tcp_pending_t *p, const char *fmt, ...)
{
    char a[40], why[160];
    va_list ap;

    if (mr__log_enabled(&s->base, MR_LOG_WARN) && drop_log_allowed(s)) {
        va_start(ap, fmt);
        vsnprintf(why, sizeof(why), fmt, ap);
        va_end(ap);
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: dropped an incoming connection from %s: %s.",
                sin_str(&p->peer, a, sizeof(a)), why);
    }
    s->base.rejected++;
    close_fd(s, &p->fd, &p->registered);
    p->interest = 0;
    s->npending--;
}

static int pending_set_interest(mr_substrate_t *s, tcp_pending_t *p, uint32_t want)
{
    return set_interest(s, p->fd, TAG(TAG_PENDING, p->gen, (uint32_t)(p - s->pending)),
                        &p->registered, &p->interest, want);
}

/* Moves the descriptor of a verified connection to its rank's slot. */
static void conn_established(mr_substrate_t *s, tcp_conn_t *c)
{
    c->state = C_ESTABLISHED;
    c->rx_phase = RX_HEADER;
    c->rx_start = c->rx_end = 0;
    s->nestablished++;
    /* Until connect() returns, nothing is read: no upcall may run outside progress(). */
    if (s->connected) {
        conn_update_interest(s, c);
    } else {
        conn_set_interest(s, c, 0);
    }
}

static void pending_verify(mr_substrate_t *s, tcp_pending_t *p)
{
    int32_t rank = -1;
    tcp_wire_error_t err;
    tcp_conn_t *c;
    mr_status_t st = tcp_wire_auth_verify(p->auth, p->auth_got, s->key, p->nonce, s->base.rank,
                                          &rank, &err);

    if (st != MR_OK) {
        switch (st == MR_AGAIN ? TCP_WIRE_TRUNCATED : err.fault) {
        case TCP_WIRE_BAD_RANK:
            pending_drop(s, p, "it claims rank %lld, which does not connect to rank %d",
                         err.value, s->base.rank);
            break;
        case TCP_WIRE_BAD_MAC:
            pending_drop(s, p, "it claims rank %lld but its proof of the job key is wrong",
                         err.value);
            break;
        case TCP_WIRE_TRUNCATED:
            pending_drop(s, p, "its handshake is shorter than a MailRail TCP AUTH message");
            break;
        default:
            pending_drop(s, p, "its handshake is not a MailRail TCP AUTH message (%s: %lld)",
                         err.what, err.value);
            break;
        }
        return;
    }
    c = &s->conns[rank];
    if (c->state != C_NONE) {
        pending_drop(s, p, "it claims rank %d, which has already connected", (int)rank);
        return;
    }
    set_interest(s, p->fd, 0, &p->registered, &p->interest, 0);
    c->fd = p->fd;
    c->gen++;
    c->registered = false;
    c->interest = 0;
    p->fd = -1;
    s->npending--;
    if (!s->connect_started) {
        /* Not expected: connect() fills in the advertised address; use the source. */
        c->addr = p->peer;
    }
    conn_established(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d connected from %s and authenticated.",
                c->rank, sin_str(&p->peer, a, sizeof(a)));
    }
}

static void pending_event(mr_substrate_t *s, tcp_pending_t *p, uint32_t ev)
{
    if (p->nonce_sent < TCP_NONCE_LEN) {
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
        ssize_t n = send(p->fd, p->nonce + p->nonce_sent, TCP_NONCE_LEN - p->nonce_sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
            pending_drop(s, p, "the challenge could not be sent (%s)", strerror(errno));
            return;
        }
        p->nonce_sent += (size_t)n;
        if (p->nonce_sent < TCP_NONCE_LEN) return;
        if (pending_set_interest(s, p, EPOLLIN) != 0) {
            pending_drop(s, p, "it cannot be watched (%s)", strerror(errno));
        }
        return;
    }
    for (;;) {
        /* Exactly the AUTH message: later bytes are frames, read after verification. */
        ssize_t n = recv(p->fd, p->auth + p->auth_got, TCP_AUTH_LEN - p->auth_got, 0);
        if (n == 0) {
            pending_drop(s, p, "it closed the connection before authenticating");
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            pending_drop(s, p, "receiving failed (%s)", strerror(errno));
            return;
        }
        p->auth_got += (size_t)n;
        if (p->auth_got == TCP_AUTH_LEN) {
            pending_verify(s, p);
            return;
        }
    }
}

static void listener_pause(mr_substrate_t *s, uint64_t now)
{
    bool reg = s->listen_registered;
    uint32_t interest = EPOLLIN;

    set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, 0);
    s->listen_registered = reg;
    s->listen_resume_at = now + TCP_LISTEN_PAUSE_MS * MR_NS_PER_MS;
}

static void listener_maybe_resume(mr_substrate_t *s, uint64_t now)
{
    if (s->listen_resume_at == 0 || now < s->listen_resume_at) return;
    bool reg = s->listen_registered;
    uint32_t interest = 0;
    if (set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, EPOLLIN) == 0) {
        s->listen_resume_at = 0;
    } else {
        s->listen_resume_at = now + TCP_LISTEN_PAUSE_MS * MR_NS_PER_MS;
    }
    s->listen_registered = reg;
}

static void listener_event(mr_substrate_t *s)
{
    for (int i = 0; i < TCP_ACCEPT_BURST; i++) {
        struct sockaddr_in sa;
        socklen_t salen = sizeof(sa);
        tcp_pending_t *p = NULL;
        int one = 1;
        uint64_t now;

        memset(&sa, 0, sizeof(sa));
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                MR__LOG(s, MR_LOG_WARN,
                        "TCP substrate: cannot accept connections (%s); the listener pauses "
                        "for %d ms.",
                        strerror(errno), TCP_LISTEN_PAUSE_MS);
                listener_pause(s, mr__now_ns());
                return;
            }
            MR__LOG(s, MR_LOG_WARN, "TCP substrate: accept failed: %s.", strerror(errno));
            return;
        }
        now = mr__now_ns();
        for (unsigned k = 0; k < TCP_MAX_PENDING; k++) {
            if (s->pending[k].fd < 0) {
                p = &s->pending[k];
                break;
            }
        }
        if (p == NULL) {
            char a[40];
            if (mr__log_enabled(&s->base, MR_LOG_WARN) && drop_log_allowed(s)) {
                MR__LOG(s, MR_LOG_WARN,
                        "TCP substrate: dropped an incoming connection from %s: %d connections "
                        "are already authenticating.",
                        sin_str(&sa, a, sizeof(a)), TCP_MAX_PENDING);
            }
            s->base.rejected++;
            close(fd);
            continue;
        }
        p->fd = fd;
        p->gen++;
        p->registered = false;
        p->interest = 0;
        p->peer = sa;
        p->nonce_sent = 0;
        p->auth_got = 0;
        p->deadline = now + s->auth_timeout_ns;
        s->npending++;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (!mr__random_bytes(p->nonce, sizeof(p->nonce))) {
            pending_drop(s, p, "no random challenge could be drawn (%s)", strerror(errno));
            continue;
        }
        ssize_t n = send(fd, p->nonce, TCP_NONCE_LEN, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            pending_drop(s, p, "the challenge could not be sent (%s)", strerror(errno));
            continue;
        }
        if (n > 0) p->nonce_sent = (size_t)n;
        if (pending_set_interest(s, p, p->nonce_sent < TCP_NONCE_LEN ? EPOLLOUT : EPOLLIN) != 0) {
            pending_drop(s, p, "it cannot be watched (%s)", strerror(errno));
        }
    }
}

/* Drops strangers whose time to authenticate is up; returns the next deadline. */
static uint64_t pending_expire(mr_substrate_t *s, uint64_t now)
{
    uint64_t next = UINT64_MAX;

    if (s->npending == 0) return next;
    for (unsigned k = 0; k < TCP_MAX_PENDING; k++) {
        tcp_pending_t *p = &s->pending[k];
        if (p->fd < 0) continue;
        if (p->deadline <= now) {
            pending_drop(s, p, "it did not authenticate within %llu s",
                         (unsigned long long)s->cfg.auth_timeout_s);
        } else if (p->deadline < next) {
            next = p->deadline;
        }
    }
    return next;
}

/* ------------------------------------------------------------------------ */
/* Outgoing connections (connect() only).                                    */

static void connector_retry(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what)
{
    char a[40];
    uint64_t backoff = (uint64_t)TCP_RETRY_MS * (c->attempts < 10 ? c->attempts : 10);

    close_fd(s, &c->fd, &c->registered);
    c->interest = 0;
    c->state = C_RETRY;
    c->last_err = err;
    c->retry_at = mr__now_ns() + backoff * MR_NS_PER_MS;
    MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: attempt %u to connect to rank %d (%s) failed while "
            "%s: %s; retrying.", c->attempts, c->rank, sin_str(&c->addr, a, sizeof(a)), what,
            err ? strerror(err) : "connection closed by the peer");
}

/* Writes the connector's AUTH; on success the connection is established. */
static void connector_send_auth(mr_substrate_t *s, tcp_conn_t *c)
{
    while (c->hs_off < TCP_AUTH_LEN) {
        ssize_t n = send(c->fd, c->hs + c->hs_off, TCP_AUTH_LEN - c->hs_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (conn_set_interest(s, c, EPOLLOUT) != 0) {
                    connector_retry(s, c, errno, "waiting to authenticate");
                }
                return;
            }
            connector_retry(s, c, errno, "authenticating");
            return;
        }
        c->hs_off += (size_t)n;
    }
    conn_established(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: connected to rank %d at %s.", c->rank,
                sin_str(&c->addr, a, sizeof(a)));
    }
}

static void connector_read_nonce(mr_substrate_t *s, tcp_conn_t *c)
{
    while (c->hs_off < TCP_NONCE_LEN) {
        ssize_t n = recv(c->fd, c->hs + c->hs_off, TCP_NONCE_LEN - c->hs_off, 0);
        if (n == 0) {
            connector_retry(s, c, 0, "reading the challenge");
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            connector_retry(s, c, errno, "reading the challenge");
            return;
        }
        c->hs_off += (size_t)n;
    }
    uint8_t nonce[TCP_NONCE_LEN];
    memcpy(nonce, c->hs, TCP_NONCE_LEN);
    tcp_wire_auth_encode(c->hs, s->key, nonce, s->base.rank, c->rank);
    c->hs_off = 0;
    c->state = C_AUTH;
    connector_send_auth(s, c);
}

static void connector_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev)
{
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
        if (err != 0) {
            connector_retry(s, c, err, "connecting");
            return;
        }
        c->state = C_NONCE;
        c->hs_off = 0;
        if (conn_set_interest(s, c, EPOLLIN) != 0) {
            connector_retry(s, c, errno, "connecting");
            return;
        }
    }
    if (c->state == C_NONCE) {
        connector_read_nonce(s, c);
    } else if (c->state == C_AUTH) {
        connector_send_auth(s, c);
    }
}

/* Starts one connection attempt; false on a local failure. */
static bool connector_start(mr_substrate_t *s, tcp_conn_t *c)
{
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot create a socket to reach rank %d: %s.",
                c->rank, strerror(errno));
        return false;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->gen++;
    c->registered = false;
    c->interest = 0;
    c->attempts++;
    c->hs_off = 0;
    if (connect(fd, (const struct sockaddr *)&c->addr, sizeof(c->addr)) == 0) {
        c->state = C_NONCE;
        if (conn_set_interest(s, c, EPOLLIN) != 0) connector_retry(s, c, errno, "connecting");
        return true;
    }
    if (errno != EINPROGRESS && errno != EINTR) {
        connector_retry(s, c, errno, "connecting");
        return true;
    }
    c->state = C_CONNECTING;
    if (conn_set_interest(s, c, EPOLLOUT) != 0) connector_retry(s, c, errno, "connecting");
    return true;
}

/* ------------------------------------------------------------------------ */
/* Event dispatch.                                                           */

static int dispatch(mr_substrate_t *s, const struct epoll_event *e)
{
    uint64_t tag = e->data.u64;
    unsigned type = (unsigned)(tag >> 56);
    uint32_t gen = (uint32_t)(tag >> 32) & 0xffffffu;
    uint32_t idx = (uint32_t)tag;

    switch (type) {
    case TAG_LISTEN:
        listener_event(s);
        return 0;
    case TAG_PENDING:
        if (idx < TCP_MAX_PENDING && s->pending[idx].fd >= 0 &&
            (s->pending[idx].gen & 0xffffffu) == gen) {
            pending_event(s, &s->pending[idx], e->events);
        }
        return 0;
    case TAG_PEER:
        if (idx < (uint32_t)s->base.size) {
            tcp_conn_t *c = &s->conns[idx];
            if (c->fd < 0 || (c->gen & 0xffffffu) != gen) return 0;
            if (c->state == C_ESTABLISHED) return s->connected ? conn_event(s, c, e->events) : 0;
            connector_event(s, c, e->events);
        }
        return 0;
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Upcall drains (progress() only).                                          */

static int drain_failed(mr_substrate_t *s)
{
    int n = 0;
    tcp_conn_t *c;

    while ((c = s->fail_head) != NULL) {
        s->fail_head = c->fail_next;
        if (s->fail_head == NULL) s->fail_tail = NULL;
        c->on_fail_list = false;
        c->fail_next = NULL;
        if (c->rx_slot != NULL) {
            void *slot = c->rx_slot;
            c->rx_slot = NULL;
            s->base.up.recv_slot_abandon(s->base.core, slot);
        }
        c->rx_phase = RX_HEADER;
        c->rx_start = c->rx_end = 0;
        c->ctrl_count = 0;
        c->ctrl_off = 0;
        s->base.up.peer_failed(s->base.core, c->rank, c->fail_why);
        n++;
        /* Every queued send completes, so that the core gets its buffers back. */
        tcp_req_t *r;
        while ((r = c->sq_head) != NULL) {
            void *cookie = r->link.cookie;
            c->sq_head = r->sq_next;
            if (c->sq_head == NULL) c->sq_tail = NULL;
            c->sq_off = 0;
            req_free(s, r);
            s->base.up.send_complete(s->base.core, cookie);
            n++;
        }
    }
    return n;
}

static int retry_rx(mr_substrate_t *s)
{
    tcp_conn_t *c = s->rx_head;
    int n = 0;

    s->rx_head = s->rx_tail = NULL;
    while (c != NULL) {
        tcp_conn_t *next = c->rx_next;
        c->on_rx_list = false;
        c->rx_next = NULL;
        if (c->state == C_ESTABLISHED) n += conn_read(s, c);
        c = next;
    }
    return n;
}

/* Whether a connection on the retry list can make progress without a new slot. */
static bool rx_list_busy(const mr_substrate_t *s)
{
    for (const tcp_conn_t *c = s->rx_head; c != NULL; c = c->rx_next) {
        if (!c->rx_paused && c->state == C_ESTABLISHED) return true;
    }
    return false;
}

/* ------------------------------------------------------------------------ */
/* Operations.                                                               */

static mr_status_t tcp_resolve(mr_substrate_t *s, const char *text, struct in_addr *out)
{
    struct ifaddrs *ifs, *ifa;
    bool found = false;

    if (inet_pton(AF_INET, text, out) == 1) {
        if (out->s_addr == htonl(INADDR_ANY)) {
            MR__LOG(s, MR_LOG_ERROR,
                    "TCP substrate: MAILRAIL_TCP_ADDR=%s is the wildcard address, which peers "
                    "cannot connect to; name a specific IPv4 address or a network interface.",
                    text);
            return MR_ERR_CONFIG;
        }
        return MR_OK;
    }
    if (getifaddrs(&ifs) != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot list the network interfaces: %s.",
                strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    for (ifa = ifs; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET ||
            ifa->ifa_name == NULL || strcmp(ifa->ifa_name, text) != 0) {
            continue;
        }
        memcpy(out, &((const struct sockaddr_in *)(const void *)ifa->ifa_addr)->sin_addr,
               sizeof(*out));
        found = true;
        break;
    }
    freeifaddrs(ifs);
    if (!found) {
        MR__LOG(s, MR_LOG_ERROR,
                "TCP substrate: MAILRAIL_TCP_ADDR=%s is neither an IPv4 address nor the name of a "
                "network interface that has an IPv4 address.",
                text);
        return MR_ERR_CONFIG;
    }
    return MR_OK;
}

static void tcp_close(mr_substrate_t *s);

/*
 * Every rank keeps a connection to every other, plus its listener, epoll and
 * connections being authenticated. When the soft RLIMIT_NOFILE is too low for
 * that (and for the application's and MPI's own descriptors), it is raised
 * towards the hard limit; when even the hard limit is too low, the substrate
 * refuses to start with the number to ask for, instead of failing with EMFILE
 * halfway through connecting.
 */
static mr_status_t tcp_reserve_descriptors(mr_substrate_t *s)
{
    rlim_t need = (rlim_t)s->base.size + TCP_MAX_PENDING + TCP_SPARE_FDS;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) {
        return MR_OK;
    }
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        MR__LOG(s, MR_LOG_ERROR,
                "TCP substrate: %d ranks need about %llu file descriptors per process, but the "
                "hard limit is %llu (ulimit -Hn): raise it, or use a substrate that does not keep "
                "a socket per peer (MAILRAIL_SUBSTRATE=ucx).",
                s->base.size, (unsigned long long)need, (unsigned long long)rl.rlim_max);
        return MR_ERR_TRANSPORT;
    }
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot raise the descriptor limit from %llu to "
                "%llu for %d ranks: %s.", (unsigned long long)was, (unsigned long long)need,
                s->base.size, strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    MR__LOG(s, MR_LOG_INFO, "TCP substrate: raised the soft descriptor limit from %llu to %llu for "
            "%d ranks.", (unsigned long long)was, (unsigned long long)need, s->base.size);
    return MR_OK;
}

/* Copies the job key and the settings; nothing is open yet. */
static void tcp_init_state(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    _Static_assert(MR_JOB_KEY_LEN == TCP_WIRE_KEY_LEN, "the handshake's key is the job key");
    memcpy(s->key, p->job_key, TCP_WIRE_KEY_LEN);
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    s->cfg.addr[sizeof(s->cfg.addr) - 1] = '\0';
    s->auth_timeout_ns = s->cfg.auth_timeout_s * MR_NS_PER_S;
    s->epfd = -1;
    s->lfd = -1;
    for (unsigned k = 0; k < TCP_MAX_PENDING; k++) s->pending[k].fd = -1;
}

static mr_status_t tcp_init_mac(mr_substrate_t *s)
{
    if (tcp_wire_init() == MR_OK) return MR_OK;
    MR__LOG(s, MR_LOG_ERROR, "TCP substrate: libsodium cannot be initialized.");
    return MR_ERR_TRANSPORT;
}

/* Rank r listens on MAILRAIL_TCP_PORT + r, which must be a port. */
static mr_status_t tcp_check_port(mr_substrate_t *s)
{
    if (s->cfg.port > 65535 || (s->cfg.port != 0 && s->cfg.port + (uint64_t)s->base.rank > 65535)) {
        MR__LOG(s, MR_LOG_ERROR,
                "TCP substrate: MAILRAIL_TCP_PORT=%llu plus rank %d exceeds the largest port, "
                "65535.",
                (unsigned long long)s->cfg.port, s->base.rank);
        return MR_ERR_CONFIG;
    }
    return MR_OK;
}

/* Per-peer state and the request pool: nothing is allocated on the data path. */
static mr_status_t tcp_alloc_peers(mr_substrate_t *s)
{
    s->conns = calloc((size_t)s->base.size, sizeof(*s->conns));
    s->reqs = calloc(s->base.max_sends, sizeof(*s->reqs));
    s->bufs = malloc((size_t)s->base.size * (TCP_RXBUF_LEN + TCP_CTRL_RING * TCP_HDR_LEN));
    if (s->conns != NULL) {
        for (int r = 0; r < s->base.size; r++) s->conns[r].fd = -1;
    }
    if (s->conns == NULL || s->reqs == NULL || s->bufs == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: out of memory for %d connections and %zu sends.",
                s->base.size, s->base.max_sends);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < s->base.size; r++) {
        tcp_conn_t *c = &s->conns[r];
        uint8_t *b = s->bufs + (size_t)r * (TCP_RXBUF_LEN + TCP_CTRL_RING * TCP_HDR_LEN);
        c->rank = r;
        c->state = C_NONE;
        c->rxbuf = b;
        c->ctrl = b + TCP_RXBUF_LEN;
    }
    for (size_t i = s->base.max_sends; i-- > 0;) req_free(s, &s->reqs[i]);
    return MR_OK;
}

/* The epoll instance that drives every socket. */
static mr_status_t tcp_create_epoll(mr_substrate_t *s)
{
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd >= 0) return MR_OK;
    MR__LOG(s, MR_LOG_ERROR, "TCP substrate: epoll_create1 failed: %s.", strerror(errno));
    return MR_ERR_TRANSPORT;
}

/* Binds the listening socket to MAILRAIL_TCP_ADDR and the port; sets s->laddr. */
static mr_status_t tcp_bind_listener(mr_substrate_t *s)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(s->laddr);
    mr_status_t st;
    int one = 1;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)(s->cfg.port ? s->cfg.port + (uint64_t)s->base.rank : 0));
    st = tcp_resolve(s, s->cfg.addr, &sa.sin_addr);
    if (st != MR_OK) return st;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot create the listening socket: %s.",
                strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s->lfd, (const struct sockaddr *)&sa, sizeof(sa)) < 0) {
        char a[40];
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot listen on %s (MAILRAIL_TCP_ADDR=%s, "
                "MAILRAIL_TCP_PORT=%llu): %s.", sin_str(&sa, a, sizeof(a)), s->cfg.addr,
                (unsigned long long)s->cfg.port, strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    if (listen(s->lfd, SOMAXCONN) < 0 ||
        getsockname(s->lfd, (struct sockaddr *)&s->laddr, &salen) < 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot listen: %s.", strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}

/* Adds the listening socket to the epoll set. */
static mr_status_t tcp_watch_listener(mr_substrate_t *s)
{
    bool reg = false;
    uint32_t interest = 0;
    int err = set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, EPOLLIN);

    s->listen_registered = reg;
    if (err != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot watch the listening socket: %s.",
                strerror(-err));
        return MR_ERR_TRANSPORT;
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d listens on %s.", s->base.rank,
                sin_str(&s->laddr, a, sizeof(a)));
    }
    return MR_OK;
}

static mr_status_t tcp_open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s = NULL;
    mr_status_t st = mr__substrate_alloc(p, sizeof(*s), "TCP substrate", UINT32_MAX, true, &s);

    if (st != MR_OK) return st;
    tcp_init_state(s, p);
    st = tcp_init_mac(s);
    if (st == MR_OK) st = tcp_check_port(s);
    if (st == MR_OK) st = tcp_reserve_descriptors(s);
    if (st == MR_OK) st = tcp_alloc_peers(s);
    if (st == MR_OK) st = tcp_create_epoll(s);
    if (st == MR_OK) st = tcp_bind_listener(s);
    if (st == MR_OK) st = tcp_watch_listener(s);
    if (st != MR_OK) {
        tcp_close(s);
        return st;
    }
    *out = s;
    return MR_OK;
}

static mr_status_t tcp_get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    uint8_t w[TCP_WIRE_ADDR_LEN];

    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    tcp_wire_addr_encode(w, &s->laddr);
    memcpy(addr, w, sizeof(w));
    *length = sizeof(w);
    return MR_OK;
}

static void tcp_format_address(const void *addr, size_t length, char *buf, size_t len)
{
    struct sockaddr_in sin;
    char a[40];

    if (buf == NULL || len == 0) return;
    if (tcp_wire_addr_parse(addr, length, &sin, NULL) != MR_OK) {
        snprintf(buf, len, "tcp (not a TCP substrate address)");
        return;
    }
    snprintf(buf, len, "tcp %s", sin_str(&sin, a, sizeof(a)));
}

/* Logs the ranks that connect() is still waiting for, and at what stage. */
static void log_missing(mr_substrate_t *s)
{
    char list[768];
    size_t used = 0;
    int missing = 0, listed = 0;

    list[0] = '\0';
    for (int r = 0; r < s->base.size; r++) {
        tcp_conn_t *c = &s->conns[r];
        char a[40], what[160];
        int n;

        if (r == s->base.rank || c->state == C_ESTABLISHED) continue;
        missing++;
        if (listed == 8) continue;
        listed++;
        sin_str(&c->addr, a, sizeof(a));
        switch (c->state) {
        case C_NONE:
            snprintf(what, sizeof(what), "rank %d (%s) never connected to it", r, a);
            break;
        case C_CONNECTING:
            snprintf(what, sizeof(what), "rank %d (%s) did not answer the TCP connection", r, a);
            break;
        case C_NONCE:
        case C_AUTH:
            snprintf(what, sizeof(what), "rank %d (%s) accepted the connection but did not "
                     "run the handshake", r, a);
            break;
        default:
            snprintf(what, sizeof(what), "rank %d (%s) could not be reached (%s)", r, a,
                     c->last_err ? strerror(c->last_err) : "closed during the handshake");
            break;
        }
        n = snprintf(list + used, sizeof(list) - used, "%s%s", used ? "; " : "", what);
        if (n > 0) used += (size_t)n;
        if (used >= sizeof(list)) used = sizeof(list) - 1;
    }
    MR__LOG(s, MR_LOG_ERROR,
            "TCP substrate: rank %d timed out after %u s with %d of its %d peers not connected: "
            "%s%s.",
            s->base.rank, s->base.timeout_s, missing, s->base.size - 1, list,
            missing > listed ? "; ..." : "");
}

static mr_status_t tcp_connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    uint64_t start = mr__now_ns(), deadline;
    struct epoll_event evs[TCP_MAX_EVENTS];

    if (s == NULL || s->connect_started) return MR_ERR_INVALID_PARAM;
    s->connect_started = true;
    if (s->base.size > 1 && (addrs == NULL || addr_len < TCP_WIRE_ADDR_LEN)) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: the address table holds %zu-byte entries, fewer "
                "than the %d bytes of a TCP address.", addr_len, TCP_WIRE_ADDR_LEN);
        return MR_ERR_PROTOCOL;
    }
    for (int r = 0; r < s->base.size && s->base.size > 1; r++) {
        const uint8_t *blob = (const uint8_t *)addrs + (size_t)r * addr_len;
        tcp_conn_t *c = &s->conns[r];
        if (tcp_wire_addr_parse(blob, addr_len, &c->addr, NULL) != MR_OK ||
            c->addr.sin_port == 0 ||
            c->addr.sin_addr.s_addr == htonl(INADDR_ANY)) {
            MR__LOG(s, MR_LOG_ERROR, "TCP substrate: the address of rank %d is not a valid TCP "
                    "substrate address (wrong magic, version, port or IP address).", r);
            return MR_ERR_PROTOCOL;
        }
        if (r > s->base.rank) {
            c->state = C_RETRY;
            c->retry_at = 0;
        }
    }
    deadline = s->base.timeout_s ? start + (uint64_t)s->base.timeout_s * MR_NS_PER_S : UINT64_MAX;

    while (s->nestablished < s->base.size - 1) {
        uint64_t now = mr__now_ns();
        int n;

        if (now >= deadline) {
            log_missing(s);
            return MR_ERR_TIMEOUT;
        }
        for (int r = s->base.rank + 1; r < s->base.size; r++) {
            tcp_conn_t *c = &s->conns[r];
            /*
             * An attempt in progress is not timed out on its own: the acceptor
             * may enter connect() late, and it closes the socket if it rejects us.
             */
            if (c->state == C_RETRY && c->retry_at <= now) {
                if (!connector_start(s, c)) return MR_ERR_TRANSPORT;
            }
        }
        pending_expire(s, now);
        listener_maybe_resume(s, now);
        n = epoll_wait(s->epfd, evs, TCP_MAX_EVENTS, TCP_CONNECT_POLL_MS);
        if (n < 0) {
            if (errno == EINTR) continue;
            MR__LOG(s, MR_LOG_ERROR, "TCP substrate: epoll_wait failed: %s.", strerror(errno));
            return MR_ERR_TRANSPORT;
        }
        for (int i = 0; i < n; i++) dispatch(s, &evs[i]);
    }
    s->connected = true;
    for (int r = 0; r < s->base.size; r++) {
        if (s->conns[r].state == C_ESTABLISHED) conn_update_interest(s, &s->conns[r]);
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d connected to its %d peers in %.3f s.",
                s->base.rank, s->base.size - 1, (double)(mr__now_ns() - start) / 1e9);
    }
    return MR_OK;
}

/* The connection to `dest` if it can take output, or the status saying why not. */
static mr_status_t conn_for_send(mr_substrate_t *s, int dest, tcp_conn_t **out)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    tcp_conn_t *c = &s->conns[dest];
    if (c->state == C_FAILED || c->state == C_CLOSED) return MR_ERR_PEER_FAILED;
    if (c->state != C_ESTABLISHED || !s->connected) return MR_ERR_INVALID_RANK;
    *out = c;
    return MR_OK;
}

static mr_status_t tcp_send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                            const void *data, size_t length, void *cookie)
{
    tcp_conn_t *c = NULL;
    mr_status_t st = conn_for_send(s, dest, &c);
    tcp_req_t *r;
    bool idle;

    if (st != MR_OK) return st;
    if (length > s->base.datagram_size) return MR_ERR_MESSAGE_TOO_LONG;
    if (kind > UINT8_MAX || (data == NULL && length > 0)) return MR_ERR_INVALID_PARAM;
    r = req_alloc(s);
    if (r == NULL) return MR_AGAIN;
    tcp_wire_frame_encode(r->hdr, TCP_WIRE_CH_DATA, (uint8_t)kind, imm, (uint32_t)length);
    r->data = data;
    r->length = length;
    r->link.cookie = cookie;
    r->sq_next = NULL;
    idle = !conn_has_output(c);
    if (c->sq_tail != NULL) c->sq_tail->sq_next = r;
    else c->sq_head = r;
    c->sq_tail = r;
    /* Completions and failures found here are reported by the next progress call. */
    if (idle) conn_flush(s, c);
    return MR_OK;
}

static mr_status_t tcp_send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    tcp_conn_t *c = NULL;
    mr_status_t st = conn_for_send(s, dest, &c);
    uint8_t *h;
    bool idle;

    if (st != MR_OK) return st;
    if (c->ctrl_count == TCP_CTRL_RING) return MR_AGAIN;
    idle = !conn_has_output(c);
    h = c->ctrl + (size_t)((c->ctrl_head + c->ctrl_count) % TCP_CTRL_RING) * TCP_HDR_LEN;
    tcp_wire_frame_encode(h, TCP_WIRE_CH_CONTROL, 0, imm, 0);
    c->ctrl_count++;
    if (idle) conn_flush(s, c);
    return MR_OK;
}

static int tcp_progress(mr_substrate_t *s, int timeout_ms)
{
    struct epoll_event evs[TCP_MAX_EVENTS];
    int events = 0, wait, n;
    uint64_t now, next;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    events += drain_failed(s);
    events += mr__done_drain(s, &s->done, &s->free_reqs);
    events += retry_rx(s);

    now = mr__now_ns();
    listener_maybe_resume(s, now);
    next = pending_expire(s, now);
    if (s->listen_resume_at != 0 && s->listen_resume_at < next) next = s->listen_resume_at;

    wait = timeout_ms;
    if (events > 0 || !mr__done_empty(&s->done) || s->fail_head != NULL || rx_list_busy(s)) {
        wait = 0;
    }
    if (wait != 0 && next != UINT64_MAX) {
        uint64_t until = next > now ? (next - now + MR_NS_PER_MS - 1) / MR_NS_PER_MS : 0;
        if (wait < 0 || until < (uint64_t)wait) wait = (int)(until < INT32_MAX ? until : INT32_MAX);
    }
    n = epoll_wait(s->epfd, evs, TCP_MAX_EVENTS, wait);
    if (n < 0) {
        if (errno != EINTR) {
            MR__LOG(s, MR_LOG_ERROR, "TCP substrate: epoll_wait failed: %s.", strerror(errno));
            return MR_ERR_TRANSPORT;
        }
        n = 0;
    }
    for (int i = 0; i < n; i++) events += dispatch(s, &evs[i]);
    if (n > 0) pending_expire(s, mr__now_ns());

    events += drain_failed(s);
    events += mr__done_drain(s, &s->done, &s->free_reqs);
    return events;
}

static void tcp_close(mr_substrate_t *s)
{
    if (s == NULL) return;
    /* No upcalls here: queued sends and held slots go away with the core's pools. */
    if (s->conns != NULL) {
        for (int r = 0; r < s->base.size; r++) {
            if (s->conns[r].fd >= 0) close(s->conns[r].fd);
        }
    }
    for (unsigned k = 0; k < TCP_MAX_PENDING; k++) {
        if (s->pending[k].fd >= 0) close(s->pending[k].fd);
    }
    if (s->lfd >= 0) close(s->lfd);
    if (s->epfd >= 0) close(s->epfd);
    free(s->conns);
    free(s->reqs);
    free(s->bufs);
    free(s);
}

static const mr_substrate_ops_t tcp_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "tcp",
    .description = "TCP sockets: one authenticated connection per pair of ranks, epoll-driven",
    .config_table = tcp_config_table,
    .config_size = sizeof(tcp_config_t),
    .open = tcp_open,
    .get_address = tcp_get_address,
    .connect = tcp_connect,
    .send = tcp_send,
    .send_control = tcp_send_control,
    .progress = tcp_progress,
    .release_recv = NULL,
    .format_address = tcp_format_address,
    .closing = mr__substrate_closing,
    .stats = mr__substrate_stats,
    .close = tcp_close,
};

MR__SUBSTRATE_ENTRY(tcp_ops)
