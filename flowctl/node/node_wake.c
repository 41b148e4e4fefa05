/*
 * Waking the ranks of a node that sleep for credits (the `node` policy).
 *
 * A rank whose sends wait for credits of its node's shared pool sleeps in
 * mr_wait() on its substrate's descriptors; credits that a neighbour puts in
 * the pool arrive on none of them. So a sleeper notes in the node's segment
 * which receiver it waits for (mr_node_sleeper_t), and a rank that deposits
 * credits for that receiver sends a one-byte datagram to as many sleepers as
 * its sleepers can use (each says how many it wants), on a Unix datagram socket each rank binds to an
 * abstract name of its job. The core adds the socket to what the substrate
 * waits on. Without it, hundreds of ranks per core had to poll the pool every
 * millisecond and left the cores no time for anything else (docs/incast.md).
 *
 * Either the sleeper sees the deposit or the depositor sees the sleeper: both
 * write, fence (sequentially consistent), then read. A wake-up that finds
 * nothing (another rank took the credits first) costs one more sleep.
 * Datagrams carry nothing: one from a stranger only wakes a rank early.
 */
#include "mr_node_wake.h"
#include "mr_log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* "\0mailrail-<job>-w<rank>": abstract, so nothing is left behind on a crash. */
static socklen_t wake_address(struct sockaddr_un *a, const char *job_id, int rank)
{
    int n;

    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "mailrail-%s-w%d", job_id, rank);
    if (n < 0 || (size_t)n >= sizeof(a->sun_path) - 1) n = (int)sizeof(a->sun_path) - 2;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

void mr__node_wake_init(mr_node_wake_t *w)
{
    memset(w, 0, sizeof(*w));
    w->fd = -1;
}

mr_status_t mr__node_wake_open(mr_node_wake_t *w, mr_node_segment_t *seg, const char *job_id,
                              const int *local_rank, int nlocal, int me)
{
    struct sockaddr_un a;
    socklen_t len;

    w->seg = seg;
    w->job_id = job_id;
    w->local_rank = local_rank;
    w->nlocal = nlocal;
    w->me = me;
    if (nlocal < 2) return MR_OK; /* Nobody to wake, nobody to be woken by. */
    w->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (w->fd < 0) {
        mr_warn("Node flow control: no wake-up socket (%s); ranks waiting for credits of their "
                "node poll at their mr_wait() timeout.", strerror(errno));
        return MR_OK;
    }
    len = wake_address(&a, job_id, local_rank[me]);
    if (bind(w->fd, (struct sockaddr *)&a, len) != 0) {
        mr_warn("Node flow control: cannot bind the wake-up socket @%s (%s); ranks waiting for "
                "credits of their node poll at their mr_wait() timeout.", a.sun_path + 1,
                strerror(errno));
        close(w->fd);
        w->fd = -1;
    }
    return MR_OK;
}

void mr__node_wake_close(mr_node_wake_t *w)
{
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
}

/* Reads whatever wake-ups came; the one expected is among them if any came. */
static void wake_drain(mr_node_wake_t *w)
{
    char buf[64];

    while (recv(w->fd, buf, sizeof(buf), 0) >= 0) w->expect = false;
}

void mr__node_wake_progress(mr_node_wake_t *w)
{
    if (w->expect) wake_drain(w);
}

bool mr__node_wake_sleep(mr_node_wake_t *w, bool sleeping, uint32_t waits_for, uint32_t want)
{
    _Atomic uint32_t *mine;

    if (w->fd < 0) return false;
    mine = &mr__node_sleepers(w->seg)[w->me].waits_for;
    if (sleeping) {
        wake_drain(w); /* Stray wake-ups (late or foreign) must not end this sleep. */
        /* Before the mark: a waker that sees the mark sees the want. */
        atomic_store_explicit(&mr__node_sleepers(w->seg)[w->me].want, want, memory_order_relaxed);
        atomic_store(mine, waits_for);
        atomic_fetch_add(&w->seg->sleeping, 1);
        /* Pairs with the fence in mr__node_wake_others(): see the top of the file. */
        atomic_thread_fence(memory_order_seq_cst);
        return true;
    }
    if (atomic_exchange(mine, 0) != 0) {
        atomic_fetch_sub(&w->seg->sleeping, 1);
        return false; /* Nobody took the mark: no wake-up comes. */
    }
    /*
     * A waker took the mark (and counted us off): its datagram is here or on
     * its way. Until it is read, the descriptor stays readable and the
     * substrate would not sleep; progress reads it (mr__node_wake_progress).
     */
    w->expect = true;
    wake_drain(w);
    return false;
}

void mr__node_wake_others(mr_node_wake_t *w, int dest, uint32_t n)
{
    mr_node_sleeper_t *sleepers;
    int i;

    atomic_thread_fence(memory_order_seq_cst);
    if (w->fd < 0 || atomic_load(&w->seg->sleeping) == 0) return;
    sleepers = mr__node_sleepers(w->seg);
    /* Round robin from where the last wake-up stopped, so that all sleepers get turns. */
    for (int k = 0; k < w->nlocal && n > 0; k++) {
        i = (w->cursor + k) % w->nlocal;
        uint32_t want = atomic_load_explicit(&sleepers[i].waits_for, memory_order_relaxed);
        if (i == w->me || (want != (uint32_t)dest + 1 && want != MR_NODE_WAIT_ANY)) continue;
        if (!atomic_compare_exchange_strong(&sleepers[i].waits_for, &want, 0)) continue;
        atomic_fetch_sub(&w->seg->sleeping, 1);
        struct sockaddr_un a;
        socklen_t len = wake_address(&a, w->job_id, w->local_rank[i]);
        /* A full socket buffer means it has wake-ups to read already. */
        if (sendto(w->fd, "", 1, MSG_DONTWAIT, (struct sockaddr *)&a, len) < 0 &&
            errno != EAGAIN && !w->send_error_logged) {
            mr_debug("Node flow control: cannot wake rank %d: %s.", w->local_rank[i],
                     strerror(errno));
            w->send_error_logged = true;
        }
        w->woken++;
        uint32_t takes = atomic_load_explicit(&sleepers[i].want, memory_order_relaxed);
        n = takes >= n ? 0 : n - (takes > 0 ? takes : 1);
        w->cursor = (i + 1) % w->nlocal;
    }
}
