/*
 * progress(): one pass completes data and control sends, delivers completed
 * receives in ring (arrival) order, and runs the peer_failed() upcalls.
 * Every pass runs all of them: they share this file so that the compiler
 * inlines them into progress_once() (the plugin is built without LTO).
 */
#include "mpi_substrate.h"

#include <poll.h>
#include <sched.h>

/* A failure found by mpi__peer_mark_failed() is reported: nothing else to undo. */
static mr__fail_verdict_t peer_fail_begin(mr_substrate_t *s, int rank, mr_status_t why)
{
    (void)why;
    s->peer[rank] = PEER_FAILED;
    return MR__FAIL_REPORT;
}

static const mr__fail_ops_t mpi_fail_ops = {.begin = peer_fail_begin};

/* Runs the peer_failed() upcalls queued by mpi__peer_mark_failed(). progress() only. */
static inline int drain_failures(mr_substrate_t *s)
{
    return mr__failq_empty(&s->failq) ? 0 : mr__failq_drain(s, &s->failq, &mpi_fail_ops);
}

/* The error of one completion reported by MPI_Testsome. */
static inline int testsome_err(int rc, const MPI_Status *st)
{
    return rc == MPI_ERR_IN_STATUS ? st->MPI_ERROR : MPI_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Progress: sends.                                                          */

/*
 * Moves the requests still active to the front of [0, *n), keeping their
 * side tables in step. Completed requests are MPI_REQUEST_NULL after
 * MPI_Testsome.
 */
static void compact_sends(mr_substrate_t *s)
{
    size_t j = 0;

    for (size_t i = 0; i < s->nsend; i++) {
        if (s->send_req[i] == MPI_REQUEST_NULL) continue;
        if (i != j) {
            s->send_req[j] = s->send_req[i];
            s->send_cookie[j] = s->send_cookie[i];
            s->send_dest[j] = s->send_dest[i];
            s->send_mark[j] = s->send_mark[i];
            s->send_batch[j] = s->send_batch[i];
        }
        j++;
    }
    s->nsend = j;
}

static void compact_ctrl(mr_substrate_t *s)
{
    size_t j = 0;

    for (size_t i = 0; i < s->nctrl; i++) {
        if (s->ctrl_req[i] == MPI_REQUEST_NULL) continue;
        if (i != j) {
            s->ctrl_req[j] = s->ctrl_req[i];
            s->ctrl_dest[j] = s->ctrl_dest[i];
        }
        j++;
    }
    s->nctrl = j;
}

/*
 * Completes data sends: every completion runs send_complete(), after
 * peer_failed() when the send failed. Returns the number of events or a
 * negative status.
 */
static int progress_sends(mr_substrate_t *s)
{
    int outcount = 0, rc, events = 0;
    size_t ndone = 0;

    if (s->nsend == 0) return 0;
    rc = MPI_Testsome((int)s->nsend, s->send_req, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi__fatal(s, rc, "testing data sends (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        int i = s->indices[k];
        s->done_cookie[ndone] = s->send_cookie[i];
        s->done_batch[ndone] = s->send_batch[i];
        s->done_dest[ndone] = s->send_dest[i];
        s->done_err[ndone] = testsome_err(rc, &s->statuses[k]);
        /* A completed marker: the receiver matched every message up to it. */
        if (s->send_mark[i] > s->peer_matched[s->send_dest[i]]) {
            s->peer_matched[s->send_dest[i]] = s->send_mark[i];
        }
        /* An erroneous request is freed by MPI too, but make sure it is not tested again. */
        s->send_req[i] = MPI_REQUEST_NULL;
        ndone++;
    }
    compact_sends(s);
    /* Upcalls last: the core may send again from them, which appends to the pool. */
    for (size_t k = 0; k < ndone; k++) {
        if (s->done_err[k] != MPI_SUCCESS) {
            mpi__peer_mpi_error(s, s->done_dest[k], s->done_err[k], "a data send to");
            events += drain_failures(s);
        }
        if (s->done_batch[k] != NULL) {
            events += batch_complete(s, s->done_batch[k]);
        } else {
            s->base.up.send_complete(s->base.core, s->done_cookie[k]);
            events++;
        }
    }
    return events;
}

/* Completes control sends; they have no completion upcall. */
static int progress_ctrl_sends(mr_substrate_t *s)
{
    int outcount = 0, rc;

    if (s->nctrl == 0) return 0;
    rc = MPI_Testsome((int)s->nctrl, s->ctrl_req, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi__fatal(s, rc, "testing control sends (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        int i = s->indices[k];
        int err = testsome_err(rc, &s->statuses[k]);
        if (err != MPI_SUCCESS) mpi__peer_mpi_error(s, s->ctrl_dest[i], err, "a control send to");
        s->ctrl_req[i] = MPI_REQUEST_NULL;
    }
    compact_ctrl(s);
    return 0; /* Failures found here count when drain_failures() reports them. */
}

/* ------------------------------------------------------------------------ */
/* Progress: receives.                                                       */

/* Handles completed control receives and posts them again. */
static int progress_ctrl_recvs(mr_substrate_t *s)
{
    int outcount = 0, rc, events = 0;
    int src[MRMPI_CTRL_RECVS], tag[MRMPI_CTRL_RECVS];
    int n = 0;

    if (!s->ctrl_posted) return 0;
    rc = MPI_Testsome(MRMPI_CTRL_RECVS, s->ctrl_recv, &outcount, s->indices, s->statuses);
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return mpi__fatal(s, rc, "testing control receives (MPI_Testsome)");
    }
    if (outcount == MPI_UNDEFINED || outcount <= 0) return 0;
    for (int k = 0; k < outcount; k++) {
        const MPI_Status *st = &s->statuses[k];
        int err = testsome_err(rc, st);
        if (err != MPI_SUCCESS) {
            if (mpi__recv_error(s, st, err, true) != MR_OK) return MR_ERR_TRANSPORT;
        } else if (st->MPI_SOURCE >= 0 && st->MPI_SOURCE < s->base.size) {
            src[n] = st->MPI_SOURCE;
            tag[n] = st->MPI_TAG;
            n++;
        }
    }
    /* Posted again before the upcalls, which may send. */
    for (int k = 0; k < outcount; k++) {
        if (mpi__ctrl_post(s, (unsigned)s->indices[k]) != MR_OK) return MR_ERR_TRANSPORT;
    }
    for (int k = 0; k < n; k++) {
        if (!peer_usable(s, src[k])) {
            s->discarded++;
            continue;
        }
        s->base.up.control(s->base.core, src[k], (uint32_t)tag[k]);
        events++;
    }
    return events;
}

/*
 * Delivers a received batch: one of data messages whole, into one receive
 * slot (MR_KIND_BATCH: the core checks its frames); the frames of another
 * from e->offset on, each copied into a receive slot, until one finds no
 * slot free. Returns the deliveries, or MR_ERR_PROTOCOL when the frames do
 * not add up.
 */
static int deliver_batch(mr_substrate_t *s, mpi_recv_t *e, int src, const uint8_t *buf,
                         size_t length)
{
    size_t off = e->offset, plen;
    const uint8_t *payload;
    unsigned kind;
    int n = 0, r;

    /* A batch holds one kind (mr_batch.h): the first frame's kind bits say which. */
    if (off == 0 && length >= MR_FRAME_HDR && (buf[3] & 0xc0) == 0) {
        if (s->base.up.deliver_copy(s->base.core, src, MR_KIND_BATCH, 0, buf, length) != MR_OK) {
            return 0;
        }
        e->offset = length;
        return 1;
    }
    while ((r = mr__batch_frame_next(buf, length, &off, &kind, &payload, &plen)) == 1) {
        if (s->base.up.deliver_copy(s->base.core, src, kind, 0, payload, plen) != MR_OK) break;
        e->offset = off;
        n++;
    }
    return r < 0 ? MR_ERR_PROTOCOL : n;
}

/*
 * Delivers completed data receives in ring (arrival) order, stopping at the
 * first one that has not completed or when no receive slot is free. Returns
 * the number of messages delivered or discarded, or a negative status.
 */
static int progress_data_recvs(mr_substrate_t *s)
{
    int events = 0;

    if (!s->data_posted) return 0;
    /*
     * MPI matches receives in ring order, so the oldest ones complete first:
     * test a batch of MRMPI_TEST_BATCH from the oldest not completed, one
     * MPI_Testsome (one progress pass) each, and go on to the next batch
     * only when the whole batch completed. An MPI_Test per message made the
     * receiver three times slower, and one MPI_Testsome over the whole ring
     * costs a progress pass per 8 receives (see MRMPI_TEST_BATCH).
     */
    for (;;) {
        unsigned skip = s->lead_done, first, len = 0, active = 0;
        int outcount = 0, rc;

        while (skip < s->nposted && s->recvs[(s->head + skip) % s->nrecv].done) skip++;
        s->lead_done = skip;
        if (skip == s->nposted) break;
        first = (s->head + skip) % s->nrecv;
        /* A batch never wraps: MPI_Testsome takes a contiguous array. */
        while (len < MRMPI_TEST_BATCH && skip + len < s->nposted && first + len < s->nrecv) {
            if (!s->recvs[first + len].done) active++;
            len++;
        }
        rc = MPI_Testsome((int)len, s->recv_req + first, &outcount, s->indices, s->statuses);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            return mpi__fatal(s, rc, "testing data receives (MPI_Testsome)");
        }
        if (outcount == MPI_UNDEFINED) outcount = 0;
        for (int k = 0; k < outcount; k++) {
            unsigned i = first + (unsigned)s->indices[k];
            mpi_recv_t *e = &s->recvs[i];
            e->status = s->statuses[k];
            e->rc = testsome_err(rc, &s->statuses[k]);
            e->posted = false;
            e->done = true;
            s->nheld++;
            s->recv_req[i] = MPI_REQUEST_NULL;
        }
        if ((unsigned)outcount < active) break;
    }
    while (s->nposted > 0) {
        unsigned i = s->head;
        mpi_recv_t *e = &s->recvs[i];
        int count = 0, src;

        if (!e->done) break;
        src = e->status.MPI_SOURCE;
        if (e->rc != MPI_SUCCESS) {
            /* Nothing to deliver. */
            if (mpi__recv_error(s, &e->status, e->rc, false) != MR_OK) return MR_ERR_TRANSPORT;
            events++;
        } else if (src < 0 || src >= s->base.size) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: a data receive completed from rank %d, "
                    "which is not in the job.", src);
            s->broken = true;
            return MR_ERR_TRANSPORT;
        } else if (!peer_usable(s, src)) {
            s->discarded++;
            events++;
        } else {
            if (MPI_Get_count(&e->status, MPI_BYTE, &count) != MPI_SUCCESS || count < 0 ||
                (size_t)count > s->base.datagram_size) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: cannot tell the length of a message "
                        "from rank %d.", src);
                s->broken = true;
                return MR_ERR_TRANSPORT;
            }
            uint8_t *buf = s->staging + (size_t)e->buf * s->base.datagram_size;
            uint32_t tag = (uint32_t)e->status.MPI_TAG;
            if (tag != s->batch_tag) {
                /* Zero copy: the staging buffer itself, until release_recv(). */
                unsigned kind = (tag & s->kind_bit)      ? MR_KIND_ITEMS
                                : (tag & s->handler_bit) ? MR_KIND_HANDLER
                                                         : MR_KIND_DATA;
                mr_status_t st = s->base.up.deliver(s->base.core, src, kind,
                                                    tag & s->data_imm_ub, buf, (size_t)count,
                                                    (void *)(uintptr_t)(e->buf + 1));
                /* No receive slot to account for it: the head waits, and everything after. */
                if (st == MR_AGAIN) break;
                if (st != MR_OK) return MR_ERR_TRANSPORT;
                e->done = false;
                s->nheld--;
                s->head = (i + 1) % s->nrecv;
                s->nposted--;
                if (s->lead_done > 0) s->lead_done--;
                events++;
                continue;
            }
            /* A batch: its frames are copied out, and its buffer goes back at once. */
            int got = deliver_batch(s, e, src, buf, (size_t)count);
            if (got < 0) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a malformed batch of "
                        "messages; its messages are discarded from now on.", src);
                mpi__peer_mark_failed(s, src, MR_ERR_PROTOCOL);
                events++;
            } else {
                events += got;
                /* No receive slot for the rest: the head waits, and everything after. */
                if (e->offset < (size_t)count) break;
            }
        }
        /* Discarded, failed or a batch delivered: the staging buffer is free again. */
        s->stage_free[s->nstage_free++] = e->buf;
        e->done = false;
        s->nheld--;
        s->head = (i + 1) % s->nrecv;
        s->nposted--;
        if (s->lead_done > 0) s->lead_done--;
    }
    if (mpi__data_post_all(s) != MR_OK) return MR_ERR_TRANSPORT;
    return events;
}

