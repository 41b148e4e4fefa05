/*
 * Outgoing connections. A rank dials a peer when its first message or credit
 * to it leaves (or when the core asks it to watch that peer): at most
 * TCP_MAX_DIALS handshakes run at once and the rest queue, so that a rank
 * that starts talking to thousands of peers neither floods them nor runs out
 * of ports. An attempt that fails is retried after a back-off; when the
 * peer's host still takes no connection MAILRAIL_TIMEOUT after the first
 * attempt, the peer has failed. The connector's side of the handshake reads the
 * acceptor's nonce, writes its AUTH message and reads the acceptor's ACCEPT,
 * which proves that it reached that rank of this job; a connection closed
 * before the ACCEPT (the acceptor kept its own connection to us, see
 * tcp_accept.c) is simply retried.
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------------ */
/* Buffers, and the list of connections being dialled.                      */

mr_status_t tcp__conn_buffers(mr_substrate_t *s, tcp_conn_t *c)
{
    uint8_t *b;

    if (c->rxbuf != NULL) return MR_OK;
    b = malloc(TCP_RXBUF_LEN + TCP_CTRL_RING * TCP_HDR_LEN);
    if (b == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: out of memory for the buffers of the "
                "connection to rank %d.", c->rank);
        return MR_ERR_NO_MEMORY;
    }
    c->rxbuf = b;
    c->ctrl = b + TCP_RXBUF_LEN;
    return MR_OK;
}

static void dial_list_push(mr_substrate_t *s, tcp_conn_t *c)
{
    if (c->on_dial_list) return;
    c->on_dial_list = true;
    c->dial_next = NULL;
    if (s->dial_tail != NULL) s->dial_tail->dial_next = c;
    else s->dial_head = c;
    s->dial_tail = c;
}

/* A handshake place is free again: the list gets a look at the next progress call. */
void tcp__dial_place_free(mr_substrate_t *s)
{
    s->ndials--;
    s->dial_check_at = 0;
}

/* ------------------------------------------------------------------------ */
/* One attempt.                                                             */

/*
 * A failed attempt is retried after a back-off, until the deadline. But a
 * refusal means that the peer's host is up and nothing listens on the
 * peer's port: the listener lives from open to close, and addresses are
 * published only once it listens, so its rank died (or left the job).
 * TCP_REFUSALS_FAILED refusals in a row make the peer failed at once;
 * waiting for the deadline instead held a notice to a killed rank, and
 * with it every survivor's news, for MAILRAIL_TIMEOUT (chaos
 * kill-tcp-node).
 */
static void connector_retry(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what)
{
    char a[40];
    uint64_t backoff = (uint64_t)TCP_RETRY_MS * (c->attempts < 10 ? c->attempts : 10);

    c->refusals = err == ECONNREFUSED ? c->refusals + 1 : 0;
    if (c->refusals >= TCP_REFUSALS_FAILED) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: rank %d (%s) refused %u connections in a row: "
                "its host is up but the rank does not listen any more.", c->rank,
                tcp__sin_str(&c->addr, a, sizeof(a)), c->refusals);
        tcp__conn_fail(s, c, MR_ERR_PEER_FAILED); /* Gives the place back too. */
        return;
    }
    if (conn_handshaking(c)) tcp__dial_place_free(s);
    tcp__close_fd(s, &c->fd, &c->registered);
    c->interest = 0;
    c->state = C_RETRY;
    c->last_err = err;
    c->retry_at = mr__now_ns() + backoff * MR_NS_PER_MS;
    if (c->retry_at < s->dial_check_at) s->dial_check_at = c->retry_at;
    MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: attempt %u to connect to rank %d (%s) failed while "
            "%s: %s; retrying.", c->attempts, c->rank, tcp__sin_str(&c->addr, a, sizeof(a)), what,
            err ? strerror(err) : "connection closed by the peer");
}

void tcp__connector_abandon(mr_substrate_t *s, tcp_conn_t *c)
{
    if (conn_handshaking(c)) tcp__dial_place_free(s);
    tcp__close_fd(s, &c->fd, &c->registered);
    c->interest = 0;
    c->state = C_NONE;
}

