/*
 * open() and its steps (duplicating the communicators, reading MPI_TAG_UB,
 * applying the settings, allocating), the address blob, and connect().
 */
#include "mpi_substrate.h"

#include <sched.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The MPI substrate needs the MPI bootstrap's communicator, and MPI running. */
static mr_status_t mpi_check_bootstrap(const mr_substrate_params_t *p)
{
    int initialized = 0;

    if (p->bootstrap_comm == NULL) {
        if (p->log != NULL) {
            p->log(MR_LOG_ERROR, "MPI substrate: no MPI communicator from the bootstrap; the "
                   "MPI substrate needs the MPI bootstrap.");
        }
        return MR_ERR_UNSUPPORTED;
    }
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (p->log != NULL) p->log(MR_LOG_ERROR, "MPI substrate: MPI is not initialized.");
        return MR_ERR_TRANSPORT;
    }
    return MR_OK;
}

/*
 * MPI_Comm_dup, but waiting with the core given away between tests: MPICH's
 * blocking calls spin, and hundreds of spinning ranks on a few cores make
 * every collective take seconds (docs/scale.md).
 */
static int comm_dup_yielding(MPI_Comm base, MPI_Comm *out)
{
    MPI_Request req;
    int done = 0, rc = MPI_Comm_idup(base, out, &req);
    unsigned polls = 0;
    uint64_t nap_ns = mr__backoff_nap_ns(mr__launcher_local_ranks());

    while (rc == MPI_SUCCESS && !done) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !done) mr__backoff(&polls, nap_ns);
    }
    return rc;
}

/* No memory for the state: still takes part in both duplications, so that no rank hangs. */
static mr_status_t mpi_open_out_of_memory(const mr_substrate_params_t *p)
{
    MPI_Comm base, a, b;

    if (p->log != NULL) p->log(MR_LOG_ERROR, "MPI substrate: out of memory.");
    memcpy(&base, p->bootstrap_comm, sizeof(base));
    if (comm_dup_yielding(base, &a) == MPI_SUCCESS) MPI_Comm_free(&a);
    if (comm_dup_yielding(base, &b) == MPI_SUCCESS) MPI_Comm_free(&b);
    return MR_ERR_NO_MEMORY;
}

/*
 * Duplicates the bootstrap's communicator for data and for control, both
 * returning errors as codes. Collective: every rank makes both calls.
 */
static mr_status_t mpi_dup_comms(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    MPI_Comm base;
    int rc;

    memcpy(&base, p->bootstrap_comm, sizeof(base));
    rc = comm_dup_yielding(base, &s->data_comm);
    if (rc != MPI_SUCCESS) {
        s->data_comm = MPI_COMM_NULL;
        mr_status_t st = mpi__fatal(s, rc, "duplicating the communicator for data (MPI_Comm_dup)");
        /* The second duplication still takes place, as on the other ranks. */
        MPI_Comm b;
        if (comm_dup_yielding(base, &b) == MPI_SUCCESS) MPI_Comm_free(&b);
        return st;
    }
    s->have_data_comm = true;
    rc = comm_dup_yielding(base, &s->ctrl_comm);
    if (rc != MPI_SUCCESS) {
        s->ctrl_comm = MPI_COMM_NULL;
        return mpi__fatal(s, rc, "duplicating the communicator for control (MPI_Comm_dup)");
    }
    s->have_ctrl_comm = true;
    MPI_Comm_set_errhandler(s->data_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(s->ctrl_comm, MPI_ERRORS_RETURN);
    return MR_OK;
}

/* The local checks, after the collectives: parameters, and rank and size as MPI sees them. */
static mr_status_t mpi_check_params(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    int crank = -1, csize = -1;

    if (!mr_substrate_params_valid(p, "MPI substrate", INT32_MAX, false)) {
        return MR_ERR_INVALID_PARAM;
    }
    MPI_Comm_rank(s->data_comm, &crank);
    MPI_Comm_size(s->data_comm, &csize);
    if (crank != p->rank || csize != p->size) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: the bootstrap communicator has this process as "
                "rank %d of %d, the core says rank %d of %d.", crank, csize, p->rank, p->size);
        return MR_ERR_INVALID_PARAM;
    }
    return MR_OK;
}

