/*
 * mr_init() and mr_finalize(): loading the plugins, the steps of init in
 * order and their unwinding, and the orderly end of a job.
 */
#include "datapath.h"
#include "mr_plugin.h"
#include "mr_time.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rt_runtime_t rt;
enum rt_state rt_state = RT_UNINITIALIZED;

const char *rt_who(void)
{
    return rt_state == RT_FINALIZED    ? "after mr_finalize()"
           : rt_state == RT_IN_HANDLER ? "inside an active-message handler (only sends are allowed)"
                                       : "before mr_init()";
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
    if (mr__config_parse(table, cfg) != MR_OK) {
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
    mr__plugin_dirs_init(dirs, rt.cfg.plugin_path);
    status = mr__plugin_load_bootstrap(dirs, "mpi", &rt.bootstrap_dl, &rt.bootstrap, why,
                                      sizeof(why));
    if (status != MR_OK) {
        mr_error("Cannot load the MPI bootstrap plugin: %s.", why);
        goto out;
    }
    status = mr__plugin_load_substrate(dirs, rt.cfg.substrate, &rt.substrate_dl, &rt.substrate,
                                      why, sizeof(why));
    if (status != MR_OK) {
        rt_found_t found = {.used = 0};
        mr__plugin_list_substrates(dirs, rt_collect_substrate, &found);
        mr_error("MAILRAIL_SUBSTRATE=\"%s\" cannot be used: %s. Substrates found: %s.",
                 rt.cfg.substrate, why, found.used ? found.list : "none");
        mr__plugin_unload(rt.bootstrap_dl);
        rt.bootstrap_dl = NULL;
        goto out;
    }
out:
    free(dirs);
    return status;
}

/* Frees the datapath and the peer table; safe on partly allocated state. */
static void rt_free_pools(void)
{
    rt_handlers_fini();
    rt_datapath_fini();
    free(rt.peer);
    rt.peer = NULL;
}

static mr_status_t rt_alloc_pools(void)
{
    mr_status_t status = rt_datapath_init();

    if (status != MR_OK) return status;
    rt.peer = calloc((size_t)rt.size, sizeof(*rt.peer));
    if (rt.peer == NULL) {
        mr_error("Cannot allocate the peer table of %d ranks.", rt.size);
        rt_free_pools();
        return MR_ERR_NO_MEMORY;
    }
    rt_items_init();
    status = rt_handlers_init();
    if (status != MR_OK) rt_free_pools();
    return status;
}

/*
 * Whether this machine (one kernel, even under several host names) runs more
 * ranks than the CPUs this process may run on. Then ranks that wait for each
 * other must let each other run: idle polls yield (MAILRAIL_YIELD) and
 * mr_wait() naps (MAILRAIL_WAIT_NAP) by default. Otherwise spinning is
 * cheaper: a yield is a system call, and a nap delays a message.
 */
static bool rt_oversubscribed(void)
{
    long ncpus = mr__affinity_cpus();

    return ncpus <= 0 || rt.machine_ranks > ncpus;
}

/* What the flow-control policy is told about the job. */
static mr_flowctl_params_t rt_flowctl_params(void)
{
    mr_flowctl_params_t params = {
        .rank = rt.rank,
        .size = rt.size,
        .node_count = rt.node_count,
        .node_of_rank = rt.node_of,
        .host_of_rank = rt.host_of,
        .recv_slots = rt.cfg.recv_slots,
        .return_threshold = (unsigned)rt.fcfg.credit_return_threshold,
        .horizon_ns = rt.fcfg.credit_horizon_us * 1000u,
        .grow = rt.fcfg.credit_grow,
        .piggyback = rt.fcfg.piggyback,
        .job_id = rt.job_id,
        .config = rt.flowctl_config,
        .core = &rt,
        .send_control = rt_send_control,
        .deferred = rt_deferred_to,
        .barrier = rt_barrier,
    };
    return params;
}

/*
 * Grows the receive pool to what the policy needs (one slot per sending rank
 * under `rank` at least) when MAILRAIL_RECV_SLOTS is not set. The same on
 * every rank: it depends only on settings that all ranks agreed on, the job
 * size and the node map. A set value is kept; the policy's init() then names
 * the value that would run.
 */
static void rt_size_recv_pool(void)
{
    mr_flowctl_params_t params = rt_flowctl_params();
    uint64_t needed;

    if (rt.flowctl->recv_slots_needed == NULL) return;
    needed = rt.flowctl->recv_slots_needed(&params);
    if (needed <= rt.cfg.recv_slots || getenv("MAILRAIL_RECV_SLOTS") != NULL ||
        needed > mr__config_find(mr__core_config_table, "MAILRAIL_RECV_SLOTS")->max) {
        return;
    }
    if (rt.rank == 0) {
        mr_info("MAILRAIL_FLOWCTL=%s on %d ranks in %d node(s) needs %llu receive slots: the pool "
                "grows from %llu to them (%llu MiB of address space per rank, touched only as "
                "slots are used). Set MAILRAIL_RECV_SLOTS to choose.",
                rt.flowctl->name, rt.size, rt.node_count, (unsigned long long)needed,
                (unsigned long long)rt.cfg.recv_slots,
                (unsigned long long)((needed * rt.cfg.datagram_size) >> 20));
    }
    rt.cfg.recv_slots = needed;
}

/*
 * Lets a rank that sleeps for credits be woken by flow control (the node
 * policy's neighbours): its descriptor joins what the substrate waits on.
 * Without it such a rank sleeps until its mr_wait() timeout.
 */
static void rt_register_wake(void)
{
    int fd = rt.flowctl->wake_fd != NULL ? rt.flowctl->wake_fd(rt.fc) : -1;

    rt.wake_registered = false;
    if (fd < 0 || rt.flowctl->sleep == NULL) return;
    if (rt.substrate->wake_fd == NULL) {
        mr_debug("The %s substrate cannot wake a sleeping rank for credits; such ranks sleep "
                 "until their mr_wait() timeout.", rt.substrate->name);
        return;
    }
    rt.wake_registered = rt.substrate->wake_fd(rt.sub, fd) == MR_OK;
}

static mr_status_t rt_open_flowctl(void)
{
    mr_flowctl_params_t params = rt_flowctl_params();

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
        .log = mr__log_write,
        .log_threshold = &mr__log_threshold,
        .coalesce_bytes = rt.cfg.coalesce_bytes,
    };
    mr_status_t status;

    status = rt.substrate->open(&params, &rt.sub);
    if (status != MR_OK) return status;
    /* Flow control opened first: what it bounds, and what the substrate may hold. */
    rt_datapath_attach(rt.flowctl->recv_bound != NULL ? rt.flowctl->recv_bound(rt.fc) : 0,
                       rt.substrate->held);
    status = rt.substrate->get_address(rt.sub, addr, len);
    if (status != MR_OK) {
        rt.substrate->close(rt.sub);
        rt.sub = NULL;
    }
    return status;
}

