/*
 * The TCP substrate's input: reading frames from established connections and
 * delivering them to the core, and the list of connections to read again in
 * the next progress call (budget spent, or waiting for a receive slot).
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------------ */
/* Input.                                                                   */

/* Puts a connection on the retry list: the next progress call reads it again. */
static void rx_list_push(mr_substrate_t *s, tcp_conn_t *c)
{
    if (c->on_rx_list) return;
    c->on_rx_list = true;
    c->rx_next = NULL;
    if (s->rx_tail != NULL) s->rx_tail->rx_next = c;
    else s->rx_head = c;
    s->rx_tail = c;
}

static void conn_protocol_error(mr_substrate_t *s, tcp_conn_t *c, const tcp_wire_error_t *err)
{
    char a[40];

    MR__LOG(s, MR_LOG_ERROR,
            "TCP substrate: rank %d (%s) broke the frame protocol (%s: %lld); closing its "
            "connection.",
            c->rank, tcp__sin_str(&c->addr, a, sizeof(a)), err->what, err->value);
    tcp__conn_fail(s, c, MR_ERR_PROTOCOL);
}

/* Handles a recv() result that is not a positive count; false: stop reading. */
static bool conn_read_error(mr_substrate_t *s, tcp_conn_t *c, ssize_t n)
{
    if (n == 0) {
        tcp__conn_fail_errno(s, c, 0, "receiving");
        return false;
    }
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    tcp__conn_fail_errno(s, c, errno, "receiving");
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
                    tcp__conn_update_interest(s, c);
                }
                rx_list_push(s, c);
                break;
            }
            c->rx_slot = slot;
            c->rx_phase = RX_PAYLOAD;
            if (c->rx_paused) {
                c->rx_paused = false;
                tcp__conn_update_interest(s, c);
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
int tcp__conn_event(mr_substrate_t *s, tcp_conn_t *c, uint32_t ev)
{
    int frames = 0;

    if ((ev & EPOLLOUT) || ((ev & (EPOLLERR | EPOLLHUP)) && conn_has_output(c))) {
        tcp__conn_flush(s, c);
    }
    if (c->state == C_ESTABLISHED && !c->rx_paused && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
        frames = conn_read(s, c);
    }
    return frames;
}

/* ------------------------------------------------------------------------ */
/* The retry list (progress() only).                                        */

int tcp__retry_rx(mr_substrate_t *s)
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
bool tcp__rx_list_busy(const mr_substrate_t *s)
{
    for (const tcp_conn_t *c = s->rx_head; c != NULL; c = c->rx_next) {
        if (!c->rx_paused && c->state == C_ESTABLISHED) return true;
    }
    return false;
}

/*
 * The data messages read from the sockets that wait for a receive slot: on a
 * connection paused for want of one (on the retry list), the frame whose
 * header was parsed and the whole headers in the read-ahead behind it.
 */
uint64_t tcp__held(mr_substrate_t *s)
{
    uint64_t held = 0;

    for (const tcp_conn_t *c = s->rx_head; c != NULL; c = c->rx_next) {
        size_t at = c->rx_start;
        tcp_wire_frame_t f;
        tcp_wire_error_t err;

        /* Stopped by the budget instead, it waits for the next progress, not a slot. */
        if (c->state != C_ESTABLISHED || c->rx_phase != RX_SLOT) continue;
        /* Its payload comes first in the read-ahead. */
        held++;
        if (c->rx_end - at < c->rx_frame.length) continue;
        at += c->rx_frame.length;
        while (tcp_wire_frame_decode(c->rxbuf + at, c->rx_end - at, s->base.datagram_size, &f,
                                     &err) == MR_OK) {
            at += TCP_HDR_LEN;
            if (f.channel != TCP_WIRE_CH_DATA) continue;
            held++;
            if (c->rx_end - at < f.length) break;
            at += f.length;
        }
    }
    return held;
}
