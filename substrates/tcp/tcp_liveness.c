/*
 * How long a silent peer goes unnoticed: MAILRAIL_TIMEOUT, and about a second.
 * A host that loses power, panics or drops off the network sends no FIN and
 * no RST; TCP on its own would retransmit to it for about 15 minutes
 * (tcp_retries2) and, on an idle connection, never notice at all. So:
 *
 *   - every established connection sends keepalive probes from half that
 *     idle time on, once a second, so that a live peer's kernel always
 *     answers something well within MAILRAIL_TIMEOUT;
 *   - once a second, a connection on which nothing at all arrived (no data,
 *     no acknowledgement: tcpi_last_data_recv, tcpi_last_ack_recv) for
 *     MAILRAIL_TIMEOUT fails with ETIMEDOUT, and its host counts as silent:
 *     the dials to other ranks of that address fail at once (their SYNs would
 *     go unanswered too), so that a lost host costs one timeout, not one per
 *     rank dialled after another (the ring of failure notices dials the next
 *     rank when one fails);
 *   - TCP_USER_TIMEOUT: data unacknowledged, or a zero window, for
 *     MAILRAIL_TIMEOUT ends the connection in the kernel. A peer whose kernel
 *     answers but whose process takes nothing at all for that long (stopped,
 *     or stuck outside MailRail) has failed too; its host does not count as
 *     silent.
 *
 * The failed connection is reported through tcp_failure.c, which names the
 * rank and the reason ("Connection timed out").
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

/* Linux's bounds on TCP_KEEPIDLE (MAX_TCP_KEEPIDLE) and TCP_KEEPCNT (MAX_TCP_KEEPCNT). */
#define TCP_KEEPIDLE_MAX_S 32767
#define TCP_KEEPCNT_MAX 127

void tcp__conn_bound_silence(mr_substrate_t *s, tcp_conn_t *c)
{
    unsigned t = s->base.timeout_s;
    int one = 1, intvl = 1;
    int idle = t / 2 > 0 ? (int)(t / 2) : 1;
    int count;
    unsigned int user_ms = t * 1000u;

    if (t == 0) return; /* No timeout: TCP's own bounds. */
    if (idle > TCP_KEEPIDLE_MAX_S) idle = TCP_KEEPIDLE_MAX_S;
    count = (int)t - idle + 1;
    if (count > TCP_KEEPCNT_MAX) count = TCP_KEEPCNT_MAX;
    if (setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms)) < 0 ||
        setsockopt(c->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) < 0 ||
        setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) < 0 ||
        setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) < 0 ||
        setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) < 0) {
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: cannot bound the silence of rank %d to %u s "
                "(MAILRAIL_TIMEOUT): %s; a lost host may go unnoticed.", c->rank, t,
                strerror(errno));
    }
}

/* Milliseconds since anything arrived on c's socket, or 0 when unknown. */
static uint32_t conn_silent_ms(const tcp_conn_t *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);

    memset(&ti, 0, sizeof(ti));
    if (c->fd < 0 || getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) return 0;
    return ti.tcpi_last_ack_recv < ti.tcpi_last_data_recv ? ti.tcpi_last_ack_recv
                                                          : ti.tcpi_last_data_recv;
}

/* Marks c's host silent: every rank of that address; their dials give up at once. */
static void host_silent(mr_substrate_t *s, const tcp_conn_t *c)
{
    uint64_t now = mr__now_ns();

    for (int r = 0; r < s->base.size; r++) {
        tcp_conn_t *o = &s->conns[r];
        if (o->addr.sin_addr.s_addr != c->addr.sin_addr.s_addr || o->host_silent) continue;
        o->host_silent = true;
        if (conn_dialing(o)) {
            o->dial_deadline = now;
            s->dial_check_at = now;
        }
    }
}

void tcp__conn_timed_out(mr_substrate_t *s, tcp_conn_t *c)
{
    if (s->base.timeout_s == 0) return;
    if (conn_silent_ms(c) + 1000u >= s->base.timeout_s * 1000u) host_silent(s, c);
}

uint64_t tcp__silence_check(mr_substrate_t *s, uint64_t now)
{
    uint32_t bound_ms = s->base.timeout_s * 1000u;

    if (s->base.timeout_s == 0) return UINT64_MAX;
    if (now < s->silence_check_at) return s->silence_check_at;
    s->silence_check_at = now + MR_NS_PER_S;
    for (int r = 0; r < s->base.size && s->nestablished > 0; r++) {
        tcp_conn_t *c = &s->conns[r];
        uint32_t ms;
        char a[40];

        if (c->state != C_ESTABLISHED || (ms = conn_silent_ms(c)) < bound_ms) continue;
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: nothing arrived from rank %d (%s) for %.1f s, "
                "not even an acknowledgement or a keepalive answer (MAILRAIL_TIMEOUT %u s): its "
                "host is silent.", c->rank, tcp__sin_str(&c->addr, a, sizeof(a)), ms / 1000.0,
                s->base.timeout_s);
        host_silent(s, c);
        tcp__conn_fail_errno(s, c, ETIMEDOUT, "waiting for its host");
    }
    return s->silence_check_at;
}