/*
 * Where mr_init()'s time goes, step by step, for the debug log: at scale,
 * MPI's collectives dominate (docs/scale.md).
 */
typedef struct rt_init_clock {
    uint64_t last;
    char text[256];
    size_t used;
} rt_init_clock_t;

static void rt_clock_step(rt_init_clock_t *c, const char *step)
{
    uint64_t now = mr__now_ns();
    int n = snprintf(c->text + c->used, sizeof(c->text) - c->used, "%s%s %.3f", c->used ? ", " : "",
                     step, (double)(now - c->last) / 1e9);

    if (n > 0 && c->used + (size_t)n < sizeof(c->text)) c->used += (size_t)n;
    c->last = now;
}

static mr_status_t rt_init(const void *user_comm, size_t user_comm_size)
{
    rt_init_clock_t clock = {.last = mr__now_ns()};
    const char *flowctl_name;
    mr_status_t status;

    if (rt_state == RT_IN_HANDLER) {
        mr_error("mr_init() called %s.", rt_who());
        return MR_ERR_IN_HANDLER;
    }
    if (rt_state == RT_READY) {
        mr_error("mr_init() called twice without mr_finalize().");
        return MR_ERR_ALREADY_INITIALIZED;
    }
    memset(&rt, 0, sizeof(rt));
    mr__log_set_rank(-1);
    status = mr__config_parse(mr__core_config_table, &rt.cfg);
    if (status == MR_OK) status = mr__config_parse(mr__flowctl_config_table, &rt.fcfg);
    if (status != MR_OK) return status;
    mr__log_threshold = (mr_log_level_t)rt.cfg.log_level;

    flowctl_name = mr__flowctl_names[rt.fcfg.policy];
    rt.flowctl = mr__flowctl_find(flowctl_name);
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

    /* Until the ranks have met, the launcher's count of the ranks on this machine. */
    rt.nap_ns = mr__backoff_nap_ns(mr__launcher_local_ranks());
    status = rt.bootstrap->init(user_comm, user_comm_size, mr__log_write, &rt.bs, &rt.rank,
                                &rt.size);
    if (status != MR_OK) goto err_substrate_config;
    rt_clock_step(&clock, "bootstrap");
    mr__log_set_rank(rt.rank);
    /* Every rank has the same environment under mpiexec: one warning is enough. */
    if (rt.rank == 0) rt_warn_unknown_settings();
    status = rt_agree_settings();
    if (status != MR_OK) goto err_nodes;
    rt_clock_step(&clock, "settings");
    /*
     * From here on every rank must fail together: rt_agree() after each step
     * that can fail on some ranks only.
     */
    status = rt_map_nodes();
    if (status != MR_OK) goto err_nodes;
    bool over = rt_oversubscribed();
    rt.nap_ns = mr__backoff_nap_ns(rt.machine_ranks);
    rt.idle_yield = rt.cfg.yield == MR_WHEN_AUTO ? over : rt.cfg.yield == MR_WHEN_ALWAYS;
    rt.wait_naps = rt.cfg.wait_nap == MR_WHEN_AUTO ? over && rt.substrate->wait_is_costly
                                                   : rt.cfg.wait_nap == MR_WHEN_ALWAYS;
    mr_debug("%d ranks on this machine%s: idle polls %s, mr_wait() %s, waits on the "
             "bootstrap nap %.1f ms.", rt.machine_ranks,
             over ? ", more than its CPUs" : "", rt.idle_yield ? "yield" : "spin",
             rt.wait_naps ? "naps first" : "sleeps until news", (double)rt.nap_ns / 1e6);
    status = rt_share_job_key();
    if (status != MR_OK) goto err_nodes;
    rt_clock_step(&clock, "nodes and key");
    /*
     * After a failed agreement a rank's own step may have worked: the labels
     * below undo whatever exists.
     */
    rt_size_recv_pool();
    rt.cfg.send_bytes = mr__config_send_bytes(&rt.cfg, getenv("MAILRAIL_SEND_BYTES") != NULL);
    status = rt_agree(rt_alloc_pools());
    if (status != MR_OK) goto err_pools;
    status = rt_agree(rt_open_flowctl());
    if (status != MR_OK) goto err_flowctl;
    rt_clock_step(&clock, "pools and flow control");
    uint8_t addr[MR_SUBSTRATE_ADDR_MAX];
    size_t addr_len = sizeof(addr);
    status = rt_agree(rt_open_substrate(addr, &addr_len));
    if (status != MR_OK) goto err_substrate;
    rt_clock_step(&clock, "substrate");
    status = rt_exchange_addresses(addr, addr_len);
    if (status != MR_OK) goto err_substrate;
    rt_clock_step(&clock, "addresses");
    status = rt.substrate->connect(rt.sub, rt.addrs, rt.addr_len);
    if (status == MR_OK) status = rt_watch_neighbours();
    if (status == MR_OK) rt_register_wake();
    status = rt_agree(status);
    if (status != MR_OK) goto err_addrs;
    rt_clock_step(&clock, "connect");

    rt.stats.size = sizeof(rt.stats);
    rt_state = RT_READY;
    mr_info("Initialized: %d ranks on %d nodes, substrate %s, flow control %s, datagram %zu "
            "bytes, %zu send and %zu receive slots.",
            rt.size, rt.node_count, rt.substrate->name, rt.flowctl->name,
            (size_t)rt.cfg.datagram_size, (size_t)rt.cfg.send_slots,
            (size_t)rt.cfg.recv_slots);
    if (rt.rank == 0) mr_debug("mr_init() seconds per step: %s.", clock.text);
    return MR_OK;

err_addrs:
    /* The substrate may read the address table until it is closed. */
    rt.substrate->close(rt.sub);
    rt.sub = NULL;
    free(rt.notice_q);
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
    mr__plugin_unload(rt.substrate_dl);
    mr__plugin_unload(rt.bootstrap_dl);
err_flowctl_config:
    free(rt.flowctl_config);
    memset(&rt, 0, sizeof(rt));
    mr__log_set_rank(-1);
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
    rt.dropped_at_finalize += rt_datapath_drop_arrivals();
    rt.dropped_at_finalize += rt_items_drop_arrivals();
    rt.dropped_at_finalize += rt_handlers_stop();
}

