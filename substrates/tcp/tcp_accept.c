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

static void listener_watch(mr_substrate_t *s, bool on);

/* Closes an incoming connection's descriptor, if it still has it, and frees its place. */
static void pending_free(mr_substrate_t *s, tcp_pending_t *p)
{
    tcp__close_fd(s, &p->fd, &p->registered);
    p->interest = 0;
    s->npending--;
    /* The listener rested while every place was taken: connections wait in its backlog. */
    if (s->listen_full && s->listen_resume_at == 0) {
        s->listen_full = false;
        listener_watch(s, true);
    }
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
    pending_free(s, p);
}

static int pending_set_interest(mr_substrate_t *s, tcp_pending_t *p, uint32_t want)
{
    return tcp__set_interest(s, p->fd, TAG(TAG_PENDING, p->gen, (uint32_t)(p - s->pending)),
                             &p->registered, &p->interest, want);
}

/* An authenticated connection, made or accepted, starts carrying frames. */
void tcp__conn_established(mr_substrate_t *s, tcp_conn_t *c)
{
    c->state = C_ESTABLISHED;
    c->rx_phase = RX_HEADER;
    c->rx_start = c->rx_end = 0;
    s->nestablished++;
    tcp__conn_bound_silence(s, c);
    /* Until connect() returns, nothing is read: no upcall may run outside progress(). */
    if (s->connected) {
        tcp__conn_update_interest(s, c);
    } else {
        tcp__conn_set_interest(s, c, 0);
    }
}

/*
 * Whether an authenticated incoming connection from c->rank is taken. When
 * both ranks of a pair dial each other at once, the lower rank's connection
 * is kept: a higher acceptor gives its own attempt up, a lower one closes
 * the incoming connection, whose connector then sees it closed before the
 * ACCEPT and retries, and meanwhile takes the lower rank's connection.
 */
static bool pending_wins(const mr_substrate_t *s, const tcp_conn_t *c)
{
    if (c->state == C_NONE || c->state == C_QUEUED || c->state == C_RETRY) return true;
    if (conn_handshaking(c)) return c->rank < s->base.rank;
    return false;
}

/* Moves the descriptor of a verified connection to its rank's slot, and accepts it. */
static void pending_adopt(mr_substrate_t *s, tcp_pending_t *p, tcp_conn_t *c)
{
    if (conn_dialing(c)) tcp__connector_abandon(s, c);
    if (tcp__conn_buffers(s, c) != MR_OK) {
        pending_drop(s, p, "this rank has no memory for its buffers");
        return;
    }
    tcp__set_interest(s, p->fd, 0, &p->registered, &p->interest, 0);
    c->fd = p->fd;
    c->gen++;
    c->registered = false;
    c->interest = 0;
    p->fd = -1;
    pending_free(s, p);
    if (!s->connect_started) {
        /* Not expected: connect() fills in the advertised address; use the source. */
        c->addr = p->peer;
    }
    /* The ACCEPT goes out first, ahead of any frame (tcp__conn_flush). */
    tcp_wire_accept_encode(c->hs, s->key, p->nonce, c->rank, s->base.rank);
    c->hs_off = 0;
    c->hs_out = TCP_WIRE_ACCEPT_LEN;
    tcp__conn_established(s, c);
    tcp__conn_flush(s, c);
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        char a[40];
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d connected from %s and authenticated.",
                c->rank, tcp__sin_str(&p->peer, a, sizeof(a)));
    }
}

static void pending_verify(mr_substrate_t *s, tcp_pending_t *p)
{
    int32_t rank = -1;
    tcp_wire_error_t err;
    tcp_conn_t *c;
    mr_status_t st = tcp_wire_auth_verify(p->auth, p->auth_got, s->key, p->nonce, s->base.rank,
                                          s->base.size, &rank, &err);

    if (st != MR_OK) {
        switch (st == MR_AGAIN ? TCP_WIRE_TRUNCATED : err.fault) {
        case TCP_WIRE_BAD_RANK:
            pending_drop(s, p, "it claims rank %lld, which is not another rank of this job of "
                         "%d", err.value, s->base.size);
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
    if (pending_wins(s, c)) {
        pending_adopt(s, p, c);
    } else if (conn_handshaking(c) || (c->state == C_ESTABLISHED && rank > s->base.rank)) {
        /*
         * Both dialled; ours wins (we are the lower rank), and the peer takes
         * it, or already took it while its own AUTH was on the way.
         */
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d dialled while this rank was dialling "
                "it; this rank's connection is kept.", (int)rank);
        pending_free(s, p);
    } else {
        pending_drop(s, p, "it claims rank %d, whose connection %s", (int)rank,
                     c->state == C_ESTABLISHED ? "is already established" : "has failed or closed");
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
        if (n == 0 && p->auth_got == 0) {
            /* Not a word: a rank that gave its attempt up for ours, or a port scan. */
            pending_free(s, p);
            return;
        }
        if (n == 0) {
            pending_drop(s, p, "it closed the connection in the middle of its AUTH message");
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (p->auth_got == 0) {
                /* A rank that gave its attempt up for ours closed with our nonce unread. */
                pending_free(s, p);
                return;
            }
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
        if (p->deadline <= now && p->auth_got == 0) {
            /*
             * Not a word: a rank of the job that dialled and then stayed away
             * from MailRail (it dials again), or an idle stranger. Harmless.
             */
            MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: closed a silent incoming connection after "
                    "%llu s.", (unsigned long long)s->cfg.auth_timeout_s);
            pending_free(s, p);
        } else if (p->deadline <= now) {
            pending_drop(s, p, "it did not finish authenticating within %llu s",
                         (unsigned long long)s->cfg.auth_timeout_s);
        } else if (p->deadline < next) {
            next = p->deadline;
        }
    }
    return next;
}

/* ------------------------------------------------------------------------ */
/* The listener.                                                            */

/* Watches the listener for connections, or stops (they wait in its backlog). */
static void listener_watch(mr_substrate_t *s, bool on)
{
    bool reg = s->listen_registered;
    uint32_t interest = reg ? EPOLLIN : 0;

    tcp__set_interest(s, s->lfd, TAG(TAG_LISTEN, 0, 0), &reg, &interest, on ? EPOLLIN : 0);
    s->listen_registered = reg;
}

static void listener_pause(mr_substrate_t *s, uint64_t now)
{
    listener_watch(s, false);
    s->listen_resume_at = now + TCP_LISTEN_PAUSE_MS * MR_NS_PER_MS;
}

void tcp__listener_maybe_resume(mr_substrate_t *s, uint64_t now)
{
    if (s->listen_resume_at == 0 || now < s->listen_resume_at) return;
    if (s->listen_full) {
        /* Rested after running out of descriptors, and every place is still taken. */
        s->listen_resume_at = 0;
        return;
    }
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

        for (unsigned k = 0; k < TCP_MAX_PENDING && s->npending < TCP_MAX_PENDING; k++) {
            if (s->pending[k].fd < 0) {
                p = &s->pending[k];
                break;
            }
        }
        if (p == NULL) {
            /* Every place is taken: the rest wait in the backlog until one is free. */
            s->listen_full = true;
            listener_watch(s, false);
            return;
        }
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
