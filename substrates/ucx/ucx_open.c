/*
 * The UCX substrate's open() and its steps, and its address: written at open,
 * formatted for logs (ucx_substrate.h lists the other files).
 */
#include "ucx_substrate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* open() and its steps.                                                    */

/* Copies the settings and learns the host's identity; nothing is open yet. */
static void ucx_init_state(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    s->efd = -1;
    s->epfd = -1;
    memcpy(&s->cfg, p->config, sizeof(s->cfg));
    /* Above MAILRAIL_UCX_BARE_MAX_RANKS (at most what 16-bit AM ids name), the large-job path. */
    s->bare_ids = (uint64_t)s->base.size <= s->cfg.bare_max_ranks;
    s->bare = s->cfg.bare && s->bare_ids;
    /* Not authentication: only keeps ranks of two jobs from taking each other for peers. */
    ucx__host_identity(&s->boot_hash, &s->pidns);
}

/* Peers and queues: nothing on the data path is allocated later (but the queues' growth). */
static mr_status_t ucx_alloc_queues(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    s->nctrl = 2 * (size_t)s->base.size;
    if (s->nctrl < UCX_CTRL_SLOTS_MIN) s->nctrl = UCX_CTRL_SLOTS_MIN;
    if (s->nctrl > UCX_CTRL_SLOTS_MAX) s->nctrl = UCX_CTRL_SLOTS_MAX;
    s->nrreqs = p->recv_slots < UCX_RREQS_MAX ? p->recv_slots : UCX_RREQS_MAX;
    /*
     * Entries that own a slot are at most recv_slots, and waiting ones only
     * exist under MAILRAIL_FLOWCTL=none, a burst at a time: the queue only
     * grows in odd cases.
     */
    s->rxq_cap = 1;
    while (s->rxq_cap < UCX_RXQ_MAX_INIT && s->rxq_cap < p->recv_slots + UCX_RXQ_SLACK) {
        s->rxq_cap *= 2;
    }
    s->peers = calloc((size_t)s->base.size, sizeof(*s->peers));
    s->rxq = malloc(s->rxq_cap * sizeof(*s->rxq));
    s->spill_cap = (size_t)s->cfg.spill_size;
    s->spill = s->spill_cap ? malloc(s->spill_cap) : NULL;
    s->hfront_cap = p->datagram_size < UCX_WIRE_HFRONT_MAX ? p->datagram_size
                                                            : UCX_WIRE_HFRONT_MAX;
    s->hfront_scratch = malloc(s->hfront_cap);
    if (s->peers == NULL || mr__failq_init(&s->failq, s->base.size) != MR_OK || s->rxq == NULL ||
        (s->spill_cap && s->spill == NULL) || s->hfront_scratch == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %d peers.", s->base.size);
        return MR_ERR_NO_MEMORY;
    }
    for (int r = 0; r < s->base.size; r++) {
        s->peers[r].s = s;
        s->peers[r].rank = r;
        s->peers[r].pidfd = -1;
    }
    size_t cap = p->datagram_size < UCX_BATCH_BYTES ? p->datagram_size : UCX_BATCH_BYTES;
    if (mr__batcher_init(&s->batcher, s->base.size, UCX_BATCHES, cap, p->coalesce_bytes) !=
        MR_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %u batches of %zu bytes "
                "(MAILRAIL_COALESCE_BYTES).", UCX_BATCHES, cap);
        return MR_ERR_NO_MEMORY;
    }
    return MR_OK;
}

/* The UCP context, from MAILRAIL_UCX_<NAME> over UCX_<NAME>; sets the request size. */
static mr_status_t ucx_create_context(mr_substrate_t *s, const mr_substrate_params_t *p)
{
    ucp_config_t *config = NULL;
    ucp_params_t cparams;
    ucp_context_attr_t cattr;
    size_t ppn = 0;
    ucs_status_t us;

    for (int r = 0; r < s->base.size; r++) {
        if (p->node_of_rank == NULL || p->node_of_rank[r] == p->node_of_rank[s->base.rank]) ppn++;
    }
    ucx__mark_own_settings();
    us = ucp_config_read(UCX_ENV_PREFIX, NULL, &config);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: cannot read the UCX settings (UCX_* and "
                "MAILRAIL_UCX_*): %s.", ucs_status_string(us));
        return MR_ERR_CONFIG;
    }
    memset(&cparams, 0, sizeof(cparams));
    cparams.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                         UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_ESTIMATED_NUM_PPN |
                         UCP_PARAM_FIELD_NAME;
    cparams.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    cparams.mt_workers_shared = 0;
    cparams.estimated_num_eps = (size_t)s->base.size;
    cparams.estimated_num_ppn = ppn ? ppn : 1;
    cparams.name = "mailrail";
    us = ucp_init(&cparams, config, &s->context);
    ucp_config_release(config);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_init failed: %s (check MAILRAIL_UCX_TLS and "
                "UCX_TLS).", ucs_status_string(us));
        s->context = NULL;
        return MR_ERR_TRANSPORT;
    }
    memset(&cattr, 0, sizeof(cattr));
    cattr.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE;
    us = ucp_context_query(s->context, &cattr);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_context_query failed: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    s->ucx_req_size = cattr.request_size;
    return MR_OK;
}