/*
 * Waits for the bootstrap's pending collective while serving traffic (arrivals
 * are discarded: only finalize waits like this).
 */
static mr_status_t rt_wait_collective(uint64_t deadline)
{
    mr_status_t status;
    unsigned polls = 0;

    while ((status = rt.bootstrap->test(rt.bs)) == MR_AGAIN) {
        if (rt.any_failure) {
            rt.unclean = true;
            return MR_ERR_PEER_FAILED;
        }
        if (mr__now_ns() > deadline) {
            rt.unclean = true;
            mr_error("mr_finalize(): other ranks did not reach finalize within %u s.",
                     (unsigned)rt.cfg.timeout_s);
            return MR_ERR_TIMEOUT;
        }
        rt_drop_arrivals();
        /* Peers' traffic wakes the wait; the collective does not: poll less and less often. */
        polls++;
        rt_progress(polls < MR_BACKOFF_YIELDS ? 1 : polls < 4 * MR_BACKOFF_YIELDS ? 4 : 16);
    }
    return status;
}

mr_status_t mr_finalize(void)
{
    uint64_t deadline;
    mr_status_t status = MR_OK;

    RT_CHECK_READY("mr_finalize()");
    deadline = mr__now_ns() + rt.cfg.timeout_s * MR_NS_PER_S;

    /* A quiescence wave the application abandoned must end before the barrier starts. */
    if (rt.wave_pending) {
        rt.wave_pending = false;
        status = rt_wait_collective(deadline);
    }
    /* Buffers the application still holds become invalid now, aggregators too. */
    rt_items_fini();
    rt.dropped_at_finalize += rt_handlers_stop();
    rt_datapath_release_held();
    /*
     * Send what is deferred or in flight, discarding arrivals so that peers can
     * finish; after a failure, at least the notices of it that this rank owes the
     * ring: it may be the only one that saw the failure (chaos.sh's kill case).
     */
    while (status == MR_OK && ((rt_datapath_sends_pending() && !rt.any_failure) ||
                               rt.notice_sent < rt.notice_count)) {
        rt_drop_arrivals();
        if (rt_progress(1) < 0) break;
        if (mr__now_ns() > deadline) {
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
    free(rt.notice_q);
    rt_free_pools();
    free(rt.node_of);
    free(rt.host_of);
    /* MPI cannot be finalized when a peer is gone or a collective was abandoned. */
    rt.bootstrap->finalize(rt.bs, rt.unclean || rt.any_failure ? MR_BOOTSTRAP_END_ABANDON
                                                               : MR_BOOTSTRAP_END_FINAL);
    free(rt.substrate_config);
    free(rt.flowctl_config);
    mr__plugin_unload(rt.substrate_dl);
    mr__plugin_unload(rt.bootstrap_dl);
    memset(&rt, 0, sizeof(rt));
    rt_state = RT_FINALIZED;
    mr__log_set_rank(-1);
    return status;
}