/* Reads the acceptor's ACCEPT; once it is genuine, the connection is established. */
static void connector_read_accept(mr_substrate_t *s, tcp_conn_t *c)
{
    tcp_wire_error_t err;

    while (c->hs_off < TCP_WIRE_ACCEPT_LEN) {
        /* Exactly the ACCEPT message: the frames after it are read once established. */
        ssize_t n = recv(c->fd, c->hs + c->hs_off, TCP_WIRE_ACCEPT_LEN - c->hs_off, 0);
        if (n == 0) {
            connector_retry(s, c, 0, "waiting to be accepted");
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            connector_retry(s, c, errno, "waiting to be accepted");
            return;
        }
        c->hs_off += (size_t)n;
    }
    if (tcp_wire_accept_verify(c->hs, c->hs_off, s->key, c->nonce, s->base.rank, c->rank,
                               &err) != MR_OK) {
        char a[40];
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: %s answered as if it were rank %d of another "
                "job (%s: %lld); retrying.", tcp__sin_str(&c->addr, a, sizeof(a)), c->rank,
                err.what, err.value);
        connector_retry(s, c, EPROTO, "checking the acceptor");
        return;
    }
    tcp__dial_place_free(s);
    c->hs_off = c->hs_out = 0;
    tcp__conn_established(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: connected to rank %d at %s.", c->rank,
                tcp__sin_str(&c->addr, a, sizeof(a)));
    }
}

/* Writes the connector's AUTH, then waits for the ACCEPT. */
static void connector_send_auth(mr_substrate_t *s, tcp_conn_t *c)
{
    while (c->hs_off < TCP_AUTH_LEN) {
        ssize_t n = send(c->fd, c->hs + c->hs_off, TCP_AUTH_LEN - c->hs_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (tcp__conn_set_interest(s, c, EPOLLOUT) != 0) {
                    connector_retry(s, c, errno, "waiting to authenticate");
                }
                return;
            }
            connector_retry(s, c, errno, "authenticating");
            return;
        }
        c->hs_off += (size_t)n;
    }
    c->state = C_ACCEPT;
    c->hs_off = 0;
    if (tcp__conn_set_interest(s, c, EPOLLIN) != 0) {
        connector_retry(s, c, errno, "waiting to be accepted");
        return;
    }
    connector_read_accept(s, c);
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
    memcpy(c->nonce, c->hs, TCP_NONCE_LEN);
    tcp_wire_auth_encode(c->hs, s->key, c->nonce, s->base.rank, c->rank);
    c->hs_off = 0;
    c->state = C_AUTH;
    connector_send_auth(s, c);
}

void tcp__connector_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev)
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
        if (tcp__conn_set_interest(s, c, EPOLLIN) != 0) {
            connector_retry(s, c, errno, "connecting");
            return;
        }
    }
    if (c->state == C_NONCE) {
        connector_read_nonce(s, c);
    } else if (c->state == C_AUTH) {
        connector_send_auth(s, c);
    } else if (c->state == C_ACCEPT) {
        connector_read_accept(s, c);
    }
}

/* Starts one connection attempt, which takes a handshake place. */
static void connector_start(mr_substrate_t *s, tcp_conn_t *c)
{
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    s->ndials++;
    c->state = C_CONNECTING;
    c->attempts++;
    c->hs_off = c->hs_out = 0;
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        /* Waiting would not help: this rank holds as many connections as it may. */
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: no descriptor left to connect to rank %d (%s): "
                "this rank talks to more peers than its descriptor limit allows; raise ulimit "
                "-n (and -Hn) to about %d.", c->rank, strerror(errno),
                s->base.size + TCP_MAX_PENDING + TCP_SPARE_FDS);
        tcp__conn_fail(s, c, MR_ERR_TRANSPORT); /* Gives the place back too. */
        return;
    }
    if (fd < 0) {
        connector_retry(s, c, errno, "creating a socket");
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->gen++;
    c->registered = false;
    c->interest = 0;
    if (connect(fd, (const struct sockaddr *)&c->addr, sizeof(c->addr)) == 0) {
        c->state = C_NONCE;
        if (tcp__conn_set_interest(s, c, EPOLLIN) != 0) connector_retry(s, c, errno, "connecting");
        return;
    }
    if (errno != EINPROGRESS && errno != EINTR) {
        connector_retry(s, c, errno, "connecting");
        return;
    }
    if (tcp__conn_set_interest(s, c, EPOLLOUT) != 0) connector_retry(s, c, errno, "connecting");
}