static mr_status_t mpi_read_tag_ub(mr_substrate_t *s)
{
    int *ub = NULL, flag = 0;
    int rc = MPI_Comm_get_attr(s->data_comm, MPI_TAG_UB, &ub, &flag);

    if (rc != MPI_SUCCESS || !flag || ub == NULL || *ub < 32767) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: cannot read MPI_TAG_UB.");
        return MR_ERR_TRANSPORT;
    }
    s->tag_ub = *ub;
    /*
     * The two highest bits that keep every data tag within the bound tell the
     * kind (neither: data; the higher: items; the lower: a handler's message);
     * the bits below carry the immediate, and all bits set mark a batch.
     */
    s->kind_bit = 1;
    while ((uint64_t)s->kind_bit * 4 - 1 <= (uint64_t)s->tag_ub) s->kind_bit *= 2;
    s->handler_bit = s->kind_bit >> 1;
    s->data_imm_ub = s->handler_bit - 1;
    s->data_imm_max = s->handler_bit - 2;
    s->batch_tag = s->kind_bit | s->handler_bit | s->data_imm_ub;
    s->ctrl_bits = mpi__ctrl_tag_bits((uint64_t)s->tag_ub);
    return MR_OK;
}

/* The receive ring's length and the send window, from the settings. */
static void mpi_apply_settings(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    s->coalesce_bytes = p->coalesce_bytes;
    s->nrecv = (unsigned)s->cfg.max_recvs;
    if (s->nrecv == 0) {
        size_t n = MRMPI_AUTO_RECV_BYTES / p->datagram_size;
        s->nrecv = n < MRMPI_AUTO_RECVS_MIN ? MRMPI_AUTO_RECVS_MIN
                   : n > MRMPI_AUTO_RECVS_MAX ? MRMPI_AUTO_RECVS_MAX : (unsigned)n;
    }
    s->send_window = s->cfg.send_window;
    s->mark_every = s->send_window / MRMPI_MARKS_PER_WINDOW;
    if (s->mark_every == 0) s->mark_every = 1;
    /* Staged messages beyond the receive pool could not be delivered anyway. */
    if (p->recv_slots > 0 && s->nrecv > p->recv_slots) s->nrecv = (unsigned)p->recv_slots;
    /* Room for one whole split immediate besides the ordinary control sends. */
    s->max_ctrl = MRMPI_CTRL_SENDS + split_count(s, UINT32_MAX);
}

