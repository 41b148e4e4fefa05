/*
 * The TCP substrate's epoll set: the events each descriptor is watched for,
 * and the dispatch of what epoll reports to the listener, to connections
 * authenticating and to peers. Also tcp__sin_str(), addresses for the log.
 */
#include "tcp_substrate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Addresses for the log.                                                   */

/* "a.b.c.d:port" into buf (at least 24 bytes). */
const char *tcp__sin_str(const struct sockaddr_in *sin, char *buf, size_t len)
{
    char ip[INET_ADDRSTRLEN];

    if (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip)) == NULL) snprintf(ip, sizeof(ip), "?");
    snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sin->sin_port));
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Interest in the epoll set.                                               */

int tcp__set_interest(mr_substrate_t *s, int fd, uint64_t tag, bool *registered,
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

int tcp__conn_set_interest(mr_substrate_t *s, tcp_conn_t *c, uint32_t want)
{
    return tcp__set_interest(s, c->fd, TAG(TAG_PEER, c->gen, c->rank), &c->registered,
                             &c->interest, want);
}

/* Brings an established connection's epoll interest in line with its state. */
void tcp__conn_update_interest(mr_substrate_t *s, tcp_conn_t *c)
{
    uint32_t want = 0;
    int err;

    if (c->state != C_ESTABLISHED) return;
    if (s->connected) {
        if (!c->rx_paused) want |= EPOLLIN;
        if (conn_has_output(c)) want |= EPOLLOUT;
    }
    err = tcp__conn_set_interest(s, c, want);
    if (err != 0) {
        MR__LOG(s, MR_LOG_ERROR, "TCP substrate: cannot watch the connection to rank %d: %s.",
                c->rank, strerror(-err));
        tcp__conn_fail(s, c, MR_ERR_PEER_FAILED);
    }
}

void tcp__close_fd(mr_substrate_t *s, int *fd, bool *registered)
{
    if (*fd < 0) return;
    if (*registered) epoll_ctl(s->epfd, EPOLL_CTL_DEL, *fd, NULL);
    *registered = false;
    close(*fd);
    *fd = -1;
}

/* ------------------------------------------------------------------------ */
/* Event dispatch.                                                          */

int tcp__dispatch(mr_substrate_t *s, const struct epoll_event *e)
{
    uint64_t tag = e->data.u64;
    unsigned type = (unsigned)(tag >> 56);
    uint32_t gen = (uint32_t)(tag >> 32) & 0xffffffu;
    uint32_t idx = (uint32_t)tag;

    switch (type) {
    case TAG_LISTEN:
        tcp__listener_event(s);
        return 0;
    case TAG_PENDING:
        if (idx < TCP_MAX_PENDING && s->pending[idx].fd >= 0 &&
            (s->pending[idx].gen & 0xffffffu) == gen) {
            tcp__pending_event(s, &s->pending[idx], e->events);
        }
        return 0;
    case TAG_WAKE:
        return 1; /* Flow control's wake-up: its owner drains it. */
    case TAG_PEER:
        if (idx < (uint32_t)s->base.size) {
            tcp_conn_t *c = &s->conns[idx];
            if (c->fd < 0 || (c->gen & 0xffffffu) != gen) return 0;
            if (c->state == C_ESTABLISHED) {
                return s->connected ? tcp__conn_event(s, c, e->events) : 0;
            }
            tcp__connector_event(s, c, e->events);
        }
        return 0;
    default:
        return 0;
    }
}
