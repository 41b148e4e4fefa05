/*
 * progress(): one pass completes data and control sends, delivers completed
 * receives in ring (arrival) order, and runs the peer_failed() upcalls.
 * Every pass runs all of them: they share this file so that the compiler
 * inlines them into progress_once() (the plugin is built without LTO).
 */
#include "mpi_substrate.h"

#include <poll.h>
#include <sched.h>
#include <stdlib.h>

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
/* Progress: the control send pool.                                          */

/* Moves the control sends still active to the front of [0, nctrl), in order. */
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

/* ------------------------------------------------------------------------ */
/* Progress: testing requests.                                               */

/*
 * Every MPI_Testsome costs a pass of MPICH's progress engine, and a handle
 * lookup and checks per request: about 1,000 instructions over 7 requests,
 * whatever completed (and a pass more per 8 requests, see MRMPI_TEST_BATCH).
 * Testing control sends, data sends and the receive ring apart cost up to
 * three of them per progress call where the plain asynchronous MPI loop
 * makes one, most of them finding nothing (a sender's ring, a receiver's
 * sends). So a progress call starts with one MPI_Testsome over the requests
 * most likely to have completed, at most MRMPI_TEST_BATCH of them: the
 * oldest control sends (at most MRMPI_JOINT_CTRL while there are data sends
 * too), the oldest data sends, and the receive of the ring that MPI matches
 * next (the oldest not known to have completed; more of them when there is
 * room). Each group is tested further, on its own, only when all of it
 * completed. The request handles are copied into one array for the call;
 * those of completed requests are set to MPI_REQUEST_NULL in place.
 */
typedef struct test_plan {
    size_t nctrl;              /* Control sends [0, nctrl), */
    size_t sfirst, nsend;      /* data sends [sfirst, sfirst + nsend), */
    unsigned rfirst, nring;    /* Ring entries [rfirst, rfirst + nring), */
    unsigned ractive;          /* that many of them not known to have completed. */
    size_t ctrl_done, send_done;
    unsigned ring_done;        /* Completions found in each group. */
} test_plan_t;

/* A data send completed: its side tables into the done arrays, and the window's marker. */
static void send_done(mr_substrate_t *s, size_t i, int err, size_t *ndone)
{
    size_t k = (*ndone)++;

    s->done_cookie[k] = s->send_cookie[i];
    s->done_batch[k] = s->send_batch[i];
    s->done_dest[k] = s->send_dest[i];
    s->done_err[k] = err;
    /* A completed marker: the receiver matched every message up to it. */
    if (s->send_mark[i] > s->peer_matched[s->send_dest[i]]) {
        s->peer_matched[s->send_dest[i]] = s->send_mark[i];
    }
    /* An erroneous request is freed by MPI too, but make sure it is not tested again. */
    s->send_req[i] = MPI_REQUEST_NULL;
    s->send_live--;
}

/* A control send completed; control sends have no completion upcall. */
static void ctrl_send_done(mr_substrate_t *s, size_t i, int err)
{
    if (err != MPI_SUCCESS) mpi__peer_mpi_error(s, s->ctrl_dest[i], err, "a control send to");
    s->ctrl_req[i] = MPI_REQUEST_NULL;
}

/* Ring entry i completed: its status is kept until progress_data_recvs() delivers it. */
static void ring_done(mr_substrate_t *s, unsigned i, const MPI_Status *st, int err)
{
    mpi_recv_t *e = &s->recvs[i];

    e->status = *st;
    e->rc = err;
    e->posted = false;
    e->done = true;
    s->nheld++;
    s->recv_req[i] = MPI_REQUEST_NULL;
}

/*
 * The next run of posted ring entries to test, at most `max`, from the
 * oldest not known to have completed (MPI matches them in ring order); it
 * never wraps, since MPI_Testsome takes a contiguous array. False when every
 * posted entry is known to have completed.
 */
