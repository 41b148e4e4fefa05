/*
 * The MailRail runtime: init and finalize, the send and receive paths, the
 * progress engine, quiescence and statistics.
 *
 * One message's path: mr_reserve() takes a send-pool slot; mr_send() either
 * hands it to the substrate (after flow control granted a credit) or appends
 * it to the deferred queue of its destination; the substrate completes the
 * send in a later progress call and the slot returns to the pool. At the
 * receiver the substrate copies the payload into a receive-pool slot it took
 * through recv_slot_acquire() and delivers it; the slot joins the arrival
 * queue, mr_receive() hands it out in arrival order and mr_release() returns
 * it to the pool, telling flow control that a credit was consumed.
 */
#include "mailrail.h"
#include "mr_bootstrap.h"
#include "mr_config.h"
#include "mr_flowctl.h"
#include "mr_log.h"
#include "mr_plugin.h"
#include "mr_pool.h"
#include "mr_substrate.h"
#include "mr_time.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

enum rt_state { RT_UNINITIALIZED, RT_READY, RT_FINALIZED };

/* Where a send slot is in its life. */
enum send_state { SEND_FREE, SEND_RESERVED, SEND_DEFERRED, SEND_INFLIGHT };

/* Where a receive slot is in its life. */
enum recv_state { RECV_FREE, RECV_FILLING, RECV_QUEUED, RECV_HELD };

typedef struct rt_send {
    uint8_t state;
    int32_t dest;
    uint32_t length;
} rt_send_t;

typedef struct rt_recv {
    uint8_t state;
    int32_t source;
    uint32_t length;
    uint32_t next;      /* Next in the arrival queue. */
    void *data;         /* The slot, or the substrate's buffer when `handle` is set. */
    void *handle;       /* Substrate-owned buffer, released through release_recv(). */
    void *foreign;      /* The substrate's buffer this slot last stood for, kept in
                           rt.foreign after release so that a double release is
                           recognised; NULL if none. */
} rt_recv_t;

/* Peer health, per rank. */
enum peer_state { PEER_OK, PEER_FAILED_UNREPORTED, PEER_FAILED_REPORTED };

#define RT_HOST_MAX 64
#define RT_JOB_ID_MAX 40

typedef struct rt_runtime {
    mr_core_config_t cfg;
    int rank, size, node_count;
    int *node_of;
    int *host_of;          /* Physical host index per rank. */
    uint8_t job_key[MR_JOB_KEY_LEN];
    char job_id[RT_JOB_ID_MAX];

    void *bootstrap_dl;
    const mr_bootstrap_ops_t *bootstrap;
    mr_bootstrap_t *bs;

    void *substrate_dl;
    const mr_substrate_ops_t *substrate;
    mr_substrate_t *sub;
    void *substrate_config;
    char *addrs;        /* size * addr_len bytes. */
    size_t addr_len;

    const mr_flowctl_ops_t *flowctl;
    mr_flowctl_t *fc;
    void *flowctl_config;

    mr_pool_t send_pool, recv_pool;
    rt_send_t *sends;
    rt_recv_t *recvs;
    mr_deferq_t deferq;
    uint32_t arrival_head, arrival_tail;
    mr_ptrmap_t foreign;   /* Substrate-owned buffer -> receive slot. */

    uint8_t *peer;         /* enum peer_state per rank. */
    bool closing;          /* All ranks finished sending; EOF from peers is expected. */
    int failures_unreported;
    bool any_failure;

    /* Quiescence: whether a wave is pending (in rt_reduce_*) and the last completed one. */
    bool wave_pending;
    bool have_last_wave;
    uint64_t last_wave[2];
    bool unclean;          /* A collective was abandoned: MPI cannot be finalized. */
    size_t inflight;       /* Sends accepted by the substrate and not completed. */
    uint64_t dropped_at_finalize;

    unsigned receive_calls;
    unsigned idle_polls;
    mr_stats_t stats;
} rt_runtime_t;

static rt_runtime_t rt;
static enum rt_state rt_state = RT_UNINITIALIZED;

/*
 * Buffers of the bootstrap's non-blocking reductions. They live outside `rt`
 * and are never freed: a reduction abandoned because a peer died may still
 * be completed by MPI later, and must not write into reused memory.
 */
static uint64_t rt_reduce_in[2], rt_reduce_out[2];

static const char *rt_who(void)
{
    return rt_state == RT_FINALIZED ? "after mr_finalize()" : "before mr_init()";
}

#define RT_CHECK_READY(fn)                                                                   \
    do {                                                                                     \
        if (rt_state != RT_READY) {                                                          \
            mr_error("%s called %s.", fn, rt_who());                                         \
            return MR_ERR_NOT_INITIALIZED;                                                   \
        }                                                                                    \
    } while (0)

/* ---- Receive slots and the arrival queue --------------------------------------------- */

static uint32_t rt_recv_take(void)
{
    uint32_t idx = mr_pool_get(&rt.recv_pool);
    size_t in_use;

    if (idx == MR_NIL) return MR_NIL;
    in_use = mr_pool_in_use(&rt.recv_pool);
    if (in_use > rt.stats.peak_recv_slots_in_use) rt.stats.peak_recv_slots_in_use = in_use;
    if (rt.recvs[idx].foreign != NULL) {
        /* The slot stands for something else now: forget its old buffer. */
        if (mr_ptrmap_get(&rt.foreign, rt.recvs[idx].foreign) == idx) {
            mr_ptrmap_del(&rt.foreign, rt.recvs[idx].foreign);
        }
        rt.recvs[idx].foreign = NULL;
    }
    rt.recvs[idx].state = RECV_FILLING;
    rt.recvs[idx].data = mr_pool_slot(&rt.recv_pool, idx);
    rt.recvs[idx].handle = NULL;
    return idx;
}

static void rt_recv_free(uint32_t idx)
{
    rt.recvs[idx].state = RECV_FREE;
    mr_pool_put(&rt.recv_pool, idx);
}

static void rt_arrival_push(uint32_t idx, int source, size_t length)
{
    rt_recv_t *r = &rt.recvs[idx];

    r->state = RECV_QUEUED;
    r->source = source;
    r->length = (uint32_t)length;
    r->next = MR_NIL;
    if (rt.arrival_tail == MR_NIL) rt.arrival_head = idx;
    else rt.recvs[rt.arrival_tail].next = idx;
    rt.arrival_tail = idx;
}

static uint32_t rt_arrival_pop(void)
{
    uint32_t idx = rt.arrival_head;

    if (idx == MR_NIL) return MR_NIL;
    rt.arrival_head = rt.recvs[idx].next;
    if (rt.arrival_head == MR_NIL) rt.arrival_tail = MR_NIL;
    return idx;
}

