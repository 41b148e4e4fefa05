/*
 * MPI errors: MPI's text and class for an error code, local failures that
 * break the substrate, and marking failed the peer a failed send or receive
 * blames (progress() then runs its peer_failed() upcall, in mpi_progress.c).
 */
#include "mpi_substrate.h"

#include <stdio.h>

/* Writes MPI's text for an error code into buf. */
static const char *mpi_errstr(int rc, char *buf, int len)
{
    int n = 0;

    if (MPI_Error_string(rc, buf, &n) != MPI_SUCCESS || n <= 0) {
        snprintf(buf, (size_t)len, "MPI error %d", rc);
    } else {
        buf[n < len ? n : len - 1] = '\0';
    }
    return buf;
}

static int mpi_errclass(int rc)
{
    int cls = rc;
    if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;
    return cls;
}

/* Logs a local MPI failure and marks the substrate broken. */
mr_status_t mpi__fatal(mr_substrate_t *s, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];

    MR__LOG(s, MR_LOG_ERROR, "MPI substrate: %s failed: %s.", what,
            mpi_errstr(rc, text, (int)sizeof(text)));
    s->broken = true;
    return MR_ERR_TRANSPORT;
}

/*
 * Marks `rank` failed; the next progress call reports it. Safe outside
 * progress() (from send()), since it runs no upcall.
 */
void mpi__peer_mark_failed(mr_substrate_t *s, int rank, mr_status_t why)
{
    if (rank < 0 || rank >= s->base.size || s->peer[rank] != PEER_OK) return;
    s->peer[rank] = PEER_FAIL_PENDING;
    mr__failq_push(&s->failq, rank, why);
    if (why == MR_ERR_PROTOCOL) s->base.rejected++;
}

/* A send to or a message from `rank` failed with MPI error `rc`. */
void mpi__peer_mpi_error(mr_substrate_t *s, int rank, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];

    if (rank < 0 || rank >= s->base.size || s->peer[rank] != PEER_OK) return;
    if (s->base.closing) {
        MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: %s rank %d failed while closing: %s.", what,
                rank, mpi_errstr(rc, text, (int)sizeof(text)));
    } else {
        MR__LOG(s, MR_LOG_WARN, "MPI substrate: %s rank %d failed: %s.", what, rank,
                mpi_errstr(rc, text, (int)sizeof(text)));
    }
    mpi__peer_mark_failed(s, rank, MR_ERR_PEER_FAILED);
}

/* A receive completed with an error: blame the sender if MPI names one. */
mr_status_t mpi__recv_error(mr_substrate_t *s, const MPI_Status *st, int rc, bool control)
{
    char text[MPI_MAX_ERROR_STRING];
    int src = st->MPI_SOURCE;

    if (src < 0 || src >= s->base.size) {
        return mpi__fatal(s, rc, control ? "a control receive" : "a data receive");
    }
    if (mpi_errclass(rc) == MPI_ERR_TRUNCATE) {
        if (s->peer[src] == PEER_OK) {
            if (control) {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a control message with a "
                        "payload; its messages are discarded from now on.", src);
            } else {
                MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d sent a message longer than the "
                        "datagram size, %zu bytes (is its MAILRAIL_DATAGRAM_SIZE larger?); its "
                        "messages are discarded from now on.", src, s->base.datagram_size);
            }
        }
        mpi__peer_mark_failed(s, src, MR_ERR_PROTOCOL);
        return MR_OK;
    }
    MR__LOG(s, MR_LOG_WARN, "MPI substrate: a %s receive from rank %d failed: %s.",
            control ? "control" : "data", src, mpi_errstr(rc, text, (int)sizeof(text)));
    mpi__peer_mark_failed(s, src, MR_ERR_PEER_FAILED);
    return MR_OK;
}