/* ------------------------------------------------------------------------ */
/* Dialling on first use, and the timers.                                   */

mr_status_t tcp__conn_dial(mr_substrate_t *s, tcp_conn_t *c)
{
    mr_status_t st;

    if (c->state != C_NONE) return MR_OK;
    st = tcp__conn_buffers(s, c);
    if (st != MR_OK) return st;
    c->attempts = 0;
    c->refusals = 0;
    c->last_err = 0;
    c->dial_deadline = s->base.timeout_s ? mr__now_ns() + (uint64_t)s->base.timeout_s * MR_NS_PER_S
                                         : UINT64_MAX;
    /* Its host fell silent (tcp_liveness.c): one attempt, given up at the next look. */
    if (c->host_silent) c->dial_deadline = mr__now_ns();
    dial_list_push(s, c);
    if (s->ndials < TCP_MAX_DIALS) {
        connector_start(s, c);
    } else {
        c->state = C_QUEUED;
        s->dial_check_at = 0;
    }
    return MR_OK;
}

/*
 * Whether the peer's host has not taken a TCP connection from us (yet): only
 * then does the deadline run out. A peer whose kernel took the connection is
 * alive, and may just be busy elsewhere than in MailRail for a while; its
 * death would close the connection, and the next attempt would be refused.
 */
static bool conn_unanswered(const tcp_conn_t *c)
{
    return c->state == C_RETRY || c->state == C_CONNECTING;
}

/* The peer could not be reached by its deadline: it has failed. */
static void connector_give_up(mr_substrate_t *s, tcp_conn_t *c)
{
    char a[40];

    if (c->host_silent) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: rank %d (%s) is not dialled any longer: its "
                "host answered nothing for %u s (MAILRAIL_TIMEOUT) on another rank's "
                "connection.", c->rank, tcp__sin_str(&c->addr, a, sizeof(a)),
                s->base.timeout_s);
    } else {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: rank %d (%s) could not be reached within %u s "
                "(MAILRAIL_TIMEOUT) in %u attempts%s%s.", c->rank,
                tcp__sin_str(&c->addr, a, sizeof(a)), s->base.timeout_s, c->attempts,
                c->last_err ? "; the last failed with: " : "",
                c->last_err ? strerror(c->last_err) : "");
    }
    tcp__conn_fail(s, c, MR_ERR_PEER_FAILED);
}

uint64_t tcp__dials_run(mr_substrate_t *s, uint64_t now)
{
    tcp_conn_t *c = s->dial_head, *keep_head = NULL, *keep_tail = NULL;
    uint64_t next = UINT64_MAX;

    s->dial_head = s->dial_tail = NULL;
    while (c != NULL) {
        tcp_conn_t *following = c->dial_next;

        c->on_dial_list = false;
        c->dial_next = NULL;
        if (conn_unanswered(c) && now >= c->dial_deadline) {
            connector_give_up(s, c);
        } else if ((c->state == C_QUEUED || (c->state == C_RETRY && c->retry_at <= now)) &&
                   s->ndials < TCP_MAX_DIALS) {
            connector_start(s, c);
        }
        if (conn_dialing(c)) {
            /* Still dialling: it stays on the list, in its order. */
            c->on_dial_list = true;
            if (keep_tail != NULL) keep_tail->dial_next = c;
            else keep_head = c;
            keep_tail = c;
            if (conn_unanswered(c) && c->dial_deadline < next) next = c->dial_deadline;
            if (c->state == C_RETRY && c->retry_at < next) next = c->retry_at;
        }
        c = following;
    }
    /* Dials started during the walk (none: the list was detached) go after the kept ones. */
    if (keep_head != NULL) {
        keep_tail->dial_next = s->dial_head;
        s->dial_head = keep_head;
        if (s->dial_tail == NULL) s->dial_tail = keep_tail;
    }
    /*
     * Queued attempts wait for a place; tcp__dial_place_free() asks for the next
     * look. A place freed late in this walk may already serve one.
     */
    for (c = keep_head; c != NULL && s->ndials < TCP_MAX_DIALS; c = c->dial_next) {
        if (c->state == C_QUEUED) next = 0;
    }
    s->dial_check_at = next;
    return next;
}