/* Returns a held or queued receive slot, and its credit, to MailRail. */
static void rt_recv_release(uint32_t idx)
{
    rt_recv_t *r = &rt.recvs[idx];

    if (r->handle != NULL) {
        rt.substrate->release_recv(rt.sub, r->handle);
        r->handle = NULL;
    }
    rt_recv_free(idx);
    rt.flowctl->on_release(rt.fc, r->source);
}

/* ---- Upcalls from the substrate ------------------------------------------------------- */

static void *up_recv_slot_acquire(void *core)
{
    (void)core;
    uint32_t idx = rt_recv_take();
    return idx == MR_NIL ? NULL : rt.recvs[idx].data;
}

static void up_recv_slot_abandon(void *core, void *slot)
{
    (void)core;
    uint32_t idx = mr_pool_index(&rt.recv_pool, slot);
    if (idx != MR_NIL && rt.recvs[idx].state == RECV_FILLING) rt_recv_free(idx);
}

static mr_status_t up_deliver(void *core, int source, unsigned kind, uint32_t imm, void *data,
                              size_t length, void *handle)
{
    uint32_t idx;

    (void)core;
    (void)kind;
    if (handle == NULL) {
        idx = mr_pool_index(&rt.recv_pool, data);
        if (idx == MR_NIL || rt.recvs[idx].state != RECV_FILLING) {
            mr_error("internal: substrate %s delivered a buffer it did not acquire.",
                     rt.substrate->name);
            return MR_ERR_INVALID_BUFFER;
        }
    } else {
        idx = rt_recv_take();
        if (idx == MR_NIL) return MR_AGAIN;
        rt.recvs[idx].data = data;
        rt.recvs[idx].handle = handle;
        rt.recvs[idx].foreign = data;
        mr_ptrmap_put(&rt.foreign, data, idx);
    }
    rt_arrival_push(idx, source, length);
    rt.flowctl->on_arrival(rt.fc, source, imm);
    return MR_OK;
}

static void rt_send_free(uint32_t idx)
{
    rt.sends[idx].state = SEND_FREE;
    mr_pool_put(&rt.send_pool, idx);
}

static void up_send_complete(void *core, void *cookie)
{
    (void)core;
    rt.inflight--;
    rt_send_free((uint32_t)((rt_send_t *)cookie - rt.sends));
}

static void up_control(void *core, int source, uint32_t imm)
{
    (void)core;
    rt.stats.credit_returns_received++;
    rt.flowctl->on_control(rt.fc, source, imm);
}

static void up_peer_failed(void *core, int rank, mr_status_t why)
{
    (void)core;
    if (rt.closing || rank < 0 || rank >= rt.size || rt.peer[rank] != PEER_OK) return;
    rt.peer[rank] = PEER_FAILED_UNREPORTED;
    rt.failures_unreported++;
    rt.any_failure = true;
    mr_error("Rank %d failed (%s); messages to it are dropped.", rank, mr_status_string(why));
    /* Deferred messages to a dead rank can never go: give their slots back. */
    for (uint32_t idx; (idx = mr_deferq_pop(&rt.deferq, rank)) != MR_NIL;) rt_send_free(idx);
}

static const mr_substrate_upcalls_t rt_upcalls = {
    .recv_slot_acquire = up_recv_slot_acquire,
    .recv_slot_abandon = up_recv_slot_abandon,
    .deliver = up_deliver,
    .send_complete = up_send_complete,
    .control = up_control,
    .peer_failed = up_peer_failed,
};

static mr_status_t rt_send_control(void *core, int dest, uint32_t imm)
{
    (void)core;
    mr_status_t status = rt.substrate->send_control(rt.sub, dest, imm);
    if (status == MR_OK) rt.stats.credit_returns_sent++;
    return status;
}

/* ---- Sending ------------------------------------------------------------------------- */

/* Copies a message to oneself into a receive slot. */
static mr_status_t rt_deliver_self(uint32_t idx)
{
    uint32_t r = rt_recv_take();

    if (r == MR_NIL) return MR_AGAIN;
    memcpy(rt.recvs[r].data, mr_pool_slot(&rt.send_pool, idx), rt.sends[idx].length);
    rt_arrival_push(r, rt.rank, rt.sends[idx].length);
    rt_send_free(idx);
    return MR_OK;
}

/*
 * Hands a message to the substrate, or to oneself, if flow control grants a
 * credit. Messages to oneself take a credit too, since they take a receive
 * slot that flow control may have promised to a peer.
 */
static mr_status_t rt_transmit(uint32_t idx)
{
    rt_send_t *s = &rt.sends[idx];
    int dest = s->dest;
    uint32_t imm;
    mr_status_t status;

    if (!rt.flowctl->acquire(rt.fc, dest, &imm)) return MR_AGAIN;
    if (dest == rt.rank) {
        status = rt_deliver_self(idx);
    } else {
        status = rt.substrate->send(rt.sub, dest, MR_KIND_DATA, imm,
                                    mr_pool_slot(&rt.send_pool, idx), s->length, s);
        if (status == MR_OK) {
            s->state = SEND_INFLIGHT;
            rt.inflight++;
        }
    }
    if (status != MR_OK) rt.flowctl->unacquire(rt.fc, dest, imm);
    return status;
}

/*
 * Visits every destination with deferred messages once, sending the oldest
 * message of each that can take one, as the paper's deferred queue does on
 * every send. With `until_stuck`, repeats while that moved something.
 * Returns the number of messages that left the queue.
 */
static int rt_drain(bool until_stuck)
{
    int moved = 0, pass;

    do {
        int count = rt.deferq.ring_count;
        int dest = mr_deferq_first(&rt.deferq);

        pass = 0;
        for (int i = 0; i < count && dest >= 0; i++) {
            int next = mr_deferq_next(&rt.deferq, dest);
            uint32_t idx = mr_deferq_peek(&rt.deferq, dest);
            mr_status_t status = rt_transmit(idx);

            if (status == MR_OK) {
                mr_deferq_pop(&rt.deferq, dest);
                pass++;
            } else if (status < 0) {
                /* The substrate refused for good (peer failure): drop the message. */
                mr_deferq_pop(&rt.deferq, dest);
                rt_send_free(idx);
            }
            dest = next;
        }
        moved += pass;
    } while (until_stuck && pass > 0 && rt.deferq.depth > 0);
    return moved;
}

/* One round of progress: substrate, flow control, deferred sends. */
static int rt_progress(int timeout_ms)
{
    int events = rt.substrate->progress(rt.sub, timeout_ms);

    if (events < 0) return events;
    events += rt.flowctl->progress(rt.fc);
    if (rt.deferq.depth > 0) events += rt_drain(true);
    return events;
}

/* ---- Init and finalize --------------------------------------------------------------- */

/* What rt_declared_by_other_substrate() looks for in each plugin. */
typedef struct rt_setting_query {
    const char *name;
    bool found;
} rt_setting_query_t;

