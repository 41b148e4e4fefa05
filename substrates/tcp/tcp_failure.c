/*
 * Failures of connections, established or being dialled: closing them and
 * queueing the failure where it happens, and reporting it to the core in the
 * next progress call.
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Failing a connection.                                                    */

/*
 * Closes a connection, established or being dialled (its handshake place,
 * if it held one, goes back to the connector), after a failure and queues
 * the failure for the next progress call, which runs the upcalls.
 * Idempotent.
 */
void tcp__conn_fail(mr_substrate_t *s, tcp_conn_t *c, mr_status_t why)
{
    if (c->state != C_ESTABLISHED && !conn_dialing(c)) return;
    if (c->state == C_ESTABLISHED) s->nestablished--;
    if (conn_handshaking(c)) tcp__dial_place_free(s);
    tcp__close_fd(s, &c->fd, &c->registered);
    c->state = C_FAILED;
    c->interest = 0;
    if (why == MR_ERR_PROTOCOL) s->base.rejected++;
    mr__failq_push(&s->failq, c->rank, why);
}

/* The core gave up on `rank`: its connection closed, its queued sends completed next. */
void tcp__abandon(mr_substrate_t *s, int rank)
{
    if (rank < 0 || rank >= s->base.size || rank == s->base.rank) return;
    tcp__conn_fail(s, &s->conns[rank], MR_ERR_PEER_FAILED);
}

void tcp__conn_fail_errno(mr_substrate_t *s, tcp_conn_t *c, int err, const char *what)
{
    char a[40];

    if (c->state != C_ESTABLISHED) return;
    if (s->base.closing && !conn_has_output(c) && c->rx_phase == RX_HEADER &&
        c->rx_end == c->rx_start) {
        /* Every rank is finalizing: an orderly close, between frames, with nothing owed. */
        MR__LOG(s, MR_LOG_DEBUG, "TCP substrate: rank %d (%s) closed its connection while "
                "finalizing (%s).", c->rank, tcp__sin_str(&c->addr, a, sizeof(a)),
                err ? strerror(err) : "end of stream");
        tcp__close_fd(s, &c->fd, &c->registered);
        c->interest = 0;
        c->state = C_CLOSED;
        s->nestablished--;
        return;
    }
    if (err == 0) {
        MR__LOG(s, MR_LOG_WARN,
                "TCP substrate: rank %d (%s) closed its connection (end of stream%s).",
                c->rank, tcp__sin_str(&c->addr, a, sizeof(a)),
                c->rx_phase != RX_HEADER || c->rx_end > c->rx_start ? " in the middle of a frame"
                                                                 : "");
    } else {
        MR__LOG(s, MR_LOG_WARN,
                "TCP substrate: the connection to rank %d (%s) failed while %s: %s.", c->rank,
                tcp__sin_str(&c->addr, a, sizeof(a)), what, strerror(err));
    }
    if (err == ETIMEDOUT) tcp__conn_timed_out(s, c);
    tcp__conn_fail(s, c, MR_ERR_PEER_FAILED);
}

/* ------------------------------------------------------------------------ */
/* Upcall drains (progress() only).                                         */

/* Forgets what was half read from the connection; the core hears of the failure. */
static mr__fail_verdict_t conn_fail_begin(mr_substrate_t *s, int rank, mr_status_t why)
{
    tcp_conn_t *c = &s->conns[rank];

    (void)why;
    if (c->rx_slot != NULL) {
        void *slot = c->rx_slot;
        c->rx_slot = NULL;
        s->base.up.recv_slot_abandon(s->base.core, slot);
    }
    c->rx_phase = RX_HEADER;
    c->rx_start = c->rx_end = 0;
    c->ctrl_count = 0;
    c->ctrl_off = 0;
    c->hs_off = c->hs_out = 0;
    return MR__FAIL_REPORT;
}

/* Completes every queued send, so that the core gets its buffers back. */
static int conn_fail_end(mr_substrate_t *s, int rank)
{
    tcp_conn_t *c = &s->conns[rank];
    tcp_req_t *r;
    int n = 0;

    while ((r = c->sq_head) != NULL) {
        void *cookie = r->link.cookie;
        c->sq_head = r->sq_next;
        if (c->sq_head == NULL) c->sq_tail = NULL;
        c->sq_off = 0;
        tcp__req_free(s, r);
        s->base.up.send_complete(s->base.core, cookie);
        n++;
    }
    return n;
}

static const mr__fail_ops_t tcp_fail_ops = {
    .begin = conn_fail_begin,
    .end = conn_fail_end,
};

int tcp__drain_failed(mr_substrate_t *s)
{
    return mr__failq_drain(s, &s->failq, &tcp_fail_ops);
}
