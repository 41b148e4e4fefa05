/*
 * What the ranks set up together at init, over the bootstrap: agreement on
 * each step's outcome, the node map, the job secret and the substrate
 * addresses.
 */
#include "runtime.h"
#include "mr_random.h"
#include "mr_time.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t rt_reduce_in[2], rt_reduce_out[2];

/* Counts a collective of mr_init() and the bytes this rank puts into it (mr_stats_t). */
static void rt_count_collective(size_t bytes)
{
    rt.stats.init_collectives++;
    rt.stats.init_bootstrap_bytes += bytes;
}

/* Waits for the bootstrap's pending collective, up to `deadline`, without progress. */
static mr_status_t rt_wait_bootstrap(uint64_t deadline)
{
    mr_status_t status;
    unsigned polls = 0;

    while ((status = rt.bootstrap->test(rt.bs)) == MR_AGAIN) {
        if (mr__now_ns() > deadline) {
            mr_error("A collective of the bootstrap did not complete within %u s "
                     "(MAILRAIL_TIMEOUT); another rank is stuck or gone, or only slow: with "
                     "many ranks per core, raise MAILRAIL_TIMEOUT (docs/scale.md).",
                     (unsigned)rt.cfg.timeout_s);
            rt.unclean = true;
            return MR_ERR_TIMEOUT;
        }
        mr__backoff(&polls, rt.nap_ns);
    }
    return status;
}

/* Waits for a collective just started (`status` is how starting it went). */
static mr_status_t rt_finish_collective(mr_status_t status)
{
    if (status != MR_OK) return status;
    return rt_wait_bootstrap(mr__now_ns() + rt.cfg.timeout_s * MR_NS_PER_S);
}

mr_status_t rt_allgather(const void *send, void *recv, size_t len)
{
    rt_count_collective(len);
    return rt_finish_collective(rt.bootstrap->iallgather(rt.bs, send, recv, len));
}

mr_status_t rt_bcast(void *buf, size_t len, int root)
{
    rt_count_collective(rt.rank == root ? len : 0);
    return rt_finish_collective(rt.bootstrap->ibcast(rt.bs, buf, len, root));
}

/*
 * Every rank learns whether any rank failed a step of init, so that all of
 * them fail together instead of some waiting forever in the next collective.
 * Returns the local status when it is an error, MR_ERR_PEER_FAILED when only
 * another rank failed, MR_OK when none did.
 */