static bool ring_batch(mr_substrate_t *s, unsigned max, unsigned *first, unsigned *len,
                       unsigned *active)
{
    unsigned skip = s->lead_done, n, act, f;

    /* nheld counts every completed entry: beyond lead_done only when some completed early. */
    if (s->nheld > skip) {
        while (skip < s->nposted && s->recvs[ring_at(s, s->head, skip)].done) skip++;
        s->lead_done = skip;
    }
    if (skip == s->nposted) return false;
    f = ring_at(s, s->head, skip);
    n = s->nposted - skip;
    if (n > s->nrecv - f) n = s->nrecv - f;
    if (n > max) n = max;
    act = n;
    if (s->nheld > skip) {
        for (unsigned i = 0; i < n; i++) act -= s->recvs[f + i].done;
    }
    *first = f;
    *len = n;
    *active = act;
    return true;
}

/* MPI_Testsome over `len` requests from `req`; the completions, or a negative status. */
static int testsome(mr_substrate_t *s, MPI_Request *req, size_t len, int *rc, const char *what)
{
    int outcount = 0;

    *rc = MPI_Testsome((int)len, req, &outcount, s->indices, s->statuses);
    if (*rc != MPI_SUCCESS && *rc != MPI_ERR_IN_STATUS) return mpi__fatal(s, *rc, what);
    return outcount == MPI_UNDEFINED || outcount < 0 ? 0 : outcount;
}

/* Chooses the requests of the first MPI_Testsome of a progress call (see test_plan_t). */
static void plan_first(mr_substrate_t *s, test_plan_t *p)
{
    unsigned first = 0, len = 0, active = 0;
    bool ring = s->data_posted && ring_batch(s, MRMPI_TEST_BATCH, &first, &len, &active);
    size_t room = MRMPI_TEST_BATCH - (ring ? 1u : 0u), more;

    p->ctrl_done = p->send_done = 0;
    p->ring_done = 0;
    p->nctrl = s->nctrl < MRMPI_JOINT_CTRL ? s->nctrl : MRMPI_JOINT_CTRL;
    if (p->nctrl > room) p->nctrl = room;
    room -= p->nctrl;
    p->sfirst = s->send_first;
    p->nsend = s->nsend - s->send_first < room ? s->nsend - s->send_first : room;
    room -= p->nsend;
    more = s->nctrl - p->nctrl < room ? s->nctrl - p->nctrl : room;
    p->nctrl += more;
    room -= more;
    p->rfirst = first;
    p->nring = ring ? (len < 1 + room ? len : 1 + (unsigned)room) : 0;
    p->ractive = p->nring == len ? active : 0;
    if (p->nring < len) {
        for (unsigned i = 0; i < p->nring; i++) p->ractive += !s->recvs[first + i].done;
    }
}

/* The first MPI_Testsome of a progress call; the completions, or a negative status. */
static int test_first(mr_substrate_t *s, test_plan_t *p, size_t *ndone)
{
    MPI_Request joint[MRMPI_TEST_BATCH], *req = joint;
    size_t n = p->nctrl + p->nsend + p->nring;
    int rc, got;

    if (n == 0) return 0;
    /* One group alone is tested in place; several are copied into one array. */
    if (n == p->nctrl) {
        req = s->ctrl_req;
    } else if (n == p->nsend) {
        req = s->send_req + p->sfirst;
    } else if (n == p->nring) {
        req = s->recv_req + p->rfirst;
    } else {
        n = 0;
        for (size_t i = 0; i < p->nctrl; i++) joint[n++] = s->ctrl_req[i];
        for (size_t i = 0; i < p->nsend; i++) joint[n++] = s->send_req[p->sfirst + i];
        for (unsigned i = 0; i < p->nring; i++) joint[n++] = s->recv_req[p->rfirst + i];
    }
    got = testsome(s, req, n, &rc, "testing sends and receives (MPI_Testsome)");
    for (int k = 0; k < got; k++) {
        size_t j = (size_t)s->indices[k];
        int err = testsome_err(rc, &s->statuses[k]);
        if (j < p->nctrl) {
            ctrl_send_done(s, j, err);
            p->ctrl_done++;
        } else if ((j -= p->nctrl) < p->nsend) {
            send_done(s, p->sfirst + j, err, ndone);
            p->send_done++;
        } else {
            ring_done(s, p->rfirst + (unsigned)(j - p->nsend), &s->statuses[k], err);
            p->ring_done++;
        }
    }
    return got;
}

