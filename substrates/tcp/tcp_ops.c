/*
 * The TCP substrate's operations on an open substrate: send(), send_control(),
 * progress() and close(), and the ops table that the plugin exports.
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Sends.                                                                   */

/*
 * The connection to `dest`, dialled now if this is the first output to it,
 * or the status saying why there is none. Output to a connection that is
 * being dialled waits in its queues until it is established.
 */
static mr_status_t conn_for_send(mr_substrate_t *s, int dest, tcp_conn_t **out)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    tcp_conn_t *c = &s->conns[dest];
    if (c->state == C_FAILED || c->state == C_CLOSED) return MR_ERR_PEER_FAILED;
    if (!s->connected) return MR_ERR_INVALID_RANK;
    if (c->state == C_NONE) {
        st = tcp__conn_dial(s, c);
        if (st != MR_OK) return st;
    }
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
    if (kind < MR_KIND_DATA || kind > MR_KIND_HANDLER || (data == NULL && length > 0)) {
        return MR_ERR_INVALID_PARAM;
    }
    r = tcp__req_alloc(s);
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
    if (idle) tcp__conn_flush(s, c);
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
    if (idle) tcp__conn_flush(s, c);
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* Progress and close.                                                      */

static mr_status_t tcp_wake_fd(mr_substrate_t *s, int fd)
{
    /* Edge-triggered: a wake-up its owner has not read yet wakes once, not forever. */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = TAG(TAG_WAKE, 0, 0)};

    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        MR__LOG(s, MR_LOG_WARN, "TCP substrate: cannot watch wake-up descriptor %d: %s.", fd,
                strerror(errno));
        return MR_ERR_SYSTEM;
    }
    return MR_OK;
}

static int tcp_progress(mr_substrate_t *s, int timeout_ms)
{
    struct epoll_event evs[TCP_MAX_EVENTS];
    int events = 0, wait, n;
    uint64_t now, next;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    if (!mr__failq_empty(&s->failq)) events += tcp__drain_failed(s);
    events += mr__done_drain(s, &s->done, &s->free_reqs);
    events += tcp__retry_rx(s);

    now = mr__now_ns();
    tcp__listener_maybe_resume(s, now);
    next = tcp__pending_expire(s, now);
    if (s->listen_resume_at != 0 && s->listen_resume_at < next) next = s->listen_resume_at;
    if (s->nestablished > 0) {
        uint64_t silence = tcp__silence_check(s, now);
        if (silence < next) next = silence;
    }
    if (s->dial_head != NULL) {
        uint64_t dials = now >= s->dial_check_at ? tcp__dials_run(s, now) : s->dial_check_at;
        if (dials < next) next = dials;
    }

    wait = timeout_ms;
    if (events > 0 || !mr__done_empty(&s->done) || !mr__failq_empty(&s->failq) || tcp__rx_list_busy(s)) {
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
    for (int i = 0; i < n; i++) events += tcp__dispatch(s, &evs[i]);
    if (n > 0) tcp__pending_expire(s, mr__now_ns());

    if (!mr__failq_empty(&s->failq)) events += tcp__drain_failed(s);
    events += mr__done_drain(s, &s->done, &s->free_reqs);
    return events;
}

void tcp__close(mr_substrate_t *s)
{
    if (s == NULL) return;
    /* No upcalls here: queued sends and held slots go away with the core's pools. */
    if (s->conns != NULL) {
        for (int r = 0; r < s->base.size; r++) {
            if (s->conns[r].fd >= 0) close(s->conns[r].fd);
            free(s->conns[r].rxbuf);
        }
    }
    for (unsigned k = 0; k < TCP_MAX_PENDING; k++) {
        if (s->pending[k].fd >= 0) close(s->pending[k].fd);
    }
    if (s->lfd >= 0) close(s->lfd);
    if (s->epfd >= 0) close(s->epfd);
    free(s->conns);
    free(s->reqs);
    mr__failq_fini(&s->failq);
    free(s);
}

/* The connections established now, besides the counters every substrate keeps. */
static void tcp_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    mr__substrate_stats(s, stats);
    if (s != NULL) mr__stats_add_peers(stats, (uint64_t)s->nestablished);
}

/* ------------------------------------------------------------------------ */
/* The ops table.                                                           */

static const mr_substrate_ops_t tcp_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "tcp",
    .description = "TCP sockets: one authenticated connection per pair of ranks that talk, "
                   "made on first use, epoll-driven",
    .config_table = tcp__config_table,
    .config_size = sizeof(tcp_config_t),
    .open = tcp__open,
    .get_address = tcp__get_address,
    .connect = tcp__connect,
    .send = tcp_send,
    .send_control = tcp_send_control,
    .progress = tcp_progress,
    .release_recv = NULL,
    .format_address = tcp__format_address,
    .closing = mr__substrate_closing,
    .stats = tcp_stats,
    .close = tcp__close,
    .watch = tcp__watch,
    .wake_fd = tcp_wake_fd,
    .held = tcp__held,
    .preconnect = tcp__preconnect,
    .abandon = tcp__abandon,
};

MR__SUBSTRATE_ENTRY(tcp_ops)