/* One pass over everything; returns the events handled or a negative status. */
static int progress_once(mr_substrate_t *s)
{
    int events = 0, n;

    events += drain_failures(s);
    n = progress_sends(s);
    if (n < 0) return n;
    events += n;
    n = progress_ctrl_sends(s);
    if (n < 0) return n;
    /*
     * Each MPI_Testsome is a pass of MPI's progress engine, the larger part
     * of an empty poll. Credits can wait a few polls: control receives are
     * tested on every 8th call, and on every call while they keep coming.
     */
    if (s->ctrl_hot || (++s->ctrl_polls & 7) == 0) {
        n = progress_ctrl_recvs(s);
        if (n < 0) return n;
        s->ctrl_hot = n > 0;
        events += n;
    }
    n = progress_data_recvs(s);
    if (n < 0) return n;
    events += n;
    events += drain_failures(s);
    return events;
}

mr_status_t mpi__wake_fd(mr_substrate_t *s, int fd)
{
    s->wake_fd = fd;
    return MR_OK;
}

int mpi__progress(mr_substrate_t *s, int timeout_ms)
{
    uint64_t deadline;
    unsigned rounds = 0;
    int events, n;

    if (s == NULL) return MR_ERR_INVALID_PARAM;
    if (s->broken) return MR_ERR_TRANSPORT;
    /* Batches leave now, and the next message to each rank leaves alone again. */
    mr__batcher_next_epoch(&s->batcher);
    events = s->batcher.nopen > 0 ? mpi__flush_batches(s) : 0;
    n = progress_once(s);
    if (n < 0) return n;
    events += n;
    if (events != 0 || timeout_ms == 0) return events;
    /*
     * MPI has no wait with a timeout that covers all of this, so poll; but
     * let other processes run between polls, since ranks may outnumber cores.
     */
    deadline = timeout_ms < 0 ? UINT64_MAX : mr__now_ns() + (uint64_t)timeout_ms * MR_NS_PER_MS;
    for (;;) {
        uint64_t now;
        if (rounds < MRMPI_SPIN_YIELDS) {
            sched_yield();
        } else {
            now = mr__now_ns();
            if (now >= deadline) return 0;
            long ns = deadline - now < (uint64_t)MRMPI_NAP_NS ? (long)(deadline - now) : MRMPI_NAP_NS;
            if (s->wake_fd < 0) {
                nap(ns);
            } else {
                /* The nap ends early when flow control is woken (mpi__wake_fd). */
                struct pollfd pfd = {.fd = s->wake_fd, .events = POLLIN};
                struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
                if (ppoll(&pfd, 1, &ts, NULL) > 0) return 1;
            }
        }
        rounds++;
        s->ctrl_hot = true; /* Between naps, credits must not wait for an 8th pass. */
        events = progress_once(s);
        if (events != 0) return events;
        if (mr__now_ns() >= deadline) return 0;
    }
}
