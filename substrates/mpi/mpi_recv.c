/*
 * Posting receives: the data ring, each entry into a staging buffer; and the
 * staging buffers the application gives back. (Control messages are not
 * received into posted receives: mpi_ctrl.c probes for them.)
 * What completes is delivered by progress() (mpi_progress.c).
 */
#include "mpi_substrate.h"

/*
 * Posts the ring entry after the posted ones into a free staging buffer.
 * MR_AGAIN when the application holds every spare buffer.
 */
static mr_status_t data_post_next(mr_substrate_t *s)
{
    unsigned i = ring_at(s, s->head, s->nposted);
    mpi_recv_t *e = &s->recvs[i];
    int rc;

    if (s->nposted == s->nrecv || s->nstage_free == 0) return MR_AGAIN;
    e->buf = s->stage_free[--s->nstage_free];
    rc = MPI_Irecv(s->staging + (size_t)e->buf * s->base.datagram_size, (int)s->base.datagram_size,
                   MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, s->data_comm, &s->recv_req[i]);
    if (rc != MPI_SUCCESS) {
        s->stage_free[s->nstage_free++] = e->buf;
        s->recv_req[i] = MPI_REQUEST_NULL;
        e->posted = false;
        return mpi__fatal(s, rc, "posting a data receive (MPI_Irecv)");
    }
    e->posted = true;
    e->done = false;
    e->offset = 0;
    e->frames_left = MPI_FRAMES_UNCOUNTED;
    s->nposted++;
    return MR_OK;
}

/* Posts ring entries while staging buffers are free. */
mr_status_t mpi__data_post_all(mr_substrate_t *s)
{
    mr_status_t st;

    while ((st = data_post_next(s)) == MR_OK) {
    }
    return st == MR_AGAIN ? MR_OK : st;
}

/*
 * The application released a staging buffer delivered by progress_data_recvs()
 * (mpi_progress.c).
 */
void mpi__release_recv(mr_substrate_t *s, void *handle)
{
    unsigned buf = (unsigned)((uintptr_t)handle - 1);

    if (buf < s->nstage) s->stage_free[s->nstage_free++] = buf;
}