static void rt_find_setting(void *arg, const char *name, const char *path,
                            const mr_substrate_ops_t *ops, const char *why)
{
    rt_setting_query_t *q = arg;

    (void)name;
    (void)path;
    (void)why;
    if (ops == NULL || q->found) return;
    for (const mr_config_entry_t *e = ops->config_table; e != NULL && e->name != NULL; e++) {
        q->found |= strcmp(e->name, q->name) == 0;
    }
    if (MR_SUBSTRATE_OPS_HAS(ops, settings_passthrough_prefix) &&
        ops->settings_passthrough_prefix != NULL) {
        const char *prefix = ops->settings_passthrough_prefix;
        q->found |= strncmp(q->name, prefix, strlen(prefix)) == 0;
    }
}

/*
 * True when another substrate plugin that loads declares `name` (or hands its
 * prefix on): such a setting is unused now, not unknown. Loads every plugin,
 * so it is asked only about names that nothing loaded declares.
 */
static bool rt_declared_by_other_substrate(void *arg, const char *name)
{
    rt_setting_query_t q = {.name = name};
    mr_plugin_dirs_t *dirs = malloc(sizeof(*dirs));

    (void)arg;
    if (dirs == NULL) return true; /* Say nothing rather than something wrong. */
    mr_plugin_dirs_init(dirs, rt.cfg.plugin_path);
    mr_plugin_list_substrates(dirs, rt_find_setting, &q);
    free(dirs);
    return q.found;
}

/*
 * Warns about MAILRAIL_* variables that no setting of the core, of a
 * flow-control policy or of a substrate plugin declares. A substrate may hand
 * a prefix on to a library that checks it (MAILRAIL_UCX_* to UCX).
 */
static void rt_warn_unknown_settings(void)
{
    const mr_config_entry_t *tables[8] = {mr_core_config_table, rt.substrate->config_table};
    const char *skip[2] = {NULL, NULL};
    size_t ntables = 2;

    for (size_t i = 0; mr_flowctl_names[i] != NULL && ntables < 8; i++) {
        const mr_flowctl_ops_t *policy = mr_flowctl_find(mr_flowctl_names[i]);
        if (policy != NULL && policy->config_table != NULL) tables[ntables++] = policy->config_table;
    }
    if (MR_SUBSTRATE_OPS_HAS(rt.substrate, settings_passthrough_prefix)) {
        skip[0] = rt.substrate->settings_passthrough_prefix;
    }
    mr_config_warn_unknown(tables, ntables, skip, rt_declared_by_other_substrate, NULL);
}

/* ---- Settings that must agree across ranks ------------------------------------------- */

#define RT_AGREED_MAX 16
#define RT_AGREED_TEXT 64

/*
 * Core settings whose value must be the same on every rank: they decide which
 * collectives init runs, the wire format and the credits. The receive pool
 * decides the credits under rank and node, and every setting of the policy.
 */
static const char *const rt_job_wide[] = {"MAILRAIL_SUBSTRATE", "MAILRAIL_FLOWCTL",
                                          "MAILRAIL_DATAGRAM_SIZE", "MAILRAIL_RANKS_PER_NODE",
                                          NULL};

typedef struct rt_agreed {
    int n;
    const char *name[RT_AGREED_MAX];
    char text[RT_AGREED_MAX][RT_AGREED_TEXT];
    uint64_t hash[RT_AGREED_MAX];
} rt_agreed_t;

