/*
 * The TCP substrate's output: the pool of send requests, and the writing of
 * a connection's queued frames (data and control) with sendmsg().
 */
#include "tcp_substrate.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------------ */
/* Requests.                                                                */

tcp_req_t *tcp__req_alloc(mr_substrate_t *s)
{
    return (tcp_req_t *)(void *)mr__sreq_pop(&s->free_reqs);
}

void tcp__req_free(mr_substrate_t *s, tcp_req_t *r)
{
    r->data = NULL;
    mr__sreq_push(&s->free_reqs, &r->link);
}

/* ------------------------------------------------------------------------ */
/* Output.                                                                  */

/* Adds the unwritten part of a data frame, `off` bytes in, to iov. */
static int req_iov(const tcp_req_t *r, size_t off, struct iovec *iov, int n)
{
    if (off < TCP_HDR_LEN) {
        iov[n].iov_base = (void *)(r->hdr + off);
        iov[n].iov_len = TCP_HDR_LEN - off;
        n++;
        off = 0;
    } else {
        off -= TCP_HDR_LEN;
    }
    if (r->length > off) {
        iov[n].iov_base = (void *)((const uint8_t *)r->data + off);
        iov[n].iov_len = r->length - off;
        n++;
    }
    return n;
}

/* The head data request is fully written: it goes to the completion list. */
static void sq_complete_head(mr_substrate_t *s, tcp_conn_t *c)
{
    tcp_req_t *r = c->sq_head;

    c->sq_head = r->sq_next;
    if (c->sq_head == NULL) c->sq_tail = NULL;
    c->sq_off = 0;
    mr__done_push(&s->done, &r->link);
}

/* Accounts for `left` bytes written from the iovecs tcp__conn_flush gathered. */
static void conn_advance(mr_substrate_t *s, tcp_conn_t *c, size_t left)
{
    if (c->sq_off > 0) {
        size_t rem = TCP_HDR_LEN + c->sq_head->length - c->sq_off;
        if (left < rem) {
            c->sq_off += left;
            return;
        }
        left -= rem;
        sq_complete_head(s, c);
    }
    if (c->ctrl_count > 0) {
        size_t rem = (size_t)c->ctrl_count * TCP_HDR_LEN - c->ctrl_off;
        if (left < rem) {
            size_t consumed = c->ctrl_off + left;
            unsigned frames = (unsigned)(consumed / TCP_HDR_LEN);
            c->ctrl_head = (c->ctrl_head + frames) % TCP_CTRL_RING;
            c->ctrl_count -= frames;
            c->ctrl_off = consumed % TCP_HDR_LEN;
            return;
        }
        left -= rem;
        c->ctrl_head = 0;
        c->ctrl_count = 0;
        c->ctrl_off = 0;
    }
    while (left > 0 && c->sq_head != NULL) {
        size_t rem = TCP_HDR_LEN + c->sq_head->length;
        if (left < rem) {
            c->sq_off = left;
            return;
        }
        left -= rem;
        sq_complete_head(s, c);
    }
}

/* Writes what is left of an accepted connection's ACCEPT message; false: not all of it. */
static bool conn_flush_accept(mr_substrate_t *s, tcp_conn_t *c)
{
    while (c->hs_off < c->hs_out) {
        ssize_t w = send(c->fd, c->hs + c->hs_off, c->hs_out - c->hs_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                tcp__conn_fail_errno(s, c, errno, "accepting");
            }
            return false;
        }
        c->hs_off += (size_t)w;
    }
    c->hs_off = c->hs_out = 0;
    return true;
}

/*
 * Writes as much pending output as the socket takes: an accepted
 * connection's ACCEPT message first, then the rest of a partly written data
 * frame, every queued control frame, and data frames in FIFO order. Fails
 * the connection on a socket error.
 */
void tcp__conn_flush(mr_substrate_t *s, tcp_conn_t *c)
{
    if (c->state == C_ESTABLISHED && c->hs_out > 0 && !conn_flush_accept(s, c)) {
        tcp__conn_update_interest(s, c);
        return;
    }
    while (c->state == C_ESTABLISHED && conn_has_output(c)) {
        struct iovec iov[TCP_MAX_IOV];
        struct msghdr mh;
        tcp_req_t *r = c->sq_head;
        size_t total = 0;
        ssize_t w;
        int n = 0;

        if (r != NULL && c->sq_off > 0) {
            n = req_iov(r, c->sq_off, iov, n);
            r = r->sq_next;
        }
        if (c->ctrl_count > 0) {
            unsigned first = c->ctrl_head;
            unsigned span = TCP_CTRL_RING - first;
            if (span > c->ctrl_count) span = c->ctrl_count;
            iov[n].iov_base = c->ctrl + (size_t)first * TCP_HDR_LEN + c->ctrl_off;
            iov[n].iov_len = (size_t)span * TCP_HDR_LEN - c->ctrl_off;
            n++;
            if (c->ctrl_count > span) {
                iov[n].iov_base = c->ctrl;
                iov[n].iov_len = (size_t)(c->ctrl_count - span) * TCP_HDR_LEN;
                n++;
            }
        }
        while (r != NULL && n + 2 <= TCP_MAX_IOV) {
            n = req_iov(r, 0, iov, n);
            r = r->sq_next;
        }
        for (int i = 0; i < n; i++) total += iov[i].iov_len;

        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            tcp__conn_fail_errno(s, c, errno, "sending");
            return;
        }
        conn_advance(s, c, (size_t)w);
        if ((size_t)w < total) break; /* The socket buffer is full. */
    }
    tcp__conn_update_interest(s, c);
}
