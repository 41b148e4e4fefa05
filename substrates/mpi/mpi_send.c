/*
 * send() and send_control(): the send window, immediates too large for a
 * tag sent as control messages, and coalescing small messages into
 * batches (mr_batch.h). Their completions are handled by progress()
 * (mpi_progress.c).
 */
#include "mpi_substrate.h"

/* Checks what every send needs; MR_OK when `dest` may be sent to. */
static mr_status_t send_check(mr_substrate_t *s, int dest)
{
    mr_status_t st = mr__send_target_check(s, dest);

    if (st != MR_OK) return st;
    if (!s->connected) return MR_ERR_INVALID_RANK;
    if (s->broken) return MR_ERR_TRANSPORT;
    if (!peer_usable(s, dest)) return MR_ERR_PEER_FAILED;
    return MR_OK;
}

/*
 * Starts the zero-byte control sends that carry `imm` to `dest`, in parts
 * (mpi_ctrl_tag.h; mpi_ctrl.c puts them together). The caller has checked that the pool has
 * room for split_count(imm) of them.
 */
static mr_status_t ctrl_isend(mr_substrate_t *s, int dest, uint32_t imm)
{
    size_t parts = split_count(s, imm);

    for (size_t i = parts; i-- > 0;) {
        uint32_t tag = mpi__ctrl_tag_part(s->ctrl_bits, imm, i);
        size_t k = s->nctrl;
        int rc = MPI_Isend(&s->ctrl_dummy, 0, MPI_BYTE, dest, (int)tag, s->ctrl_comm,
                           &s->ctrl_req[k]);
        if (rc != MPI_SUCCESS) {
            s->ctrl_req[k] = MPI_REQUEST_NULL;
            mpi__peer_mpi_error(s, dest, rc, "a control send to");
            return MR_ERR_PEER_FAILED;
        }
        s->ctrl_dest[k] = dest;
        s->nctrl++;
    }
    if (parts > 1) s->split_imm++;
    return MR_OK;
}

/*
 * Moves the data sends still active to the front of the pool, in order,
 * keeping their side tables in step (completed ones are MPI_REQUEST_NULL).
 * Only when appending finds the end of the pool: progress() leaves holes.
 */
void mpi__sends_compact(mr_substrate_t *s)
{
    size_t j = 0;

    for (size_t i = s->send_first; i < s->nsend; i++) {
        if (s->send_req[i] == MPI_REQUEST_NULL) continue;
        if (i != j) {
            s->send_req[j] = s->send_req[i];
            s->send_cookie[j] = s->send_cookie[i];
            s->send_dest[j] = s->send_dest[i];
            s->send_mark[j] = s->send_mark[i];
            s->send_batch[j] = s->send_batch[i];
            s->send_req[i] = MPI_REQUEST_NULL;
        }
        j++;
    }
    s->send_first = 0;
    s->nsend = j;
}

/* Whether one more data message to `dest` fits the request pool and the send window. */
static bool data_can_send(const mr_substrate_t *s, int dest)
{
    return s->send_live < s->base.max_sends &&
           (s->send_window == 0 ||
            s->peer_sent[dest] + 1 - s->peer_matched[dest] <= s->send_window);
}

/*
 * Starts one data message with `tag`, as a marker (MPI_Issend) every
 * mark_every-th one to `dest`. It carries `batch`, or the single message of
 * `cookie` when `batch` is NULL. MR_AGAIN when data_can_send() says no.
 */
static mr_status_t data_isend(mr_substrate_t *s, int dest, uint32_t tag, const void *data,
                              size_t length, void *cookie, mr__batch_t *batch)
{
    uint64_t seq = s->peer_sent[dest] + 1;
    size_t k;
    bool mark;
    int rc;

    if (!data_can_send(s, dest)) return MR_AGAIN;
    if (s->nsend == s->base.max_sends) mpi__sends_compact(s);
    k = s->nsend;
    /* mark_every is a power of two unless the window is set to an odd size: no division then. */
    mark = s->send_window > 0 && ((s->mark_every & (s->mark_every - 1)) == 0
                                      ? (seq & (s->mark_every - 1)) == 0
                                      : seq % s->mark_every == 0);
    if (mark) {
        rc = MPI_Issend(data, (int)length, MPI_BYTE, dest, (int)tag, s->data_comm,
                        &s->send_req[k]);
    } else {
        rc = MPI_Isend(data, (int)length, MPI_BYTE, dest, (int)tag, s->data_comm,
                       &s->send_req[k]);
    }
    if (rc != MPI_SUCCESS) {
        s->send_req[k] = MPI_REQUEST_NULL;
        mpi__peer_mpi_error(s, dest, rc, "a data send to");
        return MR_ERR_PEER_FAILED;
    }
    s->send_cookie[k] = cookie;
    s->send_dest[k] = dest;
    s->send_mark[k] = mark ? seq : 0;
    s->send_batch[k] = batch;
    s->peer_sent[dest] = seq;
    s->nsend++;
    s->send_live++;
    return MR_OK;
}