/* ------------------------------------------------------------------------ */
/* Progress: sends.                                                          */

/*
 * MPI_Testsome over the `len` data sends from `first` on, recording their
 * completions; the completions, or a negative status.
 */
static int test_sends(mr_substrate_t *s, size_t first, size_t len, size_t *ndone)
{
    int rc, got = testsome(s, s->send_req + first, len, &rc, "testing data sends (MPI_Testsome)");

    for (int k = 0; k < got; k++) {
        send_done(s, first + (size_t)s->indices[k], testsome_err(rc, &s->statuses[k]), ndone);
    }
    return got;
}

/*
 * Completes data sends: every completion runs send_complete(), after
 * peer_failed() when the send failed. Returns the number of events or a
 * negative status. test_first() tested the oldest p->nsend of them already,
 * and found `ndone` completed.
 *
 * The pool is in send order, and sends complete about in that order, so
 * only the oldest are tested, MRMPI_TEST_BATCH at a time, going on to the
 * next batch only while a whole batch completed: one MPI_Testsome over the
 * whole pool cost a progress pass per 8 sends in flight (17 with a window
 * of 128), most of the sender's MPI work. So that an old send that does not
 * complete (a marker the receiver has not matched yet, a large message
 * waiting for its receive) cannot hide later completions for long, every
 * MRMPI_SEND_SWEEP-th call also tests one batch beyond, at a cursor that
 * goes round the pool.
 */
