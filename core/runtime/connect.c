/*
 * mr_connect(): connections made ahead of the traffic, so that a timed phase
 * measures its messages and not the dialling. Each rank asks its substrate to
 * connect to the ranks it lists (the preconnect op, which never blocks) and
 * makes progress until they are established, accepting the other ranks'
 * dials meanwhile. Then the ranks agree, in a reduction of the bootstrap
 * tested between progress calls, that every rank got there and whether any
 * failed. No blocking MPI call: a rank waiting in one would not accept the
 * dials of the ranks that still connect to it.
 *
 * A reduction abandoned for MAILRAIL_TIMEOUT stays pending in the bootstrap
 * (MPI cannot cancel it): rt.connect_pending says so, and the next collective
 * call completes it before starting its own (rt_connect_settle()), so that
 * every rank's collectives stay in the same order.
 */
#include "datapath.h"
#include "mr_time.h"

#include <stdlib.h>

/* What the reduction sums over the ranks. */
enum {
    CONNECT_BAD_ARGS = 0, /* Ranks whose arguments were invalid. */
    CONNECT_FAILED = 1    /* Ranks whose connections failed. */
};

/* Checks the arguments; logs the first that is wrong. */
static mr_status_t connect_check_args(const int *dests, int count)
{
    if (count < 0) {
        mr_error("mr_connect(): count is %d; it must be 0 or more.", count);
        return MR_ERR_INVALID_PARAM;
    }
    if (dests == NULL && count > 0) {
        mr_error("mr_connect(): dests is NULL with a count of %d.", count);
        return MR_ERR_INVALID_PARAM;
    }
    for (int i = 0; i < count; i++) {
        if (dests[i] < 0 || dests[i] >= rt.size) {
            mr_error("mr_connect(): dests[%d] is %d, which is not a rank in [0, %d).", i,
                     dests[i], rt.size);
            return MR_ERR_INVALID_RANK;
        }
    }
    return MR_OK;
}

/*
 * One progress call while waiting for what other ranks must do: a wait of
 * 1 ms at first, then of 4 and 16 ms, as finalize waits. Their dials and
 * messages wake it at once; only the reduction's end does not.
 */
static int connect_progress(unsigned *polls)
{
    unsigned n = (*polls)++;

    return rt_progress(n < MR_BACKOFF_YIELDS ? 1 : n < 4 * MR_BACKOFF_YIELDS ? 4 : 16);
}

/*
 * Asks the substrate to connect to each rank of todo[0..ntodo) and keeps
 * those still under way at the front; returns how many. Sets *status at the
 * first that failed.
 */
static int connect_walk(int *todo, int ntodo, mr_status_t *status)
{
    int left = 0;

    for (int k = 0; k < ntodo && *status == MR_OK; k++) {
        int dest = todo[k];
        mr_status_t st = rt.peer[dest] != PEER_OK ? MR_ERR_PEER_FAILED
                                                   : rt.substrate->preconnect(rt.sub, dest);
        if (st == MR_AGAIN) {
            todo[left++] = dest;
        } else if (st != MR_OK) {
            /* The substrate or the failure's report has said why. */
            mr_debug("mr_connect(): connecting to rank %d failed: %s.", dest,
                     mr_status_string(st));
            *status = st;
        }
    }
    return left;
}

/*
 * Has the substrate connect to every rank of `dests` but this one, and makes
 * progress until all are established, one fails, or `deadline` passes.
 */
static mr_status_t connect_dial(const int *dests, int count, uint64_t deadline)
{
    uint8_t *listed;
    int *todo, ntodo = 0;
    unsigned polls = 0;
    mr_status_t status = MR_OK;

    if (rt.substrate->preconnect == NULL) {
        mr_debug("mr_connect(): the %s substrate cannot connect ahead (its ops table has no "
                 "preconnect): the ranks only synchronize, and connections are made on first "
                 "send.", rt.substrate->name);
        return MR_OK;
    }
    if (count == 0) return MR_OK;
    listed = calloc((size_t)rt.size, 1);
    todo = malloc((size_t)(count < rt.size ? count : rt.size) * sizeof(*todo));
    if (listed == NULL || todo == NULL) {
        mr_error("mr_connect(): cannot allocate the list of %d ranks to connect to.", count);
        free(listed);
        free(todo);
        return MR_ERR_NO_MEMORY;
    }
    /* Each rank once, in the order given; this rank needs no connection. */
    for (int i = 0; i < count; i++) {
        if (dests[i] == rt.rank || listed[dests[i]]) continue;
        listed[dests[i]] = 1;
        todo[ntodo++] = dests[i];
    }
    /*
     * The list is walked once a millisecond at most: each dial or accept makes a
     * progress call return at once, and walking the list after every one took
     * about a third of both cores while 1,024 ranks connected every pair.
     */
    for (uint64_t walk_at = 0; ntodo > 0;) {
        if (mr__now_ns() >= walk_at) {
            walk_at = mr__now_ns() + MR_NS_PER_MS;
            ntodo = connect_walk(todo, ntodo, &status);
            if (status != MR_OK || ntodo == 0) break;
            if (mr__now_ns() > deadline) {
                mr_error("mr_connect(): %d listed rank(s), rank %d among them, not connected "
                         "within %u s (MAILRAIL_TIMEOUT).", ntodo, todo[0],
                         (unsigned)rt.cfg.timeout_s);
                status = MR_ERR_TIMEOUT;
                break;
            }
        }
        int events = connect_progress(&polls);
        if (events < 0) {
            status = (mr_status_t)events;
            break;
        }
    }
    free(listed);
    free(todo);
    return status;
}