/* Everything the data path needs, allocated once. */
static mr_status_t mpi_alloc_buffers(mr_substrate_t *s)
{
    size_t max_sends = s->base.max_sends, scratch = max_sends;

    if (s->max_ctrl > scratch) scratch = s->max_ctrl;
    if (scratch < s->nrecv) scratch = s->nrecv;
    if (max_sends > INT32_MAX || (size_t)s->nrecv > SIZE_MAX / 2 / s->base.datagram_size) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: %zu send slots or %u staging buffers of %zu "
                "bytes are too many.", max_sends, s->nrecv, s->base.datagram_size);
        return MR_ERR_INVALID_PARAM;
    }
    s->recvs = calloc(s->nrecv, sizeof(*s->recvs));
    s->recv_req = malloc(s->nrecv * sizeof(*s->recv_req));
    s->nstage = 2 * s->nrecv;
    s->staging = malloc((size_t)s->nstage * s->base.datagram_size);
    s->stage_free = malloc(s->nstage * sizeof(*s->stage_free));
    s->send_req = malloc(max_sends * sizeof(*s->send_req));
    s->send_cookie = malloc(max_sends * sizeof(*s->send_cookie));
    s->send_dest = malloc(max_sends * sizeof(*s->send_dest));
    s->send_mark = malloc(max_sends * sizeof(*s->send_mark));
    s->send_batch = malloc(max_sends * sizeof(*s->send_batch));
    s->ctrl_req = malloc(s->max_ctrl * sizeof(*s->ctrl_req));
    s->ctrl_dest = malloc(s->max_ctrl * sizeof(*s->ctrl_dest));
    s->ctrl_acc = calloc((size_t)s->base.size, sizeof(*s->ctrl_acc));
    s->indices = malloc(scratch * sizeof(*s->indices));
    s->statuses = malloc(scratch * sizeof(*s->statuses));
    s->done_cookie = malloc(max_sends * sizeof(*s->done_cookie));
    s->done_batch = malloc(max_sends * sizeof(*s->done_batch));
    s->done_dest = malloc(max_sends * sizeof(*s->done_dest));
    s->done_err = malloc(max_sends * sizeof(*s->done_err));
    s->peer = calloc((size_t)s->base.size, sizeof(*s->peer));
    s->peer_sent = calloc((size_t)s->base.size, sizeof(*s->peer_sent));
    s->peer_matched = calloc((size_t)s->base.size, sizeof(*s->peer_matched));
    if (s->recvs == NULL || s->recv_req == NULL || s->staging == NULL ||
        s->stage_free == NULL || s->send_req == NULL ||
        s->send_cookie == NULL || s->send_dest == NULL || s->send_mark == NULL ||
        s->send_batch == NULL || s->done_batch == NULL ||
        s->peer_sent == NULL || s->peer_matched == NULL || s->ctrl_req == NULL ||
        s->ctrl_dest == NULL || s->ctrl_acc == NULL || s->indices == NULL || s->statuses == NULL ||
        s->done_cookie == NULL || s->done_dest == NULL || s->done_err == NULL ||
        s->peer == NULL || mr__failq_init(&s->failq, s->base.size) != MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: out of memory for %u staging buffers of %zu "
                "bytes (MAILRAIL_MAX_RECVS) and %zu sends.", s->nrecv, s->base.datagram_size,
                max_sends);
        return MR_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < s->nrecv; i++) s->recv_req[i] = MPI_REQUEST_NULL;
    for (unsigned b = 0; b < s->nstage; b++) s->stage_free[b] = s->nstage - 1 - b;
    s->nstage_free = s->nstage;
    size_t cap = s->base.datagram_size < MRMPI_BATCH_BYTES ? s->base.datagram_size
                                                            : MRMPI_BATCH_BYTES;
    if (mr__batcher_init(&s->batcher, s->base.size, MRMPI_BATCHES, cap, s->coalesce_bytes) !=
        MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "MPI substrate: out of memory for %u batches of %zu bytes "
                "(MAILRAIL_COALESCE_BYTES).", MRMPI_BATCHES, cap);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

mr_status_t mpi__open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s;
    mr_status_t st;

    if (p == NULL || out == NULL) return MR_ERR_INVALID_PARAM;
    st = mpi_check_bootstrap(p);
    if (st != MR_OK) return st;
    s = calloc(1, sizeof(*s));
    if (s == NULL) return mpi_open_out_of_memory(p);
    mr__base_init(&s->base, p);
    s->data_comm = s->ctrl_comm = MPI_COMM_NULL;
    s->wake_fd = -1;
    /*
     * MPI_Comm_dup is collective: every check that could fail on some ranks
     * only comes after it, so that no rank is left waiting in it. The core
     * then agrees on the outcome and closes the substrate everywhere.
     */
    st = mpi_dup_comms(s, p);
    if (st == MR_OK) st = mpi_check_params(s, p);
    if (st == MR_OK) st = mpi_read_tag_ub(s);
    if (st == MR_OK) {
        mpi_apply_settings(s, p);
        st = mpi_alloc_buffers(s);
    }
    if (st != MR_OK) {
        mpi__close(s);
        return st;
    }
    MR__LOG(s, MR_LOG_DEBUG, "MPI substrate: rank %d of %d, MPI_TAG_UB %d, %u receives posted "
            "into %zu bytes of staging, %zu data and %zu control send requests.", s->base.rank,
            s->base.size, s->tag_ub, s->nrecv, (size_t)s->nrecv * s->base.datagram_size,
            s->base.max_sends, s->max_ctrl);
    *out = s;
    return MR_OK;
}

