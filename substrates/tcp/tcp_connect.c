/*
 * The TCP substrate's connect(): rank i connects to every rank j > i and
 * accepts a connection from every rank j < i, driving the epoll set until
 * all are established or the timeout passes, when it logs who is missing.
 */
#include "tcp_substrate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

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
        tcp__sin_str(&c->addr, a, sizeof(a));
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

mr_status_t tcp__connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
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
                if (!tcp__connector_start(s, c)) return MR_ERR_TRANSPORT;
            }
        }
        tcp__pending_expire(s, now);
        tcp__listener_maybe_resume(s, now);
        n = epoll_wait(s->epfd, evs, TCP_MAX_EVENTS, TCP_CONNECT_POLL_MS);
        if (n < 0) {
            if (errno == EINTR) continue;
            MR__LOG(s, MR_LOG_ERROR, "TCP substrate: epoll_wait failed: %s.", strerror(errno));
            return MR_ERR_TRANSPORT;
        }
        for (int i = 0; i < n; i++) tcp__dispatch(s, &evs[i]);
    }
    s->connected = true;
    for (int r = 0; r < s->base.size; r++) {
        if (s->conns[r].state == C_ESTABLISHED) tcp__conn_update_interest(s, &s->conns[r]);
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d connected to its %d peers in %.3f s.",
                s->base.rank, s->base.size - 1, (double)(mr__now_ns() - start) / 1e9);
    }
    return MR_OK;
}
