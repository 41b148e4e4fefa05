/*
 * close(): cancelling receives and waiting for requests, each wait bounded
 * so that a dead peer cannot hang it, dropping unmatched messages, freeing.
 */
#include "mpi_substrate.h"

#include <sched.h>
#include <stdlib.h>

/*
 * Waits until `req` completes or `deadline` passes. Returns whether it
 * completed; if not, the request is left to MPI (MPI_Request_free).
 */
static bool wait_bounded(MPI_Request *req, uint64_t deadline)
{
    unsigned rounds = 0;

    while (*req != MPI_REQUEST_NULL) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (flag || rc != MPI_SUCCESS) {
            if (rc != MPI_SUCCESS && *req != MPI_REQUEST_NULL) MPI_Request_free(req);
            *req = MPI_REQUEST_NULL;
            return rc == MPI_SUCCESS;
        }
        if (mr__now_ns() >= deadline) {
            MPI_Request_free(req);
            *req = MPI_REQUEST_NULL;
            return false;
        }
        if (++rounds < MRMPI_SPIN_YIELDS) sched_yield();
        else nap(MRMPI_NAP_NS);
    }
    return true;
}

/*
 * Receives and throws away what is waiting unmatched on `comm`, each within
 * `deadline`. Sets *leak when a receive into the staging memory could not
 * complete (MPI may still write into it).
 */
static unsigned drain_unexpected(mr_substrate_t *s, MPI_Comm comm, uint64_t deadline,
                                 bool *leak)
{
    unsigned n = 0;

    while (!*leak && mr__now_ns() < deadline) {
        MPI_Message msg;
        MPI_Status st;
        MPI_Request req = MPI_REQUEST_NULL;
        int flag = 0, count = 0, rc;

        if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &msg, &st) != MPI_SUCCESS ||
            !flag) {
            break;
        }
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (count > 0 && s->staging != NULL && (size_t)count <= s->base.datagram_size) {
            rc = MPI_Imrecv(s->staging, count, MPI_BYTE, &msg, &req);
        } else {
            /* Zero bytes, or a longer message cut short: MPI reports truncation, fine here. */
            rc = MPI_Imrecv(&s->ctrl_dummy, 0, MPI_BYTE, &msg, &req);
        }
        if (rc != MPI_SUCCESS) break;
        /* A large message needs its (maybe dead) sender to finish: never wait unbounded. */
        if (!wait_bounded(&req, deadline) && count > 0) *leak = true;
        n++;
    }
    return n;
}

void mpi__close(mr_substrate_t *s)
{
    uint64_t deadline;
    bool leak_staging = false, leak_batches = false;
    unsigned stuck = 0, dropped = 0;

    if (s == NULL) return;
    /* No upcalls here: slots and send buffers go away with the core's pools. */
    deadline = mr__now_ns() + MRMPI_CLOSE_WAIT_NS;
    if (s->recvs != NULL) {
        for (unsigned i = 0; i < s->nrecv; i++) {
            mpi_recv_t *e = &s->recvs[i];
            if (!e->posted) continue;
            MPI_Cancel(&s->recv_req[i]);
            if (!wait_bounded(&s->recv_req[i], deadline)) {
                stuck++;
                leak_staging = true; /* MPI may still write into it. */
            }
            e->posted = false;
        }
    }
    s->ctrl_probing = false;
    /* Sends still in flight: control sends have no buffer; data sends only after a failure. */
    for (size_t i = 0; i < s->nctrl; i++) {
        if (!wait_bounded(&s->ctrl_req[i], deadline)) stuck++;
    }
    s->nctrl = 0;
    for (size_t i = 0; i < s->nsend; i++) {
        if (wait_bounded(&s->send_req[i], deadline)) continue;
        stuck++;
        if (s->send_batch[i] != NULL) leak_batches = true; /* MPI may still read it. */
    }
    s->nsend = s->send_first = s->send_live = 0;
    /*
     * Messages nobody will receive: drop them now, so that a communicator
     * created later with the same context id cannot match them.
     */
    if (s->have_data_comm && !leak_staging) {
        dropped += drain_unexpected(s, s->data_comm, deadline, &leak_staging);
    }
    if (s->have_ctrl_comm) dropped += drain_unexpected(s, s->ctrl_comm, deadline, &leak_staging);
    if (stuck > 0) {
        MR__LOG(s, s->base.closing ? MR_LOG_WARN : MR_LOG_DEBUG,
                "MPI substrate: %u requests did not complete at close and were left to MPI.",
                stuck);
    }
    if (dropped > 0 || s->discarded > 0 || s->dropped_ctrl > 0 || s->split_imm > 0) {
        MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: %u unmatched messages dropped at close, %llu "
                "messages from failed ranks discarded, %llu credit returns not sent while "
                "closing, %llu immediates split into control messages.", dropped,
                (unsigned long long)s->discarded, (unsigned long long)s->dropped_ctrl,
                (unsigned long long)s->split_imm);
    }
    if (s->have_data_comm) MPI_Comm_free(&s->data_comm);
    if (s->have_ctrl_comm) MPI_Comm_free(&s->ctrl_comm);
    free(s->recvs);
    free(s->recv_req);
    free(s->stage_free);
    if (!leak_staging) free(s->staging);
    free(s->send_req);
    free(s->send_cookie);
    free(s->send_dest);
    free(s->send_mark);
    free(s->send_batch);
    if (!leak_batches) mr__batcher_fini(&s->batcher);
    free(s->ctrl_req);
    free(s->ctrl_dest);
    free(s->ctrl_acc);
    free(s->indices);
    free(s->statuses);
    free(s->done_cookie);
    free(s->done_batch);
    free(s->done_dest);
    free(s->done_err);
    free(s->peer);
    mr__failq_fini(&s->failq);
    free(s->peer_sent);
    free(s->peer_matched);
    free(s);
}