mr_status_t mpi__get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    mpi_wire_addr_t w;

    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    memset(&w, 0, sizeof(w));
    w.magic = MRMPI_ADDR_MAGIC;
    w.version = MRMPI_ADDR_VERSION;
    w.datagram_size = s->base.datagram_size;
    w.pid = (int32_t)getpid();
    if (gethostname(w.host, sizeof(w.host)) != 0) w.host[0] = '\0';
    w.host[sizeof(w.host) - 1] = '\0';
    memcpy(addr, &w, sizeof(w));
    *length = sizeof(w);
    return MR_OK;
}

static bool wire_addr_parse(const void *blob, size_t length, mpi_wire_addr_t *out)
{
    if (blob == NULL || length < offsetof(mpi_wire_addr_t, host)) return false;
    memset(out, 0, sizeof(*out));
    memcpy(out, blob, length < sizeof(*out) ? length : sizeof(*out));
    out->host[sizeof(out->host) - 1] = '\0';
    return out->magic == MRMPI_ADDR_MAGIC && out->version == MRMPI_ADDR_VERSION;
}

void mpi__format_address(const void *addr, size_t length, char *buf, size_t len)
{
    mpi_wire_addr_t w;

    if (buf == NULL || len == 0) return;
    if (!wire_addr_parse(addr, length, &w)) {
        snprintf(buf, len, "mpi (not an MPI substrate address)");
        return;
    }
    snprintf(buf, len, "mpi rank-addressed (pid %d on %s)", (int)w.pid,
             w.host[0] ? w.host : "?");
}

/*
 * Nothing to connect: MPI addresses ranks. Checks the address table and
 * posts the receives.
 */
mr_status_t mpi__connect(mr_substrate_t *s, const void *addrs, size_t addr_len)
{
    if (s == NULL || s->connected) return MR_ERR_INVALID_PARAM;
    for (int r = 0; r < s->base.size; r++) {
        mpi_wire_addr_t w;
        if (addrs == NULL ||
            !wire_addr_parse((const uint8_t *)addrs + (size_t)r * addr_len, addr_len, &w)) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: the address of rank %d is not an MPI "
                    "substrate address (does every rank use MAILRAIL_SUBSTRATE=mpi?).", r);
            return MR_ERR_PROTOCOL;
        }
        /*
         * A larger datagram elsewhere would truncate receives here, which
         * MPICH 4.0 turns into an abort of the job (see docs/substrate-mpi.md).
         */
        if (w.datagram_size != s->base.datagram_size) {
            MR__LOG(s, MR_LOG_ERROR, "MPI substrate: rank %d has MAILRAIL_DATAGRAM_SIZE=%llu, "
                    "rank %d has %zu; every rank must use the same datagram size.", r,
                    (unsigned long long)w.datagram_size, s->base.rank, s->base.datagram_size);
            return MR_ERR_CONFIG;
        }
    }
    if (s->base.size > 1) {
        s->head = 0;
        s->nposted = 0;
        s->lead_done = 0;
        if (mpi__data_post_all(s) != MR_OK) return MR_ERR_TRANSPORT;
        s->data_posted = true;
        s->ctrl_probing = true;
    }
    s->connected = true;
    return MR_OK;
}
