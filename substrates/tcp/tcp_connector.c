/*
 * Outgoing connections (connect() only): an attempt to connect to a peer, the
 * connector's side of the handshake (read the acceptor's nonce, write the
 * AUTH message) and the back-off before another attempt.
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------------ */
/* Outgoing connections (connect() only).                                   */

static void connector_retry(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what)
{
    char a[40];
    uint64_t backoff = (uint64_t)TCP_RETRY_MS * (c->attempts < 10 ? c->attempts : 10);

    tcp__close_fd(s, &c->fd, &c->registered);
    c->interest = 0;
    c->state = C_RETRY;
    c->last_err = err;
    c->retry_at = mr__now_ns() + backoff * MR_NS_PER_MS;
    MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: attempt %u to connect to rank %d (%s) failed while "
            "%s: %s; retrying.", c->attempts, c->rank, tcp__sin_str(&c->addr, a, sizeof(a)), what,
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
    tcp__conn_established(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: connected to rank %d at %s.", c->rank,
                tcp__sin_str(&c->addr, a, sizeof(a)));
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
    }
}

/* Starts one connection attempt; false on a local failure. */
bool tcp__connector_start(mr_substrate_t *s, tcp_conn_t *c)
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
        if (tcp__conn_set_interest(s, c, EPOLLIN) != 0) connector_retry(s, c, errno, "connecting");
        return true;
    }
    if (errno != EINPROGRESS && errno != EINTR) {
        connector_retry(s, c, errno, "connecting");
        return true;
    }
    c->state = C_CONNECTING;
    if (tcp__conn_set_interest(s, c, EPOLLOUT) != 0) connector_retry(s, c, errno, "connecting");
    return true;
}