/*
 * Waits for the reduction, making progress, until `deadline`. On
 * MR_ERR_TIMEOUT and MR_ERR_PEER_FAILED the reduction stays pending.
 */
static mr_status_t connect_wait(uint64_t deadline)
{
    unsigned polls = 0;

    for (;;) {
        mr_status_t status = rt_connect_settle();
        if (status != MR_AGAIN) return status;
        if (rt.any_failure) {
            mr_error("mr_connect(): a rank has failed; the ranks cannot agree that they are "
                     "connected.");
            return MR_ERR_PEER_FAILED;
        }
        if (mr__now_ns() > deadline) {
            mr_error("mr_connect(): other ranks did not reach mr_connect() or did not connect "
                     "within %u s (MAILRAIL_TIMEOUT); the next mr_connect(), mr_quiesce() or "
                     "mr_finalize() waits for them first.", (unsigned)rt.cfg.timeout_s);
            return MR_ERR_TIMEOUT;
        }
        int events = connect_progress(&polls);
        if (events < 0) return (mr_status_t)events;
    }
}

mr_status_t rt_connect_settle(void)
{
    mr_status_t status;

    if (!rt.connect_pending) return MR_OK;
    status = rt.bootstrap->test(rt.bs);
    if (status == MR_AGAIN) return MR_AGAIN;
    rt.connect_pending = false;
    rt.wave_pending = false;
    return status;
}

mr_status_t mr_connect(const int *dests, int count)
{
    uint64_t start = mr__now_ns(), deadline = start + rt.cfg.timeout_s * MR_NS_PER_S;
    mr_status_t local, status;

    RT_CHECK_READY("mr_connect()");
    if (rt.any_failure) {
        mr_error("mr_connect(): a rank has failed; the ranks cannot connect together.");
        return MR_ERR_PEER_FAILED;
    }
    /* Between an mr_quiesce() that returned MR_AGAIN and the one that returns MR_OK. */
    if ((rt.wave_pending && !rt.connect_pending) || rt.have_last_wave) {
        mr_error("mr_connect() called while a quiescence is under way: call mr_quiesce() until "
                 "it returns MR_OK first.");
        return MR_ERR_INVALID_PARAM;
    }
    /* An earlier call's reduction, abandoned for the timeout, ends first. */
    if (rt.connect_pending) {
        status = connect_wait(deadline);
        if (status != MR_OK) return status;
    }

    local = connect_check_args(dests, count);
    if (local == MR_OK) local = connect_dial(dests, count, deadline);
    /*
     * Every rank joins the reduction, whatever went wrong here, so that none
     * waits in vain. A timeout is no failure of the others: a late rank whose
     * own connections are made may still return MR_OK.
     */
    rt_reduce_in[CONNECT_BAD_ARGS] = local == MR_ERR_INVALID_PARAM || local == MR_ERR_INVALID_RANK;
    rt_reduce_in[CONNECT_FAILED] = local != MR_OK && local != MR_ERR_TIMEOUT &&
                                   !rt_reduce_in[CONNECT_BAD_ARGS];
    status = rt.bootstrap->iallreduce_sum(rt.bs, rt_reduce_in, rt_reduce_out, 2);
    if (status != MR_OK) return local != MR_OK ? local : status;
    /* Pending until it completes; mr_finalize() waits for a pending wave, and so for it. */
    rt.connect_pending = true;
    rt.wave_pending = true;
    status = connect_wait(deadline);
    if (local != MR_OK) return local;
    if (status != MR_OK) return status;
    if (rt_reduce_out[CONNECT_BAD_ARGS] > 0) {
        mr_error("mr_connect(): %llu other rank(s) passed invalid arguments; see their messages.",
                 (unsigned long long)rt_reduce_out[CONNECT_BAD_ARGS]);
        return MR_ERR_INVALID_PARAM;
    }
    if (rt_reduce_out[CONNECT_FAILED] > 0) {
        mr_error("mr_connect(): %llu other rank(s) could not connect; see their messages.",
                 (unsigned long long)rt_reduce_out[CONNECT_FAILED]);
        return MR_ERR_PEER_FAILED;
    }
    if (rt.rank == 0) {
        mr_debug("mr_connect(): connected in %.3f s (rank 0's view, %d ranks listed here).",
                 (double)(mr__now_ns() - start) / 1e9, count);
    }
    return MR_OK;
}