static int progress_sends(mr_substrate_t *s, const test_plan_t *p, size_t ndone)
{
    int events = 0, n;
    size_t first = p->sfirst + p->nsend, len;

    if (s->send_live == 0 && ndone == 0) return 0;
    if (p->send_done == p->nsend) {
        while (first < s->nsend) {
            len = s->nsend - first < MRMPI_TEST_BATCH ? s->nsend - first : MRMPI_TEST_BATCH;
            n = test_sends(s, first, len, &ndone);
            if (n < 0) return n;
            first += len;
            if ((size_t)n < len) break;
        }
    }
    if (first < s->nsend && (++s->send_polls % MRMPI_SEND_SWEEP) == 0) {
        if (s->send_sweep < first || s->send_sweep >= s->nsend) s->send_sweep = first;
        len = s->nsend - s->send_sweep < MRMPI_TEST_BATCH ? s->nsend - s->send_sweep
                                                           : MRMPI_TEST_BATCH;
        n = test_sends(s, s->send_sweep, len, &ndone);
        if (n < 0) return n;
        s->send_sweep += len;
    }
    if (ndone == 0) return 0;
    /*
     * Completed sends leave holes: the oldest live one becomes the first,
     * and an empty pool starts again at 0. Holes further on stay (MPI skips
     * them) until appending finds the end of the pool (mpi__sends_compact).
     */
    while (s->send_first < s->nsend && s->send_req[s->send_first] == MPI_REQUEST_NULL) {
        s->send_first++;
    }
    if (s->send_first == s->nsend) s->send_first = s->nsend = 0;
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

/*
 * Completes control sends beyond those test_first() tested, while whole
 * batches complete (they complete about in order, as data sends do).
 */
static int progress_ctrl_sends(mr_substrate_t *s, const test_plan_t *p)
{
    size_t first = p->nctrl, len;
    int rc, got;

    if (s->nctrl == 0) return 0;
    if (p->ctrl_done == p->nctrl) {
        while (first < s->nctrl) {
            len = s->nctrl - first < MRMPI_TEST_BATCH ? s->nctrl - first : MRMPI_TEST_BATCH;
            got = testsome(s, s->ctrl_req + first, len, &rc,
                           "testing control sends (MPI_Testsome)");
            if (got < 0) return got;
            for (int k = 0; k < got; k++) {
                ctrl_send_done(s, first + (size_t)s->indices[k],
                               testsome_err(rc, &s->statuses[k]));
            }
            first += len;
            if ((size_t)got < len) break;
        }
    }
    if (p->ctrl_done > 0 || first > p->nctrl) compact_ctrl(s);
    return 0; /* Failures found here count when drain_failures() reports them. */
}

/* ------------------------------------------------------------------------ */
/* Progress: receives.                                                       */

/*
 * Delivers a received batch: one of data messages whole, into one receive
 * slot (MR_KIND_BATCH: the core checks its frames); handlers' messages, from
 * a batch's start, run at once from the staging buffer as far as they go
 * (deliver_now_frames: a handler's send touches only the send side, not this
 * ring); the frames left from e->offset on are each copied into a receive
 * slot, until one finds no slot free. Returns the deliveries, or
 * MR_ERR_PROTOCOL when the frames do not add up.
 */
static int deliver_batch(mr_substrate_t *s, mpi_recv_t *e, int src, const uint8_t *buf,
                         size_t length)
{
    size_t off = e->offset, plen;
    const uint8_t *payload;
    unsigned kind;
    int n = 0, r;

    if (off == 0 && mr__batch_is_data(buf, length)) {
        if (s->base.up.deliver_copy(s->base.core, src, MR_KIND_BATCH, 0, buf, length) != MR_OK) {
            return 0;
        }
        e->offset = length;
        return 1;
    }
    if (off == 0 && s->base.up.deliver_now_frames != NULL) {
        n = (int)s->base.up.deliver_now_frames(s->base.core, src, buf, length, &off);
        e->offset = off;
    }
    while ((r = mr__batch_frame_next(buf, length, &off, &kind, &payload, &plen)) == 1) {
        if (s->base.up.deliver_copy(s->base.core, src, kind, 0, payload, plen) != MR_OK) break;
        e->offset = off;
        n++;
    }
    /* held()'s count follows the frames delivered (each of them one of n). */
    if (e->frames_left != MPI_FRAMES_UNCOUNTED) {
        e->frames_left = (uint32_t)n < e->frames_left ? e->frames_left - (uint32_t)n : 0;
    }
    return r < 0 ? MR_ERR_PROTOCOL : n;
}

/* What deliver_one() did with a lone message, apart from MR_AGAIN and errors. */
enum { DELIVERED_HELD = MR_AGAIN + 1, DELIVERED_DONE = MR_AGAIN + 2 };

/*
 * Delivers a lone message from its staging buffer: a handler's message runs
 * at once if it can (deliver_handler_now), and its buffer is free again
 * (DELIVERED_DONE); anything else goes zero copy, the application holding the
 * buffer until release_recv() (DELIVERED_HELD). MR_AGAIN: no receive slot.
 */
static int deliver_one(mr_substrate_t *s, mpi_recv_t *e, int src, uint32_t tag, uint8_t *buf,
                       size_t length)
{
    unsigned kind = (tag & s->kind_bit)      ? MR_KIND_ITEMS
                    : (tag & s->handler_bit) ? MR_KIND_HANDLER
                                             : MR_KIND_DATA;
    uint32_t imm = tag & s->data_imm_ub;

    if (kind == MR_KIND_HANDLER &&
        mr__deliver_handler_trailer(&s->base, src, imm, buf, length) == MR_OK) {
        return DELIVERED_DONE;
    }
    mr_status_t st = s->base.up.deliver(s->base.core, src, kind, imm, buf, length,
                                        (void *)(uintptr_t)(e->buf + 1));
    if (st == MR_AGAIN) return MR_AGAIN;
    return st == MR_OK ? DELIVERED_HELD : MR_ERR_TRANSPORT;
}

/*
 * Delivers completed data receives in ring (arrival) order, stopping at the
 * first one that has not completed or when no receive slot is free. Returns
 * the number of messages delivered or discarded, or a negative status.
 */
static int progress_data_recvs(mr_substrate_t *s, bool test)
{
    int events = 0;

    if (!s->data_posted) return 0;
    /*
     * MPI matches receives in ring order, so the oldest ones complete first:
     * test a batch of MRMPI_TEST_BATCH from the oldest not completed, one
     * MPI_Testsome (one progress pass) each, and go on to the next batch
     * only when the whole batch completed. An MPI_Test per message made the
     * receiver three times slower, and one MPI_Testsome over the whole ring
     * costs a progress pass per 8 receives (see MRMPI_TEST_BATCH). `test`
     * is false when test_first() found its part of the ring not all
     * completed: nothing after it is tested then.
     */
    while (test) {
        unsigned first, len, active;
        int got, rc;

        if (!ring_batch(s, MRMPI_TEST_BATCH, &first, &len, &active)) break;
        got = testsome(s, s->recv_req + first, len, &rc,
                       "testing data receives (MPI_Testsome)");
        if (got < 0) return got;
        for (int k = 0; k < got; k++) {
            ring_done(s, first + (unsigned)s->indices[k], &s->statuses[k],
                      testsome_err(rc, &s->statuses[k]));
        }
        if ((unsigned)got < active) break;
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
                int got = deliver_one(s, e, src, tag, buf, (size_t)count);
                /* No receive slot to account for it: the head waits, and everything after. */
                if (got == MR_AGAIN) break;
                if (got < 0) return got;
                events++;
                if (got == DELIVERED_HELD) {
                    /* The application holds the staging buffer until release_recv(). */
                    e->done = false;
                    s->nheld--;
                    s->head = ring_at(s, i, 1);
                    s->nposted--;
                    if (s->lead_done > 0) s->lead_done--;
                    continue;
                }
            } else {
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
        }
        /* Discarded, failed, a handler run or a batch delivered: the staging buffer is free again. */
        s->stage_free[s->nstage_free++] = e->buf;
        e->done = false;
        s->nheld--;
        s->head = ring_at(s, i, 1);
        s->nposted--;
        if (s->lead_done > 0) s->lead_done--;
    }
    if (mpi__data_post_all(s) != MR_OK) return MR_ERR_TRANSPORT;
    return events;
}

/* One pass over everything; returns the events handled or a negative status. */
static int progress_once(mr_substrate_t *s)
{
    test_plan_t p = {0};
    size_t ndone = 0;
    int events = 0, n;

    events += drain_failures(s);
    /* Nothing but receives to test: progress_data_recvs() does it alone. */
    if (s->send_live > 0 || s->nctrl > 0) {
        plan_first(s, &p);
        n = test_first(s, &p, &ndone);
        if (n < 0) return n;
    }
    n = progress_sends(s, &p, ndone);
    if (n < 0) return n;
    events += n;
    n = progress_ctrl_sends(s, &p);
    if (n < 0) return n;
    /*
     * Each probe that finds nothing is a pass of MPI's progress engine, the
     * larger part of an empty poll. Credits can wait a few polls: control
     * messages are probed for on every 8th call, and on every call while
     * they keep coming.
     */
    if (s->ctrl_hot || (++s->ctrl_polls & 7) == 0) {
        n = mpi__progress_ctrl_recvs(s);
        if (n < 0) return n;
        s->ctrl_hot = n > 0;
        events += n;
    }
    n = progress_data_recvs(s, p.nring == 0 || p.ring_done == p.ractive);
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
