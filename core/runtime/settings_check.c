/*
 * Settings checks at init: MAILRAIL_* variables that nothing declares (a
 * typo), and the settings whose value must be the same on every rank.
 */
#include "runtime.h"
#include "mr_plugin.h"

#include <stdlib.h>
#include <string.h>

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
    if (ops->settings_passthrough_prefix != NULL) {
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
    mr__plugin_dirs_init(dirs, rt.cfg.plugin_path);
    mr__plugin_list_substrates(dirs, rt_find_setting, &q);
    free(dirs);
    return q.found;
}

/*
 * Warns about MAILRAIL_* variables that no setting of the core, of a
 * flow-control policy or of a substrate plugin declares. A substrate may hand
 * a prefix on to a library that checks it (MAILRAIL_UCX_* to UCX).
 */
size_t rt_setting_tables(const mr_config_entry_t **tables, size_t *sizes, size_t max)
{
    size_t n = 0;

    if (n < max) tables[n] = mr__core_config_table, sizes[n++] = sizeof(mr_core_config_t);
    if (n < max) tables[n] = mr__flowctl_config_table, sizes[n++] = sizeof(mr_flowctl_config_t);
    for (size_t i = 0; mr__flowctl_names[i] != NULL && n < max; i++) {
        const mr_flowctl_ops_t *policy = mr__flowctl_find(mr__flowctl_names[i]);
        if (policy == NULL || policy->config_table == NULL) continue;
        tables[n] = policy->config_table;
        sizes[n++] = policy->config_size;
    }
    return n;
}

void rt_warn_unknown_settings(void)
{
    const mr_config_entry_t *tables[RT_SETTING_TABLES_MAX + 1];
    size_t sizes[RT_SETTING_TABLES_MAX];
    const char *skip[2] = {NULL, NULL};
    size_t ntables = rt_setting_tables(tables, sizes, RT_SETTING_TABLES_MAX);

    tables[ntables++] = rt.substrate->config_table;
    skip[0] = rt.substrate->settings_passthrough_prefix;
    mr__config_warn_unknown(tables, ntables, skip, rt_declared_by_other_substrate, NULL);
}

/* ---- Settings that must agree across ranks ------------------------------------------- */

#define RT_AGREED_MAX 16
#define RT_AGREED_TEXT 64

/*
 * Settings whose value must be the same on every rank: they decide which
 * collectives init runs, the wire format and the credits. The receive pool
 * decides the credits under rank and node, and every setting of the policy.
 */
static const char *const rt_job_wide[] = {"MAILRAIL_DATAGRAM_SIZE", "MAILRAIL_RANKS_PER_NODE",
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
    mr__config_format_value(e, cfg, a->text[a->n], RT_AGREED_TEXT);
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
mr_status_t rt_agree_settings(void)
{
    rt_agreed_t mine = {0};
    uint64_t *all;
    char first[RT_AGREED_MAX][RT_AGREED_TEXT];
    mr_status_t status;
    int bad = -1, differ = 0, first_rank = -1;

    rt_agreed_add(&mine, mr__config_find(mr__core_config_table, "MAILRAIL_SUBSTRATE"), &rt.cfg);
    rt_agreed_add(&mine, mr__config_find(mr__flowctl_config_table, "MAILRAIL_FLOWCTL"), &rt.fcfg);
    for (size_t i = 0; rt_job_wide[i] != NULL; i++) {
        rt_agreed_add(&mine, mr__config_find(mr__core_config_table, rt_job_wide[i]), &rt.cfg);
    }
    if (strcmp(rt.flowctl->name, "none") != 0) {
        rt_agreed_add(&mine, mr__config_find(mr__core_config_table, "MAILRAIL_RECV_SLOTS"), &rt.cfg);
    }
    for (const mr_config_entry_t *e = rt.flowctl->config_table; e != NULL && e->name != NULL;
         e++) {
        rt_agreed_add(&mine, e, rt.flowctl_config);
    }
    if (rt.substrate->job_wide_settings != NULL) {
        for (const char *const *n = rt.substrate->job_wide_settings; *n != NULL; n++) {
            rt_agreed_add(&mine, mr__config_find(rt.substrate->config_table, *n),
                          rt.substrate_config);
        }
    }
    all = calloc((size_t)rt.size * RT_AGREED_MAX, sizeof(*all));
    if (all == NULL) {
        mr_error("Cannot allocate the settings digests of %d ranks.", rt.size);
        return MR_ERR_NO_MEMORY;
    }
    status = rt_allgather(mine.hash, all, sizeof(mine.hash));
    /*
     * The first setting, in table order, on which some rank differs from rank
     * 0. Every rank holds every digest and so finds the same one: the values
     * are sent (two broadcasts) only then.
     */
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
    /* Every rank learns rank 0's value and the first differing rank's. */
    char other[RT_AGREED_MAX][RT_AGREED_TEXT];
    memcpy(first, mine.text, sizeof(first));
    memcpy(other, mine.text, sizeof(other));
    status = rt_bcast(first, sizeof(first), 0);
    if (status == MR_OK) status = rt_bcast(other, sizeof(other), first_rank);
    if (status != MR_OK) return status;
    mr_error("%s must be the same on every rank: it is \"%s\" on rank 0 but \"%s\" on rank %d "
             "(%d rank(s) differ from rank 0; this rank has \"%s\").",
             bad < mine.n ? mine.name[bad] : "a setting of the flow-control policy", first[bad],
             other[bad], first_rank, differ, bad < mine.n ? mine.text[bad] : "");
    return MR_ERR_CONFIG;
}