static void rt_agreed_add(rt_agreed_t *a, const mr_config_entry_t *e, const void *cfg)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over "NAME=value". */

    if (a->n == RT_AGREED_MAX) return;
    a->name[a->n] = e->name;
    mr_config_format_value(e, cfg, a->text[a->n], RT_AGREED_TEXT);
    for (const char *c = e->name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    h = (h ^ '=') * 0x100000001b3ull;
    for (const char *c = a->text[a->n]; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    a->hash[a->n++] = h;
}

/*
 * Checks that every rank has the same job-wide settings, before anything that
 * depends on them. Every rank gathers every rank's digest of them and so comes
 * to the same verdict; a rank whose value differs from rank 0's names the
 * setting and both values. Returns MR_ERR_CONFIG on every rank on a mismatch.
 */
static mr_status_t rt_agree_settings(void)
{
    rt_agreed_t mine = {0};
    uint64_t *all;
    char first[RT_AGREED_MAX][RT_AGREED_TEXT];
    mr_status_t status;
    int bad = -1, differ = 0, first_rank = -1;

    for (size_t i = 0; rt_job_wide[i] != NULL; i++) {
        rt_agreed_add(&mine, mr_config_find(mr_core_config_table, rt_job_wide[i]), &rt.cfg);
    }
    if (strcmp(rt.flowctl->name, "none") != 0) {
        rt_agreed_add(&mine, mr_config_find(mr_core_config_table, "MAILRAIL_RECV_SLOTS"), &rt.cfg);
    }
    for (const mr_config_entry_t *e = rt.flowctl->config_table; e != NULL && e->name != NULL;
         e++) {
        rt_agreed_add(&mine, e, rt.flowctl_config);
    }
    if (MR_SUBSTRATE_OPS_HAS(rt.substrate, job_wide_settings) &&
        rt.substrate->job_wide_settings != NULL) {
        for (const char *const *n = rt.substrate->job_wide_settings; *n != NULL; n++) {
            rt_agreed_add(&mine, mr_config_find(rt.substrate->config_table, *n),
                          rt.substrate_config);
        }
    }
    all = calloc((size_t)rt.size * RT_AGREED_MAX, sizeof(*all));
    if (all == NULL) {
        mr_error("Cannot allocate the settings digests of %d ranks.", rt.size);
        return MR_ERR_NO_MEMORY;
    }
    status = rt.bootstrap->allgather(rt.bs, mine.hash, all, sizeof(mine.hash));
    if (status == MR_OK) {
        memcpy(first, mine.text, sizeof(first));
        status = rt.bootstrap->bcast(rt.bs, first, sizeof(first), 0);
    }
    /* The first setting, in table order, on which some rank differs from rank 0. */
    for (int i = 0; status == MR_OK && bad < 0 && i < RT_AGREED_MAX; i++) {
        for (int r = 1; r < rt.size; r++) {
            if (all[(size_t)r * RT_AGREED_MAX + i] != all[i]) {
                bad = i;
                differ++;
                if (first_rank < 0) first_rank = r;
            }
        }
    }
    free(all);
    if (status != MR_OK) return status;
    if (bad < 0) return MR_OK;
    /* Every rank learns the other value too: the first differing rank's. */
    char other[RT_AGREED_MAX][RT_AGREED_TEXT];
    memcpy(other, mine.text, sizeof(other));
    status = rt.bootstrap->bcast(rt.bs, other, sizeof(other), first_rank);
    if (status != MR_OK) return status;
    mr_error("%s must be the same on every rank: it is \"%s\" on rank 0 but \"%s\" on rank %d "
             "(%d rank(s) differ from rank 0; this rank has \"%s\").",
             bad < mine.n ? mine.name[bad] : "a setting of the flow-control policy", first[bad],
             other[bad], first_rank, differ, bad < mine.n ? mine.text[bad] : "");
    return MR_ERR_CONFIG;
}

typedef struct rt_found {
    char list[512];
    size_t used;
} rt_found_t;

static void rt_collect_substrate(void *arg, const char *name, const char *path,
                                 const mr_substrate_ops_t *ops, const char *why)
{
    rt_found_t *found = arg;
    int n;

    (void)path;
    if (ops != NULL) {
        n = snprintf(found->list + found->used, sizeof(found->list) - found->used, "%s%s",
                     found->used ? ", " : "", name);
    } else {
        n = snprintf(found->list + found->used, sizeof(found->list) - found->used,
                     "%s%s (does not load: %s)", found->used ? ", " : "", name, why);
    }
    if (n > 0 && found->used + (size_t)n < sizeof(found->list)) found->used += (size_t)n;
}

/* Parses a module's own settings table into a fresh struct. */
static mr_status_t rt_parse_module_config(const mr_config_entry_t *table, size_t size,
                                          void **out)
{
    void *cfg;

    if (table == NULL) {
        *out = NULL;
        return MR_OK;
    }
    cfg = calloc(1, size);
    if (cfg == NULL) {
        mr_error("Cannot allocate %zu bytes of settings.", size);
        return MR_ERR_NO_MEMORY;
    }
    if (mr_config_parse(table, cfg) != MR_OK) {
        free(cfg);
        return MR_ERR_CONFIG;
    }
    *out = cfg;
    return MR_OK;
}

static mr_status_t rt_load_plugins(void)
{
    mr_plugin_dirs_t *dirs = malloc(sizeof(*dirs));
    char why[1024];
    mr_status_t status;

    if (dirs == NULL) {
        mr_error("Cannot allocate the plugin search path.");
        return MR_ERR_NO_MEMORY;
    }
    mr_plugin_dirs_init(dirs, rt.cfg.plugin_path);
    status = mr_plugin_load_bootstrap(dirs, "mpi", &rt.bootstrap_dl, &rt.bootstrap, why,
                                      sizeof(why));
    if (status != MR_OK) {
        mr_error("Cannot load the MPI bootstrap plugin: %s.", why);
        goto out;
    }
    status = mr_plugin_load_substrate(dirs, rt.cfg.substrate, &rt.substrate_dl, &rt.substrate,
                                      why, sizeof(why));
    if (status != MR_OK) {
        rt_found_t found = {.used = 0};
        mr_plugin_list_substrates(dirs, rt_collect_substrate, &found);
        mr_error("MAILRAIL_SUBSTRATE=\"%s\" cannot be used: %s. Substrates found: %s.",
                 rt.cfg.substrate, why, found.used ? found.list : "none");
        mr_plugin_unload(rt.bootstrap_dl);
        rt.bootstrap_dl = NULL;
        goto out;
    }
out:
    free(dirs);
    return status;
}

/* Waits for the bootstrap's pending collective, up to `deadline`, without progress. */
static mr_status_t rt_wait_bootstrap(uint64_t deadline)
{
    mr_status_t status;

    while ((status = rt.bootstrap->test(rt.bs)) == MR_AGAIN) {
        if (mr_now_ns() > deadline) {
            mr_error("A collective of the bootstrap did not complete within %u s "
                     "(MAILRAIL_TIMEOUT); another rank is stuck or gone.",
                     (unsigned)rt.cfg.timeout_s);
            rt.unclean = true;
            return MR_ERR_TIMEOUT;
        }
        sched_yield();
    }
    return status;
}

/*
 * Every rank learns whether any rank failed a step of init, so that all of
 * them fail together instead of some waiting forever in the next collective.
 * Returns the local status when it is an error, MR_ERR_PEER_FAILED when only
 * another rank failed, MR_OK when none did.
 */
static mr_status_t rt_agree(mr_status_t local)
{
    mr_status_t status;

    rt_reduce_in[0] = local != MR_OK;
    status = rt.bootstrap->iallreduce_sum(rt.bs, rt_reduce_in, rt_reduce_out, 1);
    if (status == MR_OK) {
        status = rt_wait_bootstrap(mr_now_ns() + rt.cfg.timeout_s * MR_NS_PER_S);
    }
    if (status != MR_OK) {
        rt.unclean = true;
        return local != MR_OK ? local : status;
    }
    if (local != MR_OK) return local;
    if (rt_reduce_out[0] > 0) {
        mr_error("%llu other rank(s) failed to initialize; see their messages.",
                 (unsigned long long)rt_reduce_out[0]);
        return MR_ERR_PEER_FAILED;
    }
    return MR_OK;
}

/* Numbers the nodes: real hosts, split into virtual nodes by MAILRAIL_RANKS_PER_NODE. */
static mr_status_t rt_map_nodes(void)
{
    char host[RT_HOST_MAX] = {0};
    char *hosts = calloc((size_t)rt.size, RT_HOST_MAX);
    int *host_of = rt.host_of = calloc((size_t)rt.size, sizeof(int));
    int *local = calloc((size_t)rt.size, sizeof(int));
    int *key_host = calloc((size_t)rt.size, sizeof(int));
    int *key_group = calloc((size_t)rt.size, sizeof(int));
    mr_status_t status = MR_ERR_NO_MEMORY;
    int nhosts = 0;

    rt.node_of = calloc((size_t)rt.size, sizeof(int));
    if (!hosts || !host_of || !local || !key_host || !key_group || !rt.node_of) {
        mr_error("Cannot allocate the node map of %d ranks.", rt.size);
        goto out;
    }
    gethostname(host, sizeof(host) - 1);
    status = rt.bootstrap->allgather(rt.bs, host, hosts, RT_HOST_MAX);
    if (status != MR_OK) goto out;
    for (int r = 0; r < rt.size; r++) {
        int h = 0;
        while (h < r && strncmp(hosts + (size_t)h * RT_HOST_MAX,
                                hosts + (size_t)r * RT_HOST_MAX, RT_HOST_MAX) != 0) {
            h++;
        }
        host_of[r] = h == r ? nhosts++ : host_of[h];
        local[r] = 0;
        for (int q = 0; q < r; q++) local[r] += host_of[q] == host_of[r];
    }
    rt.node_count = 0;
    for (int r = 0; r < rt.size; r++) {
        int group = rt.cfg.ranks_per_node ? local[r] / (int)rt.cfg.ranks_per_node : 0;
        int n = 0;
        while (n < rt.node_count && !(key_host[n] == host_of[r] && key_group[n] == group)) n++;
        if (n == rt.node_count) {
            key_host[n] = host_of[r];
            key_group[n] = group;
            rt.node_count++;
        }
        rt.node_of[r] = n;
    }
    status = MR_OK;
out:
    free(hosts);
    free(local);
    free(key_host);
    free(key_group);
    return status;
}

/* Fills `buf` from the kernel's random source, or fails. */
static bool rt_random(uint8_t *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        ssize_t n = getrandom(buf + got, len - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return true;
}

/*
 * Rank 0 draws the job secret and name; every rank gets them. The last byte
 * says whether drawing worked, so that all ranks fail together if not.
 */
static mr_status_t rt_share_job_key(void)
{
    uint8_t bytes[MR_JOB_KEY_LEN + 8 + 1] = {0};
    mr_status_t status;

    if (rt.rank == 0) {
        bytes[sizeof(bytes) - 1] = rt_random(bytes, sizeof(bytes) - 1);
        if (!bytes[sizeof(bytes) - 1]) mr_error("getrandom failed: cannot draw the job secret.");
    }
    status = rt.bootstrap->bcast(rt.bs, bytes, sizeof(bytes), 0);
    if (status != MR_OK) return status;
    if (!bytes[sizeof(bytes) - 1]) {
        if (rt.rank != 0) mr_error("Rank 0 could not draw the job secret.");
        return MR_ERR_BOOTSTRAP;
    }
    memcpy(rt.job_key, bytes, MR_JOB_KEY_LEN);
    snprintf(rt.job_id, sizeof(rt.job_id), "mr-%02x%02x%02x%02x%02x%02x%02x%02x",
             bytes[32], bytes[33], bytes[34], bytes[35], bytes[36], bytes[37], bytes[38],
             bytes[39]);
    memset(bytes, 0, sizeof(bytes));
    return MR_OK;
}

/* Frees the pools and slot tables; safe on partly allocated state. */
static void rt_free_pools(void)
{
    free(rt.sends);
    free(rt.recvs);
    free(rt.peer);
    rt.sends = NULL;
    rt.recvs = NULL;
    rt.peer = NULL;
    mr_ptrmap_fini(&rt.foreign);
    mr_deferq_fini(&rt.deferq);
    mr_pool_fini(&rt.recv_pool);
    mr_pool_fini(&rt.send_pool);
}

static mr_status_t rt_alloc_pools(void)
{
    mr_status_t status;

    status = mr_pool_init(&rt.send_pool, rt.cfg.send_slots, rt.cfg.datagram_size, rt.cfg.numa);
    if (status == MR_OK) {
        status = mr_pool_init(&rt.recv_pool, rt.cfg.recv_slots, rt.cfg.datagram_size,
                              rt.cfg.numa);
    }
    if (status == MR_OK) status = mr_deferq_init(&rt.deferq, rt.size, rt.cfg.send_slots);
    if (status == MR_OK) status = mr_ptrmap_init(&rt.foreign, rt.cfg.recv_slots);
    if (status == MR_OK) {
        rt.sends = calloc(rt.cfg.send_slots, sizeof(*rt.sends));
        rt.recvs = calloc(rt.cfg.recv_slots, sizeof(*rt.recvs));
        rt.peer = calloc((size_t)rt.size, sizeof(*rt.peer));
        if (!rt.sends || !rt.recvs || !rt.peer) {
            mr_error("Cannot allocate the slot tables.");
            status = MR_ERR_NO_MEMORY;
        }
    }
    if (status != MR_OK) {
        rt_free_pools();
        return status;
    }
    rt.arrival_head = rt.arrival_tail = MR_NIL;
    return MR_OK;
}

/* A blocking barrier over the bootstrap, for flow-control policies at init. */
static mr_status_t rt_barrier(void *core)
{
    mr_status_t status;

    (void)core;
    status = rt.bootstrap->ibarrier(rt.bs);
    if (status != MR_OK) return status;
    while ((status = rt.bootstrap->test(rt.bs)) == MR_AGAIN) sched_yield();
    return status;
}

static mr_status_t rt_open_flowctl(void)
{
    mr_flowctl_params_t params = {
        .rank = rt.rank,
        .size = rt.size,
        .node_count = rt.node_count,
        .node_of_rank = rt.node_of,
        .host_of_rank = rt.host_of,
        .recv_slots = rt.cfg.recv_slots,
        .return_threshold = (unsigned)rt.cfg.credit_return_threshold,
        .piggyback = rt.cfg.piggyback,
        .job_id = rt.job_id,
        .config = rt.flowctl_config,
        .core = &rt,
        .send_control = rt_send_control,
        .barrier = rt_barrier,
    };
    return rt.flowctl->init(&params, &rt.fc);
}

/* Opens the substrate and reads this rank's address. */
static mr_status_t rt_open_substrate(uint8_t *addr, size_t *len)
{
    mr_substrate_params_t params = {
        .rank = rt.rank,
        .size = rt.size,
        .node_of_rank = rt.node_of,
        .datagram_size = rt.cfg.datagram_size,
        .max_sends = rt.cfg.send_slots,
        .recv_slots = rt.cfg.recv_slots,
        .job_key = rt.job_key,
        .job_id = rt.job_id,
        .bootstrap_comm = rt.bootstrap->comm(rt.bs),
        .timeout_s = (unsigned)rt.cfg.timeout_s,
        .config = rt.substrate_config,
        .core = &rt,
        .upcalls = &rt_upcalls,
        .log = mr_log_write,
        .log_threshold = &mr_log_threshold,
    };
    mr_status_t status;

    status = rt.substrate->open(&params, &rt.sub);
    if (status != MR_OK) return status;
    status = rt.substrate->get_address(rt.sub, addr, len);
    if (status != MR_OK) {
        rt.substrate->close(rt.sub);
        rt.sub = NULL;
    }
    return status;
}

/* All-gathers the substrate addresses, padded to the longest. */
static mr_status_t rt_exchange_addresses(const uint8_t *addr, size_t len)
{
    uint64_t mylen = len, maxlen = 0, *lens;
    uint8_t padded[MR_SUBSTRATE_ADDR_MAX] = {0};
    mr_status_t status;

    lens = calloc((size_t)rt.size, sizeof(*lens));
    if (lens == NULL) {
        mr_error("Cannot allocate the address lengths.");
        return MR_ERR_NO_MEMORY;
    }
    status = rt.bootstrap->allgather(rt.bs, &mylen, lens, sizeof(mylen));
    for (int r = 0; status == MR_OK && r < rt.size; r++) {
        if (lens[r] > maxlen) maxlen = lens[r];
    }
    free(lens);
    if (status != MR_OK) return status;
    rt.addr_len = maxlen ? maxlen : 1;
    rt.addrs = calloc((size_t)rt.size, rt.addr_len);
    if (rt.addrs == NULL) {
        /* Every rank allocates the same amount, so every rank fails here. */
        mr_error("Cannot allocate %d addresses of %zu bytes.", rt.size, rt.addr_len);
        return MR_ERR_NO_MEMORY;
    }
    memcpy(padded, addr, len);
    status = rt.bootstrap->allgather(rt.bs, padded, rt.addrs, rt.addr_len);
    if (status != MR_OK) {
        free(rt.addrs);
        rt.addrs = NULL;
    }
    return status;
}

static mr_status_t rt_init(const void *user_comm, size_t user_comm_size)
{
    const char *flowctl_name;
    mr_status_t status;

    if (rt_state == RT_READY) {
        mr_error("mr_init() called twice without mr_finalize().");
        return MR_ERR_ALREADY_INITIALIZED;
    }
    memset(&rt, 0, sizeof(rt));
    mr_log_set_rank(-1);
    status = mr_config_parse(mr_core_config_table, &rt.cfg);
    if (status != MR_OK) return status;
    mr_log_threshold = (mr_log_level_t)rt.cfg.log_level;

    flowctl_name = mr_flowctl_names[rt.cfg.flowctl];
    rt.flowctl = mr_flowctl_find(flowctl_name);
    if (rt.flowctl == NULL) {
        mr_error("MAILRAIL_FLOWCTL=\"%s\" is not available in this build.", flowctl_name);
        return MR_ERR_CONFIG;
    }
    status = rt_parse_module_config(rt.flowctl->config_table, rt.flowctl->config_size,
                                    &rt.flowctl_config);
    if (status != MR_OK) return status;

    status = rt_load_plugins();
    if (status != MR_OK) goto err_flowctl_config;
    status = rt_parse_module_config(rt.substrate->config_table, rt.substrate->config_size,
                                    &rt.substrate_config);
    if (status != MR_OK) goto err_plugins;

    status = rt.bootstrap->init(user_comm, user_comm_size, mr_log_write, &rt.bs, &rt.rank,
                                &rt.size);
    if (status != MR_OK) goto err_substrate_config;
    mr_log_set_rank(rt.rank);
    /* Every rank has the same environment under mpiexec: one warning is enough. */
    if (rt.rank == 0) rt_warn_unknown_settings();
    status = rt_agree_settings();
    if (status != MR_OK) goto err_nodes;
    /*
     * From here on every rank must fail together: rt_agree() after each step
     * that can fail on some ranks only.
     */
    status = rt_map_nodes();
    if (status != MR_OK) goto err_nodes;
    status = rt_share_job_key();
    if (status != MR_OK) goto err_nodes;
    /*
     * After a failed agreement a rank's own step may have worked: the labels
     * below undo whatever exists.
     */
    status = rt_agree(rt_alloc_pools());
    if (status != MR_OK) goto err_pools;
    status = rt_agree(rt_open_flowctl());
    if (status != MR_OK) goto err_flowctl;
    uint8_t addr[MR_SUBSTRATE_ADDR_MAX];
    size_t addr_len = sizeof(addr);
    status = rt_agree(rt_open_substrate(addr, &addr_len));
    if (status != MR_OK) goto err_substrate;
    status = rt_exchange_addresses(addr, addr_len);
    if (status != MR_OK) goto err_substrate;
    status = rt_agree(rt.substrate->connect(rt.sub, rt.addrs, rt.addr_len));
    if (status != MR_OK) goto err_addrs;

    rt.stats.size = sizeof(rt.stats);
    rt_state = RT_READY;
    mr_info("Initialized: %d ranks on %d nodes, substrate %s, flow control %s, datagram %zu "
            "bytes, %zu send and %zu receive slots.",
            rt.size, rt.node_count, rt.substrate->name, rt.flowctl->name,
            (size_t)rt.cfg.datagram_size, (size_t)rt.cfg.send_slots,
            (size_t)rt.cfg.recv_slots);
    return MR_OK;

err_addrs:
    free(rt.addrs);
err_substrate:
    if (rt.sub != NULL) rt.substrate->close(rt.sub);
err_flowctl:
    if (rt.fc != NULL) rt.flowctl->finalize(rt.fc);
err_pools:
    rt_free_pools();
err_nodes:
    free(rt.node_of);
    free(rt.host_of);
    /* MPI stays up, so that mr_init() can be called again (unless a rank is gone). */
    rt.bootstrap->finalize(rt.bs, rt.unclean ? MR_BOOTSTRAP_END_ABANDON : MR_BOOTSTRAP_END_RETRY);
err_substrate_config:
    free(rt.substrate_config);
err_plugins:
    mr_plugin_unload(rt.substrate_dl);
    mr_plugin_unload(rt.bootstrap_dl);
err_flowctl_config:
    free(rt.flowctl_config);
    memset(&rt, 0, sizeof(rt));
    mr_log_set_rank(-1);
    return status;
}

mr_status_t mr_init(void)
{
    return rt_init(NULL, 0);
}

mr_status_t mr_init_mpi(const void *mpi_comm, size_t mpi_comm_size)
{
    if (mpi_comm == NULL || mpi_comm_size == 0) {
        mr_error("mr_init_mpi: the communicator pointer is NULL or its size is 0.");
        return MR_ERR_INVALID_PARAM;
    }
    return rt_init(mpi_comm, mpi_comm_size);
}

/* Discards every arrived message, returning its credit. */
static void rt_drop_arrivals(void)
{
    for (uint32_t idx; (idx = rt_arrival_pop()) != MR_NIL;) {
        rt.dropped_at_finalize++;
        rt_recv_release(idx);
    }
}

/*
 * Waits for the bootstrap's pending collective while serving traffic (arrivals
 * are discarded: only finalize waits like this).
 */
static mr_status_t rt_wait_collective(uint64_t deadline)
{
    mr_status_t status;

    while ((status = rt.bootstrap->test(rt.bs)) == MR_AGAIN) {
        if (rt.any_failure) {
            rt.unclean = true;
            return MR_ERR_PEER_FAILED;
        }
        if (mr_now_ns() > deadline) {
            rt.unclean = true;
            mr_error("mr_finalize(): other ranks did not reach finalize within %u s.",
                     (unsigned)rt.cfg.timeout_s);
            return MR_ERR_TIMEOUT;
        }
        rt_drop_arrivals();
        rt_progress(1);
    }
    return status;
}

static bool rt_sends_pending(void)
{
    return rt.deferq.depth > 0 || rt.inflight > 0;
}

mr_status_t mr_finalize(void)
{
    uint64_t deadline;
    mr_status_t status = MR_OK;

    RT_CHECK_READY("mr_finalize()");
    deadline = mr_now_ns() + rt.cfg.timeout_s * MR_NS_PER_S;

    /* A quiescence wave the application abandoned must end before the barrier starts. */
    if (rt.wave_pending) {
        rt.wave_pending = false;
        status = rt_wait_collective(deadline);
    }
    /* Buffers the application still holds become invalid now. */
    for (size_t i = 0; i < rt.cfg.recv_slots; i++) {
        if (rt.recvs[i].state == RECV_HELD) rt_recv_release((uint32_t)i);
    }
    /* Send what is deferred or in flight, discarding arrivals so that peers can finish. */
    while (status == MR_OK && rt_sends_pending() && !rt.any_failure) {
        rt_drop_arrivals();
        if (rt_progress(1) < 0) break;
        if (mr_now_ns() > deadline) {
            mr_error("mr_finalize(): messages still unsent after %u s.",
                     (unsigned)rt.cfg.timeout_s);
            status = MR_ERR_TIMEOUT;
            /* A peer stopped: MPI_Finalize would wait for it. */
            rt.unclean = true;
        }
    }
    /*
     * Wait until every rank has sent everything, serving their traffic
     * meanwhile. Then a second barrier: once a rank has passed it, every rank
     * knows that connections are about to close, so a peer's end-of-stream is
     * no longer a failure.
     */
    if (status == MR_OK && !rt.any_failure) {
        status = rt.bootstrap->ibarrier(rt.bs);
        if (status == MR_OK) status = rt_wait_collective(deadline);
    }
    if (status == MR_OK && !rt.any_failure) {
        rt.closing = true;
        if (rt.substrate->closing != NULL) rt.substrate->closing(rt.sub);
        status = rt.bootstrap->ibarrier(rt.bs);
        if (status == MR_OK) status = rt_wait_collective(deadline);
    }
    rt_drop_arrivals();
    if (rt.any_failure) status = MR_ERR_PEER_FAILED;
    if (rt.dropped_at_finalize > 0) {
        mr_warn("mr_finalize(): %llu arrived messages were never received and are discarded.",
                (unsigned long long)rt.dropped_at_finalize);
    }

    rt.substrate->close(rt.sub);
    rt.flowctl->finalize(rt.fc);
    free(rt.addrs);
    rt_free_pools();
    free(rt.node_of);
    free(rt.host_of);
    /* MPI cannot be finalized when a peer is gone or a collective was abandoned. */
    rt.bootstrap->finalize(rt.bs, rt.unclean || rt.any_failure ? MR_BOOTSTRAP_END_ABANDON
                                                               : MR_BOOTSTRAP_END_FINAL);
    free(rt.substrate_config);
    free(rt.flowctl_config);
    mr_plugin_unload(rt.substrate_dl);
    mr_plugin_unload(rt.bootstrap_dl);
    memset(&rt, 0, sizeof(rt));
    rt_state = RT_FINALIZED;
    mr_log_set_rank(-1);
    return status;
}

/* ---- Queries ------------------------------------------------------------------------- */

int mr_rank(void)
{
    return rt_state == RT_READY ? rt.rank : -1;
}

int mr_size(void)
{
    return rt_state == RT_READY ? rt.size : -1;
}

int mr_node_count(void)
{
    return rt_state == RT_READY ? rt.node_count : -1;
}

int mr_node_of(int rank)
{
    if (rt_state != RT_READY || rank < 0 || rank >= rt.size) return -1;
    return rt.node_of[rank];
}

size_t mr_datagram_size(void)
{
    return rt_state == RT_READY ? rt.cfg.datagram_size : 0;
}

const char *mr_substrate_name(void)
{
    return rt_state == RT_READY ? rt.substrate->name : NULL;
}

const char *mr_flowctl_name(void)
{
    return rt_state == RT_READY ? rt.flowctl->name : NULL;
}

mr_status_t mr_peer_address(int rank, char *buf, size_t len)
{
    RT_CHECK_READY("mr_peer_address()");
    if (buf == NULL || len == 0) {
        mr_error("mr_peer_address(): the buffer is NULL or empty.");
        return MR_ERR_INVALID_PARAM;
    }
    if (rank < 0 || rank >= rt.size) {
        mr_error("mr_peer_address(): rank %d is not in [0, %d).", rank, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    rt.substrate->format_address(rt.addrs + (size_t)rank * rt.addr_len, rt.addr_len, buf, len);
    return MR_OK;
}

/* ---- The data path ------------------------------------------------------------------- */

mr_status_t mr_reserve(void **buffer)
{
    uint32_t idx;

    RT_CHECK_READY("mr_reserve()");
    if (buffer == NULL) {
        mr_error("mr_reserve(): the output pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    idx = mr_pool_get(&rt.send_pool);
    if (idx == MR_NIL) {
        rt.stats.reserve_failures++;
        return MR_AGAIN;
    }
    rt.sends[idx].state = SEND_RESERVED;
    *buffer = mr_pool_slot(&rt.send_pool, idx);
    return MR_OK;
}

/* Finds the send slot of a buffer the application passes in, logging misuse. */
static mr_status_t rt_reserved_slot(const char *fn, const void *buffer, uint32_t *out)
{
    uint32_t idx = mr_pool_index(&rt.send_pool, buffer);

    if (idx == MR_NIL) {
        mr_error("%s: %p is not a buffer from mr_reserve().", fn, buffer);
        return MR_ERR_INVALID_BUFFER;
    }
    if (rt.sends[idx].state != SEND_RESERVED) {
        mr_error("%s: send buffer %p is not reserved (already sent or released).", fn, buffer);
        return MR_ERR_BUFFER_STATE;
    }
    *out = idx;
    return MR_OK;
}

mr_status_t mr_send(void *buffer, size_t length, int dest)
{
    uint32_t idx;
    rt_send_t *s;
    mr_status_t status;

    RT_CHECK_READY("mr_send()");
    if (dest < 0 || dest >= rt.size) {
        mr_error("mr_send(): destination %d is not in [0, %d).", dest, rt.size);
        return MR_ERR_INVALID_RANK;
    }
    if (length > rt.cfg.datagram_size) {
        mr_error("mr_send(): length %zu exceeds the datagram size %zu (MAILRAIL_DATAGRAM_SIZE).",
                 length, (size_t)rt.cfg.datagram_size);
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    status = rt_reserved_slot("mr_send()", buffer, &idx);
    if (status != MR_OK) return status;
    if (rt.peer[dest] != PEER_OK) {
        /* The failure itself was logged once, when it was detected. */
        return MR_ERR_PEER_FAILED;
    }
    s = &rt.sends[idx];
    s->dest = dest;
    s->length = (uint32_t)length;

    /* Older deferred messages go first; a new one never overtakes them. */
    if (rt.deferq.depth > 0) rt_drain(false);
    if (mr_deferq_peek(&rt.deferq, dest) == MR_NIL) {
        status = rt_transmit(idx);
        if (status < 0) {
            s->state = SEND_RESERVED;
            return status;
        }
    } else {
        status = MR_AGAIN;
    }
    if (status == MR_AGAIN) {
        s->state = SEND_DEFERRED;
        mr_deferq_push(&rt.deferq, dest, idx);
        rt.stats.deferred_sends++;
    }
    rt.stats.messages_sent++;
    rt.stats.bytes_sent += length;
    return MR_OK;
}

/* Reports one not yet reported peer failure. */
static bool rt_report_failure(void)
{
    if (rt.failures_unreported == 0) return false;
    for (int r = 0; r < rt.size; r++) {
        if (rt.peer[r] == PEER_FAILED_UNREPORTED) {
            rt.peer[r] = PEER_FAILED_REPORTED;
            rt.failures_unreported--;
            return true;
        }
    }
    return false;
}

mr_status_t mr_receive(mr_message_t *message)
{
    uint32_t idx;
    int events;

    RT_CHECK_READY("mr_receive()");
    if (message == NULL) {
        mr_error("mr_receive(): the message pointer is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    /* Progress on every call while idle, and regularly while messages are queued. */
    if (rt.arrival_head == MR_NIL || (++rt.receive_calls & 15) == 0) {
        events = rt_progress(0);
        if (events < 0) return (mr_status_t)events;
    }
    if (rt_report_failure()) return MR_ERR_PEER_FAILED;
    idx = rt_arrival_pop();
    if (idx == MR_NIL) {
        /* When ranks outnumber cores, an idle poll loop must let the others run. */
        if (++rt.idle_polls >= 64) {
            rt.idle_polls = 0;
            sched_yield();
        }
        return MR_AGAIN;
    }
    rt.idle_polls = 0;
    rt.recvs[idx].state = RECV_HELD;
    message->data = rt.recvs[idx].data;
    message->length = rt.recvs[idx].length;
    message->source = rt.recvs[idx].source;
    rt.stats.messages_received++;
    rt.stats.bytes_received += rt.recvs[idx].length;
    return MR_OK;
}

mr_status_t mr_wait(int timeout_ms)
{
    int events;

    RT_CHECK_READY("mr_wait()");
    if (timeout_ms < 0 || timeout_ms > 60000) {
        mr_error("mr_wait(): the timeout is %d ms; give 0 to 60000.", timeout_ms);
        return MR_ERR_INVALID_PARAM;
    }
    if (rt.arrival_head != MR_NIL || rt.failures_unreported > 0) return MR_OK;
    /* Deferred sends that found credit count as news: do not sleep on them. */
    int moved = rt.deferq.depth > 0 ? rt_drain(true) : 0;
    events = rt_progress(moved > 0 ? 0 : timeout_ms);
    if (events < 0) return (mr_status_t)events;
    bool news = events + moved > 0 || rt.arrival_head != MR_NIL || rt.failures_unreported > 0;
    return news ? MR_OK : MR_AGAIN;
}

mr_status_t mr_release(void *buffer)
{
    uint32_t idx;

    RT_CHECK_READY("mr_release()");
    idx = mr_pool_index(&rt.recv_pool, buffer);
    if (idx != MR_NIL) {
        if (rt.recvs[idx].state != RECV_HELD) {
            mr_error("mr_release(): receive buffer %p is not held by the application "
                     "(double release?).", buffer);
            return MR_ERR_BUFFER_STATE;
        }
        rt_recv_release(idx);
        return MR_OK;
    }
    if (mr_pool_contains(&rt.send_pool, buffer)) {
        mr_status_t status = rt_reserved_slot("mr_release()", buffer, &idx);
        if (status != MR_OK) return status;
        rt_send_free(idx);
        return MR_OK;
    }
    /* A buffer the substrate owns (zero-copy receive). */
    idx = mr_pool_contains(&rt.recv_pool, buffer) ? MR_NIL : mr_ptrmap_get(&rt.foreign, buffer);
    if (idx != MR_NIL) {
        if (rt.recvs[idx].state != RECV_HELD || rt.recvs[idx].data != buffer) {
            mr_error("mr_release(): receive buffer %p is not held by the application "
                     "(double release?).", buffer);
            return MR_ERR_BUFFER_STATE;
        }
        rt_recv_release(idx);
        return MR_OK;
    }
    mr_error("mr_release(): %p was not handed out by MailRail.", buffer);
    return MR_ERR_INVALID_BUFFER;
}

/* ---- Quiescence and statistics ------------------------------------------------------- */

mr_status_t mr_quiesce(void)
{
    mr_status_t status;
    int events;

    RT_CHECK_READY("mr_quiesce()");
    events = rt_progress(0);
    if (events < 0) return (mr_status_t)events;
    if (rt.any_failure) {
        mr_error("mr_quiesce(): a peer has failed; quiescence cannot be reached.");
        return MR_ERR_PEER_FAILED;
    }
    if (!rt.wave_pending) {
        /* Each wave sums messages sent and received over all ranks. */
        rt_reduce_in[0] = rt.stats.messages_sent;
        rt_reduce_in[1] = rt.stats.messages_received;
        status = rt.bootstrap->iallreduce_sum(rt.bs, rt_reduce_in, rt_reduce_out, 2);
        if (status != MR_OK) return status;
        rt.wave_pending = true;
    }
    status = rt.bootstrap->test(rt.bs);
    if (status == MR_AGAIN) return MR_AGAIN;
    rt.wave_pending = false;
    if (status != MR_OK) return status;
    /*
     * Two consecutive waves with equal sums, sent == received, mean nothing
     * was in flight between them: every rank sees the same sums and stops in
     * the same round.
     */
    if (rt_reduce_out[0] == rt_reduce_out[1] && rt.have_last_wave &&
        rt.last_wave[0] == rt_reduce_out[0] && rt.last_wave[1] == rt_reduce_out[1]) {
        rt.have_last_wave = false;
        return MR_OK;
    }
    rt.last_wave[0] = rt_reduce_out[0];
    rt.last_wave[1] = rt_reduce_out[1];
    rt.have_last_wave = true;
    return MR_AGAIN;
}

mr_status_t mr_get_stats(mr_stats_t *stats)
{
    mr_stats_t snapshot;
    size_t size;

    RT_CHECK_READY("mr_get_stats()");
    if (stats == NULL || stats->size < offsetof(mr_stats_t, connections_rejected)) {
        mr_error("mr_get_stats(): NULL or stats->size not set to sizeof(mr_stats_t).");
        return MR_ERR_INVALID_PARAM;
    }
    snapshot = rt.stats;
    snapshot.peak_deferred_depth = rt.deferq.peak_depth;
    snapshot.recv_slots_in_use = mr_pool_in_use(&rt.recv_pool);
    rt.flowctl->stats(rt.fc, &snapshot);
    if (rt.substrate->stats != NULL) rt.substrate->stats(rt.sub, &snapshot);
    size = stats->size < sizeof(snapshot) ? stats->size : sizeof(snapshot);
    snapshot.size = size;
    memcpy(stats, &snapshot, size);
    return MR_OK;
}
