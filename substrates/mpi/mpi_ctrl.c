/*
 * The MPI substrate's control receives: credits and failure notices that
 * arrive on the control communicator, probed for rather than posted
 * (mpi_substrate.h lists the other files).
 */
#include "mpi_substrate.h"

#include <stdlib.h>

/*
 * Receives one control message that MPI_Improbe found, `st` its status.
 * Returns the source to credit, -1 for none, or a negative status below -1.
 */
static int ctrl_take(mr_substrate_t *s, MPI_Message *msg, const MPI_Status *st)
{
    int src = st->MPI_SOURCE, count = 0, rc;
    MPI_Status rst;

    if (src < 0 || src >= s->base.size) {
        mpi__fatal(s, MPI_ERR_RANK, "a control receive");
        return MR_ERR_TRANSPORT;
    }
    if (MPI_Get_count(st, MPI_BYTE, &count) != MPI_SUCCESS) count = 0;
    if (count > 0) {
        /* A payload: receive it whole (no truncation error from MPI), then reject the sender. */
        void *junk = malloc((size_t)count);
        if (junk == NULL) {
            mpi__fatal(s, MPI_ERR_NO_MEM, "a control receive");
            return MR_ERR_TRANSPORT;
        }
        rc = MPI_Mrecv(junk, count, MPI_BYTE, msg, &rst);
        free(junk);
        if (rc == MPI_SUCCESS) rc = MPI_ERR_TRUNCATE;
        return mpi__recv_error(s, st, rc, true) == MR_OK ? -1 : MR_ERR_TRANSPORT;
    }
    rc = MPI_Mrecv(&s->ctrl_dummy, 0, MPI_BYTE, msg, &rst);
    if (rc != MPI_SUCCESS) {
        return mpi__recv_error(s, st, rc, true) == MR_OK ? -1 : MR_ERR_TRANSPORT;
    }
    return src;
}

/*
 * Receives the control messages waiting in MPI, at most MRMPI_CTRL_BURST.
 * No receive is kept posted for them: posted any-source, any-tag receives
 * sit in UCX's list of wildcard receives ahead of the data ring's (which are
 * posted again and again behind them), and every arriving data message was
 * compared with each of them before it found its own. MPI_Improbe costs no
 * progress pass when it finds a message and one when it finds none, as the
 * MPI_Testsome over the posted receives did.
 */
int mpi__progress_ctrl_recvs(mr_substrate_t *s)
{
    int events = 0;

    if (!s->ctrl_probing) return 0;
    for (unsigned k = 0; k < MRMPI_CTRL_BURST; k++) {
        MPI_Message msg = MPI_MESSAGE_NULL;
        MPI_Status st;
        int flag = 0, src;
        int rc = MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, s->ctrl_comm, &flag, &msg, &st);

        if (rc != MPI_SUCCESS) {
            if (!flag || st.MPI_SOURCE < 0 || st.MPI_SOURCE >= s->base.size) {
                return mpi__fatal(s, rc, "probing for control messages (MPI_Improbe)");
            }
            if (mpi__recv_error(s, &st, rc, true) != MR_OK) return MR_ERR_TRANSPORT;
            continue;
        }
        if (!flag) break;
        src = ctrl_take(s, &msg, &st);
        if (src < -1) return src;
        if (src < 0) continue;
        if (!peer_usable(s, src)) {
            s->discarded++;
            continue;
        }
        /* A part of a split immediate (mpi_send.c): the rest follows, in order. */
        uint32_t imm;
        if (!mpi__ctrl_tag_join(s->ctrl_bits, &s->ctrl_acc[src], (uint32_t)st.MPI_TAG, &imm)) {
            continue;
        }
        s->base.up.control(s->base.core, src, imm);
        events++;
    }
    return events;
}