/* Sends the batch being filled for `dest` as one message (MR_AGAIN: it stays open). */
static mr_status_t batch_send(mr_substrate_t *s, int dest)
{
    mr__batch_t *b = s->batcher.open[dest];
    mr_status_t st = data_isend(s, dest, s->batch_tag, b->data, mr__batcher_used(&s->batcher, dest),
                                 NULL, b);

    if (st == MR_OK) mr__batcher_detach(&s->batcher, dest);
    return st;
}

/* batch_send() for mr__batcher_route(). */
static mr_status_t batch_send_to(void *s, int dest)
{
    return batch_send(s, dest);
}

/*
 * At the start of a progress call: sends every batch being filled that the
 * window lets go; those to failed ranks complete unsent. Returns the events.
 */
int mpi__flush_batches(mr_substrate_t *s)
{
    int events = 0;

    /* Backwards: detaching moves the last open rank into the slot just visited. */
    for (unsigned i = s->batcher.nopen; i-- > 0;) {
        int dest = s->batcher.open_ranks[i];
        if (peer_usable(s, dest)) {
            batch_send(s, dest); /* Refused: it waits for the next call. */
        } else {
            events += batch_complete(s, mr__batcher_detach(&s->batcher, dest));
        }
    }
    return events;
}

mr_status_t mpi__send(mr_substrate_t *s, int dest, unsigned kind, uint32_t imm,
                      const void *data, size_t length, void *cookie)
{
    mr_status_t st = send_check(s, dest);
    uint32_t tag = imm;
    bool packed;

    if (st != MR_OK) return st;
    if (kind < MR_KIND_DATA || kind > MR_KIND_HANDLER || (data == NULL && length > 0)) {
        return MR_ERR_INVALID_PARAM;
    }
    if (length > s->base.datagram_size) return MR_ERR_MESSAGE_TOO_LONG;
    /* A small message after another to the same rank joins a batch (mr_batch.h). */
    st = mr__batcher_route(&s->batcher, dest, kind, imm, data, length, batch_send_to, s, &packed);
    if (st != MR_OK) return st;
    if (packed) return MR_SUBSTRATE_SENT;
    /* The receiver is a whole window behind: wait for a marker to complete. */
    if (!data_can_send(s, dest)) return MR_AGAIN;
    if (imm > s->data_imm_max) {
        /*
         * The credits do not fit in a tag: they go ahead as a control message
         * (a return means the same before or after the data: a count adds up,
         * a node's total only raises what was applied) and the data leaves
         * with tag 0. Both or neither: refuse if
         * the control pool cannot take the whole split now.
         */
        if (s->nctrl + split_count(s, imm) > s->max_ctrl) return MR_AGAIN;
        st = ctrl_isend(s, dest, imm);
        if (st != MR_OK) return st;
        tag = 0;
    }
    if (kind == MR_KIND_ITEMS) tag |= s->kind_bit;
    if (kind == MR_KIND_HANDLER) tag |= s->handler_bit;
    return data_isend(s, dest, tag, data, length, cookie, NULL);
}

mr_status_t mpi__send_control(mr_substrate_t *s, int dest, uint32_t imm)
{
    mr_status_t st = send_check(s, dest);

    if (st != MR_OK) return st;
    /*
     * After closing() every rank has finished sending data, so credits are
     * of no use to anybody. Dropping them keeps messages out of flight while
     * peers free their communicators: one arriving after that would wait in
     * MPI, and could be matched by a communicator of a later mr_init() that
     * reuses the freed one's context id.
     */
    if (s->base.closing) {
        s->dropped_ctrl++;
        return MR_OK;
    }
    if (s->nctrl + split_count(s, imm) > s->max_ctrl) return MR_AGAIN;
    return ctrl_isend(s, dest, imm);
}