/* One single-threaded worker, and the epoll set over its wake-up fd (if any). */
static mr_status_t ucx_create_worker(mr_substrate_t *s)
{
    ucp_worker_params_t wparams;
    ucs_status_t us;

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(s->context, &wparams, &s->worker);
    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_worker_create failed: %s.",
                ucs_status_string(us));
        s->worker = NULL;
        return MR_ERR_TRANSPORT;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: epoll_create1 failed: %s.", strerror(errno));
        return MR_ERR_TRANSPORT;
    }
    us = ucp_worker_get_efd(s->worker, &s->efd);
    if (us == UCS_OK) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
        if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->efd, &ev) != 0) s->efd = -1;
    } else {
        s->efd = -1;
    }
    if (s->efd < 0) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: no wake-up fd from UCX (%s); an idle progress "
                "call yields instead of sleeping.", ucs_status_string(us));
    }
    return MR_OK;
}

/* This rank's address blob: the header and the worker's address (see ucx_wire.h). */
static mr_status_t ucx_make_address(mr_substrate_t *s)
{
    ucp_address_t *uaddr = NULL;
    size_t ualen = 0;
    ucs_status_t us = ucp_worker_get_address(s->worker, &uaddr, &ualen);

    if (us != UCS_OK) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: ucp_worker_get_address failed: %s.",
                ucs_status_string(us));
        return MR_ERR_TRANSPORT;
    }
    if (ualen > MR_SUBSTRATE_ADDR_MAX - UCX_WIRE_ADDR_HDR_LEN) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: the UCX worker address is %zu bytes, more than "
                "the %d bytes MailRail can exchange; restrict the transports or devices it "
                "advertises, e.g. MAILRAIL_UCX_TLS=sm,self,tcp or MAILRAIL_UCX_NET_DEVICES.",
                ualen, MR_SUBSTRATE_ADDR_MAX - UCX_WIRE_ADDR_HDR_LEN);
        ucp_worker_release_address(s->worker, uaddr);
        return MR_ERR_CONFIG;
    }
    ucx_wire_addr_t w = {.pid = (uint32_t)getpid(), .boot_hash = s->boot_hash,
                         .pidns = s->pidns, .worker = (const uint8_t *)uaddr, .worker_len = ualen};
    s->addr_len = mr__ucx_wire_addr_encode(s->addr, &w);
    ucp_worker_release_address(s->worker, uaddr);
    return MR_OK;
}

static ucx_rreq_t *rreq_at(mr_substrate_t *s, size_t i)
{
    return (ucx_rreq_t *)(void *)(s->rreq_mem + i * s->rreq_stride +
                                  align_up(s->ucx_req_size, 64));
}

/* Send and receive state, handed to UCX as user-allocated requests. */
static mr_status_t ucx_alloc_requests(mr_substrate_t *s)
{
    s->sreq_stride = align_up(s->ucx_req_size, 64) + align_up(sizeof(ucx_sreq_t), 64);
    s->rreq_stride = align_up(s->ucx_req_size, 64) + align_up(sizeof(ucx_rreq_t), 64);
    s->rreq_mem = aligned_alloc(64, s->rreq_stride * s->nrreqs);
    if (ucx__sreq_block_add(s, s->base.max_sends, s->nctrl) != MR_OK || s->rreq_mem == NULL) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: out of memory for %zu sends.", s->base.max_sends);
        return MR_ERR_NO_MEMORY;
    }
    memset(s->rreq_mem, 0, s->rreq_stride * s->nrreqs);
    for (size_t i = s->nrreqs; i-- > 0;) {
        ucx__rreq_free(s, rreq_at(s, i));
    }
    return MR_OK;
}

mr_status_t ucx__open(const mr_substrate_params_t *p, mr_substrate_t **out)
{
    mr_substrate_t *s = NULL;
    mr_status_t st = mr__substrate_alloc(p, sizeof(*s), "UCX substrate", UINT32_MAX, true, &s);

    if (st != MR_OK) return st;
    if (p->recv_slots == 0) {
        MR__LOG(s, MR_LOG_ERROR, "UCX substrate: no receive slots.");
        free(s);
        return MR_ERR_INVALID_PARAM;
    }
    ucx_init_state(s, p);
    st = ucx_alloc_queues(s, p);
    if (st == MR_OK) st = ucx_create_context(s, p);
    if (st == MR_OK) st = ucx_create_worker(s);
    if (st == MR_OK) st = ucx__set_handlers(s);
    if (st == MR_OK) st = ucx_make_address(s);
    if (st == MR_OK) st = ucx_alloc_requests(s);
    if (st != MR_OK) {
        ucx__close(s);
        return st;
    }
    if (mr__log_enabled(&s->base, MR_LOG_DEBUG)) {
        MR__LOG(s, MR_LOG_DEBUG, "UCX substrate: rank %d has a %zu-byte worker address, error mode "
                "%s, %zu-byte UCX requests.", s->base.rank, s->addr_len - UCX_WIRE_ADDR_HDR_LEN,
                ucx__error_modes[s->cfg.error_mode], s->ucx_req_size);
    }
    *out = s;
    return MR_OK;
}

/* ------------------------------------------------------------------------ */
/* The address: get_address() and format_address().                         */

mr_status_t ucx__get_address(mr_substrate_t *s, void *addr, size_t *length)
{
    if (s == NULL || addr == NULL || length == NULL) return MR_ERR_INVALID_PARAM;
    memcpy(addr, s->addr, s->addr_len);
    *length = s->addr_len;
    return MR_OK;
}

void ucx__format_address(const void *addr, size_t length, char *buf, size_t len)
{
    ucx_wire_addr_t w;

    if (buf == NULL || len == 0) return;
    if (mr__ucx_wire_addr_decode(addr, length, &w, NULL) != MR_OK) {
        snprintf(buf, len, "ucx (not a UCX substrate address)");
        return;
    }
    snprintf(buf, len, "ucx worker address (%zu bytes, digest %08x), pid %u", w.worker_len,
             (unsigned)(mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, w.worker, w.worker_len) &
                        0xffffffffu),
             (unsigned)w.pid);
}
