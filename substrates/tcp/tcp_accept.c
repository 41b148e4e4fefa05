/*
 * Incoming connections and their authentication: the listener, connections
 * accepted but not yet authenticated (the acceptor's side of the handshake:
 * send the nonce, check the AUTH message), strangers dropped and logged, and
 * an authenticated connection becoming established.
 */
#include "mr_random.h"
#include "tcp_substrate.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

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
                tcp__sin_str(&p->peer, a, sizeof(a)), why);
    }
    s->base.rejected++;
    tcp__close_fd(s, &p->fd, &p->registered);
    p->interest = 0;
    s->npending--;
}

static int pending_set_interest(mr_substrate_t *s, tcp_pending_t *p, uint32_t want)
{
    return tcp__set_interest(s, p->fd, TAG(TAG_PENDING, p->gen, (uint32_t)(p - s->pending)),
                             &p->registered, &p->interest, want);
}

/* Moves the descriptor of a verified connection to its rank's slot. */
void tcp__conn_established(mr_substrate_t *s, tcp_conn_t *c)
{
    c->state = C_ESTABLISHED;
    c->rx_phase = RX_HEADER;
    c->rx_start = c->rx_end = 0;
    s->nestablished++;
    /* Until connect() returns, nothing is read: no upcall may run outside progress(). */
    if (s->connected) {
        tcp__conn_update_interest(s, c);
    } else {
        tcp__conn_set_interest(s, c, 0);
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
    tcp__set_interest(s, p->fd, 0, &p->registered, &p->interest, 0);
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
    tcp__conn_established(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d connected from %s and authenticated.",
                c->rank, tcp__sin_str(&p->peer, a, sizeof(a)));
    }
}

void tcp__pending_event(mr_substrate_t *s, tcp_pending_t *p, uint32_t ev)
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

/* Drops strangers whose time to authenticate is up; returns the next deadline. */
uint64_t tcp__pending_expire(mr_substrate_t *s, uint64_t now)
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
/* The listener.                                                            */

static void listener_pause(mr_substrate_t *s, uint64_t now)
{
    bool reg = s->listen_registered;
    uint32_t interest = EPOLLIN;

    tcp__set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, 0);
    s->listen_registered = reg;
    s->listen_resume_at = now + TCP_LISTEN_PAUSE_MS * MR_NS_PER_MS;
}

void tcp__listener_maybe_resume(mr_substrate_t *s, uint64_t now)
{
    if (s->listen_resume_at == 0 || now < s->listen_resume_at) return;
    bool reg = s->listen_registered;
    uint32_t interest = 0;
    if (tcp__set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, EPOLLIN) == 0) {
        s->listen_resume_at = 0;
    } else {
        s->listen_resume_at = now + TCP_LISTEN_PAUSE_MS * MR_NS_PER_MS;
    }
    s->listen_registered = reg;
}

void tcp__listener_event(mr_substrate_t *s)
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
                        tcp__sin_str(&sa, a, sizeof(a)), TCP_MAX_PENDING);
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
