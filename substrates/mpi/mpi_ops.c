/*
 * The MPI substrate's operations table, which the core loads through
 * mr_substrate_get_ops(), stats(), held() and preconnect().
 */
#include "mpi_substrate.h"

static void mpi_stats(mr_substrate_t *s, mr_stats_t *stats)
{
    mr__substrate_stats(s, stats);
    mr__batcher_stats(&s->batcher, stats);
}

/*
 * The messages of the completed receives that wait for a receive slot: a
 * batch counted by the frames it has not delivered yet (each a message with a
 * credit of its own). Off the hot path: the core asks after a slot was
 * refused, and while this returns more than 0, so a batch's frames are
 * counted once; deliver_batch() takes off those it delivers.
 */
static uint64_t mpi_held(mr_substrate_t *s)
{
    uint64_t held = 0;

    for (unsigned k = 0; k < s->nposted; k++) {
        mpi_recv_t *e = &s->recvs[ring_at(s, s->head, k)];
        int count;

        if (!e->done) continue;
        if (e->frames_left == MPI_FRAMES_UNCOUNTED) {
            e->frames_left = 0;
            if (e->rc == MPI_SUCCESS && (uint32_t)e->status.MPI_TAG == s->batch_tag &&
                MPI_Get_count(&e->status, MPI_BYTE, &count) == MPI_SUCCESS && count > 0 &&
                (size_t)count <= s->base.datagram_size) {
                e->frames_left = (uint32_t)mr__batch_frames_from(
                    s->staging + (size_t)e->buf * s->base.datagram_size, (size_t)count,
                    e->offset);
            }
        }
        held += e->frames_left > 0 ? e->frames_left : 1;
    }
    return held;
}

/* The batches being filled, open to the core (mr_append_window_t). */
static mr_append_window_t *mpi_append_windows(mr_substrate_t *s, size_t *max_frame)
{
    return mr__batcher_windows(&s->batcher, max_frame);
}

/* The staging buffers, where every message delivered zero copy lies (mpi_recv.c). */
static bool mpi_recv_region(mr_substrate_t *s, void **base, size_t *stride, uint32_t *count)
{
    if (s->staging == NULL || s->nstage == 0) return false;
    *base = s->staging;
    *stride = s->base.datagram_size;
    *count = s->nstage;
    return true;
}

/*
 * mr_connect() has nothing to dial here: the substrate makes no connection of
 * its own, and MPI keeps its own (MPICH sets up shared memory within a host
 * in MPI_Init). What MPICH may still connect on the first message between
 * hosts (UCX's wire-up beneath it) is left alone: warming it would take a
 * message that every rank receives, and so a receive that every progress
 * call tests, which the data path does not pay for. A peer that failed is
 * reported as such.
 */
static mr_status_t mpi_preconnect(mr_substrate_t *s, int rank)
{
    mr_status_t st = mr__send_target_check(s, rank);

    if (st != MR_OK) return st;
    return peer_usable(s, rank) ? MR_OK : MR_ERR_PEER_FAILED;
}

static const mr_substrate_ops_t mpi_ops = {
    MR__SUBSTRATE_OPS_HEAD,
    .name = "mpi",
    .description = "MPI (MPICH) point-to-point: MPI_Isend/MPI_Irecv, credits in tags on a "
                   "control communicator",
    .config_table = mpi__config_table,
    .config_size = sizeof(mpi_config_t),
    .open = mpi__open,
    .get_address = mpi__get_address,
    .connect = mpi__connect,
    .send = mpi__send,
    .send_control = mpi__send_control,
    .progress = mpi__progress,
    .wake_fd = mpi__wake_fd,
    .release_recv = mpi__release_recv,
    .format_address = mpi__format_address,
    .closing = mr__substrate_closing, /* Nothing to flush: the core waited for every data send. */
    .stats = mpi_stats,
    .close = mpi__close,
    .held = mpi_held,
    .append_windows = mpi_append_windows,
    .recv_region = mpi_recv_region,
    .preconnect = mpi_preconnect,
};

MR__SUBSTRATE_ENTRY(mpi_ops)
