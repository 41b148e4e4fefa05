/*
 * What an application can ask the runtime: its rank, the job's shape, a
 * peer's address and the statistics.
 */
#include "datapath.h"

#include <stdlib.h>
#include <string.h>

int mr_rank(void)
{
    return RT_LIVE() ? rt.rank : -1;
}

int mr_size(void)
{
    return RT_LIVE() ? rt.size : -1;
}

int mr_node_count(void)
{
    return RT_LIVE() ? rt.node_count : -1;
}

int mr_node_of(int rank)
{
    if (!RT_LIVE() || rank < 0 || rank >= rt.size) return -1;
    return rt.node_of[rank];
}

size_t mr_datagram_size(void)
{
    return RT_LIVE() ? rt.cfg.datagram_size : 0;
}

const char *mr_substrate_name(void)
{
    return RT_LIVE() ? rt.substrate->name : NULL;
}

const char *mr_flowctl_name(void)
{
    return RT_LIVE() ? rt.flowctl->name : NULL;
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


mr_status_t mr_get_stats(mr_stats_t *stats)
{
    mr_stats_t snapshot;
    size_t size;

    RT_CHECK_SEND("mr_get_stats()");
    if (stats == NULL || stats->size < offsetof(mr_stats_t, connections_rejected)) {
        mr_error("mr_get_stats(): NULL or stats->size not set to sizeof(mr_stats_t).");
        return MR_ERR_INVALID_PARAM;
    }
    snapshot = rt.stats;
    rt_datapath_stats(&snapshot);
    rt.flowctl->stats(rt.fc, &snapshot);
    if (rt.substrate->stats != NULL) rt.substrate->stats(rt.sub, &snapshot);
    size = stats->size < sizeof(snapshot) ? stats->size : sizeof(snapshot);
    snapshot.size = size;
    memcpy(stats, &snapshot, size);
    return MR_OK;
}

mr_status_t mr_get_credit_grants(uint32_t *outstanding, int count, int *holders)
{
    RT_CHECK_READY("mr_get_credit_grants()");
    if (outstanding == NULL || holders == NULL || count < 0) {
        mr_error("mr_get_credit_grants(): NULL, or a negative count.");
        return MR_ERR_INVALID_PARAM;
    }
    if (rt.flowctl->grants == NULL) {
        mr_error("mr_get_credit_grants(): MAILRAIL_FLOWCTL=%s grants no credits.", rt.flowctl->name);
        return MR_ERR_UNSUPPORTED;
    }
    *holders = rt.flowctl->grants(rt.fc, outstanding, count);
    return MR_OK;
}

mr_status_t mr_failed_ranks(int *ranks, int max, int *count)
{
    int n = 0;

    RT_CHECK_SEND("mr_failed_ranks()");
    if (count == NULL || max < 0 || (ranks == NULL && max > 0)) {
        mr_error("mr_failed_ranks(): a NULL count, a negative maximum, or NULL ranks with room "
                 "for %d.", max);
        return MR_ERR_INVALID_PARAM;
    }
    if (rt.any_failure) {
        for (int r = 0; r < rt.size; r++) {
            if (rt.peer[r] == PEER_OK) continue;
            if (n < max) ranks[n] = r;
            n++;
        }
    }
    *count = n;
    return MR_OK;
}

mr_status_t mr_check_setting(const char *name, const char *value)
{
    const mr_config_entry_t *tables[RT_SETTING_TABLES_MAX];
    size_t sizes[RT_SETTING_TABLES_MAX];
    size_t ntables = rt_setting_tables(tables, sizes, RT_SETTING_TABLES_MAX);
    char err[512];

    if (name == NULL || value == NULL) {
        mr_error("mr_check_setting(): the name or the value is NULL.");
        return MR_ERR_INVALID_PARAM;
    }
    for (size_t t = 0; t < ntables; t++) {
        const mr_config_entry_t *e = mr__config_find(tables[t], name);
        if (e == NULL) continue;
        /* Parsed into scratch space of the owner's struct, then dropped. */
        void *scratch = calloc(1, sizes[t]);
        if (scratch == NULL) return MR_ERR_NO_MEMORY;
        mr_status_t status = mr__config_parse_value(e, value, scratch, err, sizeof(err));
        free(scratch);
        if (status != MR_OK) mr_error("%s", err);
        return status;
    }
    mr_error("mr_check_setting(): %s is not a setting of the core or of flow control.", name);
    return MR_ERR_INVALID_PARAM;
}