mr_status_t rt_agree(mr_status_t local)
{
    mr_status_t status;

    rt_reduce_in[0] = local != MR_OK;
    rt_count_collective(sizeof(rt_reduce_in[0]));
    status = rt.bootstrap->iallreduce_sum(rt.bs, rt_reduce_in, rt_reduce_out, 1);
    status = rt_finish_collective(status);
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

/* Orders ranks by host name, then by rank, for rt_map_nodes(). */
static const char *rt_sort_hosts;

/*
 * What each rank tells the others: its host name, then its kernel's boot id,
 * which tells ranks on one machine apart from ranks on hosts that only have
 * their own names (emulated hosts in network and UTS namespaces).
 */
#define RT_BOOT_ID_MAX 40
#define RT_HOST_RECORD (RT_HOST_MAX + RT_BOOT_ID_MAX)

static int rt_compare_host(const void *a, const void *b)
{
    int ra = *(const int *)a, rb = *(const int *)b;
    int c = strncmp(rt_sort_hosts + (size_t)ra * RT_HOST_RECORD,
                    rt_sort_hosts + (size_t)rb * RT_HOST_RECORD, RT_HOST_MAX);
    return c != 0 ? c : (ra > rb) - (ra < rb);
}

/* This machine's boot id, or an empty string when it cannot be read. */
static void rt_boot_id(char out[RT_BOOT_ID_MAX])
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    memset(out, 0, RT_BOOT_ID_MAX);
    if (f == NULL) return;
    if (fgets(out, RT_BOOT_ID_MAX, f) == NULL) out[0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    fclose(f);
}

/*
 * Numbers the hosts, and the nodes: real hosts, split into virtual nodes of
 * MAILRAIL_RANKS_PER_NODE consecutive ranks of a host. Both are numbered in
 * the order of their lowest rank. O(P log P): one sort of the ranks by host.
 */
mr_status_t rt_map_nodes(void)
{
    char host[RT_HOST_RECORD] = {0};
    size_t n = (size_t)rt.size;
    char *hosts = calloc(n, RT_HOST_RECORD);
    int *order = calloc(n, sizeof(int));
    int *first = calloc(n, sizeof(int));   /* Per rank: the lowest rank of its host. */
    int *local = calloc(n, sizeof(int));   /* Per rank: its place among its host's ranks. */
    int *count = calloc(n, sizeof(int));   /* Per lowest rank: its host's ranks. */
    int *slots = calloc(n, sizeof(int));   /* Per host: where its nodes' numbers start. */
    int *node = calloc(n, sizeof(int));    /* Per slot: the node number, or -1. */
    int nhosts = 0, nslots = 0;
    mr_status_t status = MR_ERR_NO_MEMORY;

    rt.host_of = calloc(n, sizeof(int));
    rt.node_of = calloc(n, sizeof(int));
    if (!hosts || !order || !first || !local || !count || !slots || !node || !rt.host_of ||
        !rt.node_of) {
        mr_error("Cannot allocate the node map of %d ranks.", rt.size);
        goto out;
    }
    gethostname(host, RT_HOST_MAX - 1);
    rt_boot_id(host + RT_HOST_MAX);
    status = rt_allgather(host, hosts, RT_HOST_RECORD);
    if (status != MR_OK) goto out;
    for (int r = 0; r < rt.size; r++) order[r] = r;
    rt_sort_hosts = hosts;
    qsort(order, n, sizeof(int), rt_compare_host);
    for (size_t i = 0; i < n; i++) {
        int r = order[i], prev = i > 0 ? order[i - 1] : -1;
        bool same = prev >= 0 && strncmp(hosts + (size_t)prev * RT_HOST_RECORD,
                                         hosts + (size_t)r * RT_HOST_RECORD, RT_HOST_MAX) == 0;
        first[r] = same ? first[prev] : r;
        local[r] = same ? local[prev] + 1 : 0;
        count[first[r]]++;
    }
    rt.node_count = 0;
    for (int r = 0; r < rt.size; r++) {
        int rpn = (int)rt.cfg.ranks_per_node;
        if (first[r] == r) {
            rt.host_of[r] = nhosts;
            slots[nhosts++] = nslots;
            int groups = rpn ? (count[r] + rpn - 1) / rpn : 1;
            for (int g = 0; g < groups; g++) node[nslots + g] = -1;
            nslots += groups;
        } else {
            rt.host_of[r] = rt.host_of[first[r]];
        }
        int slot = slots[rt.host_of[r]] + (rpn ? local[r] / rpn : 0);
        if (node[slot] < 0) node[slot] = rt.node_count++;
        rt.node_of[r] = node[slot];
    }
    /* Ranks sharing this machine's cores: same boot id, or same host without one. */
    rt.machine_ranks = 0;
    for (size_t r = 0; r < n; r++) {
        const char *mine = host + RT_HOST_MAX, *theirs = hosts + r * RT_HOST_RECORD + RT_HOST_MAX;
        bool same = mine[0] != '\0' ? strncmp(mine, theirs, RT_BOOT_ID_MAX) == 0
                                    : rt.host_of[r] == rt.host_of[rt.rank];
        rt.machine_ranks += same;
    }
    status = MR_OK;
out:
    free(hosts);
    free(order);
    free(first);
    free(local);
    free(count);
    free(slots);
    free(node);
    return status;
}

/*
 * Rank 0 draws the job secret and name; every rank gets them. The last byte
 * says whether drawing worked, so that all ranks fail together if not.
 */
mr_status_t rt_share_job_key(void)
{
    uint8_t bytes[MR_JOB_KEY_LEN + 8 + 1] = {0};
    mr_status_t status;

    if (rt.rank == 0) {
        bytes[sizeof(bytes) - 1] = mr__random_bytes(bytes, sizeof(bytes) - 1);
        if (!bytes[sizeof(bytes) - 1]) mr_error("getrandom failed: cannot draw the job secret.");
    }
    status = rt_bcast(bytes, sizeof(bytes), 0);
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

/* A blocking barrier over the bootstrap, for flow-control policies at init. */
mr_status_t rt_barrier(void *core)
{
    (void)core;
    rt_count_collective(0);
    return rt_finish_collective(rt.bootstrap->ibarrier(rt.bs));
}

/* All-gathers the substrate addresses, padded to the longest. */
mr_status_t rt_exchange_addresses(const uint8_t *addr, size_t len)
{
    uint64_t mylen = len, maxlen = 0, *lens;
    uint8_t padded[MR_SUBSTRATE_ADDR_MAX] = {0};
    mr_status_t status;

    lens = calloc((size_t)rt.size, sizeof(*lens));
    if (lens == NULL) {
        mr_error("Cannot allocate the address lengths.");
        return MR_ERR_NO_MEMORY;
    }
    status = rt_allgather(&mylen, lens, sizeof(mylen));
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
    status = rt_allgather(padded, rt.addrs, rt.addr_len);
    if (status != MR_OK) {
        free(rt.addrs);
        rt.addrs = NULL;
    }
    return status;
}
