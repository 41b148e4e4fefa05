/*
 * Unit tests of the core's building blocks: the settings parser, the pools,
 * the deferred send queue, the pointer map, credit returns and the node credit
 * segment.
 * Single process, no MPI.
 */
#include "items_wire.h"
#include "mr_config.h"
#include "mr_credit.h"
#include "mr_flowctl.h"
#include "mr_log.h"
#include "mr_node_segment.h"
#include "mr_node_wake.h"
#include "mr_pool.h"
#include "mr_time.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- Settings ------------------------------------------------------------------------ */

/* The core's and flow control's settings, and what they fill. */
static const mr_config_entry_t *const config_tables[] = {mr__core_config_table,
                                                         mr__flowctl_config_table};

typedef union config_any {
    mr_core_config_t core;
    mr_flowctl_config_t flowctl;
} config_any_t;

/* The entry named `name`, and in *table the table it is in. */
static const mr_config_entry_t *find_entry_in(const char *name, const mr_config_entry_t **table)
{
    for (size_t t = 0; t < sizeof(config_tables) / sizeof(config_tables[0]); t++) {
        const mr_config_entry_t *e = mr__config_find(config_tables[t], name);
        if (e != NULL) {
            if (table != NULL) *table = config_tables[t];
            return e;
        }
    }
    return NULL;
}

static const mr_config_entry_t *find_entry(const char *name)
{
    return find_entry_in(name, NULL);
}

START_TEST(config_defaults)
{
    mr_core_config_t cfg;

    for (const mr_config_entry_t *e = mr__core_config_table; e->name; e++) unsetenv(e->name);
    memset(&cfg, 0xff, sizeof(cfg));
    ck_assert_int_eq(mr__config_parse(mr__core_config_table, &cfg), MR_OK);
    ck_assert_str_eq(cfg.substrate, "ucx");
    ck_assert_uint_eq(cfg.datagram_size, 4096);
    ck_assert_uint_eq(cfg.send_slots, 256);
    ck_assert_uint_eq(cfg.recv_slots, 1024);
    ck_assert_str_eq(cfg.plugin_path, "");
    ck_assert_uint_eq(cfg.log_level, MR_LOG_WARN);
    ck_assert_uint_eq(cfg.ranks_per_node, 0);
    ck_assert(cfg.numa);

    mr_flowctl_config_t fc;
    for (const mr_config_entry_t *e = mr__flowctl_config_table; e->name; e++) unsetenv(e->name);
    memset(&fc, 0xff, sizeof(fc));
    ck_assert_int_eq(mr__config_parse(mr__flowctl_config_table, &fc), MR_OK);
    ck_assert_str_eq(mr__flowctl_names[fc.policy], "none");
    ck_assert_uint_eq(fc.credit_return_threshold, 2);
    ck_assert_uint_eq(fc.credit_horizon_us, 1000);
    ck_assert(fc.piggyback);
}
END_TEST

START_TEST(config_good_values)
{
    mr_core_config_t cfg;
    char err[256];

    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_DATAGRAM_SIZE"), "64K", &cfg,
                                           err, sizeof(err)), MR_OK);
    ck_assert_uint_eq(cfg.datagram_size, 65536);
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_DATAGRAM_SIZE"), "1m", &cfg,
                                           err, sizeof(err)), MR_OK);
    ck_assert_uint_eq(cfg.datagram_size, 1u << 20);
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_DATAGRAM_SIZE"), "100", &cfg,
                                           err, sizeof(err)), MR_OK);
    ck_assert_uint_eq(cfg.datagram_size, 100);
    mr_flowctl_config_t fc;
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_FLOWCTL"), "NODE", &fc, err,
                                           sizeof(err)), MR_OK);
    ck_assert_str_eq(mr__flowctl_names[fc.policy], "node");
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_NUMA"), "off", &cfg, err,
                                           sizeof(err)), MR_OK);
    ck_assert(!cfg.numa);
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_LOG_LEVEL"), "debug", &cfg, err,
                                           sizeof(err)), MR_OK);
    ck_assert_uint_eq(cfg.log_level, MR_LOG_DEBUG);

    setenv("MAILRAIL_SEND_SLOTS", "7", 1);
    setenv("MAILRAIL_SUBSTRATE", "mpi", 1);
    ck_assert_int_eq(mr__config_parse(mr__core_config_table, &cfg), MR_OK);
    ck_assert_uint_eq(cfg.send_slots, 7);
    ck_assert_str_eq(cfg.substrate, "mpi");
    unsetenv("MAILRAIL_SEND_SLOTS");
    unsetenv("MAILRAIL_SUBSTRATE");
}
END_TEST

/*
 * MAILRAIL_SEND_BYTES unset scales with the datagram (64 of them, 256K at
 * least); a value that is set, 0 (no limit) included, is kept as it is.
 */
START_TEST(config_send_bytes_follow_the_datagram)
{
    mr_core_config_t cfg = {.datagram_size = 4096, .send_bytes = 256u << 10};

    ck_assert_uint_eq(mr__config_send_bytes(&cfg, false), 256u << 10);
    cfg.datagram_size = 1024;
    ck_assert_uint_eq(mr__config_send_bytes(&cfg, false), 256u << 10);
    cfg.datagram_size = 256u << 10;
    ck_assert_uint_eq(mr__config_send_bytes(&cfg, false), 16u << 20);
    ck_assert_uint_eq(mr__config_send_bytes(&cfg, true), 256u << 10);
    cfg.send_bytes = 0;
    ck_assert_uint_eq(mr__config_send_bytes(&cfg, true), 0);
}
END_TEST

/* Each bad value must fail, name the variable and the value, and leave the field alone. */
static const struct {
    const char *name, *value, *allowed;
} bad_values[] = {
    {"MAILRAIL_DATAGRAM_SIZE", "abc", "a size from 16 to 67108864"},
    {"MAILRAIL_DATAGRAM_SIZE", "", "a size from 16"},
    {"MAILRAIL_DATAGRAM_SIZE", "8", "a size from 16"},
    {"MAILRAIL_DATAGRAM_SIZE", "128M", "to 67108864 bytes"},
    {"MAILRAIL_DATAGRAM_SIZE", "4KX", "suffixes K, M, G"},
    {"MAILRAIL_DATAGRAM_SIZE", "-4096", "a size from"},
    {"MAILRAIL_DATAGRAM_SIZE", "99999999999999999999999", "a size from"},
    {"MAILRAIL_SEND_SLOTS", "0", "an integer from 1 to"},
    {"MAILRAIL_SEND_SLOTS", "12k", "an integer from 1"},
    {"MAILRAIL_SEND_SLOTS", " 12", "an integer"},
    {"MAILRAIL_RECV_SLOTS", "1e3", "an integer"},
    {"MAILRAIL_FLOWCTL", "credit", "none|rank|node"},
    {"MAILRAIL_CREDIT_HORIZON_US", "99", "an integer from 100 to 500000"},
    {"MAILRAIL_CREDIT_HORIZON_US", "2ms", "an integer from 100"},
    {"MAILRAIL_YIELD", "sometimes", "auto|always|never"},
    {"MAILRAIL_WAIT_NAP", "yes", "auto|always|never"},
    {"MAILRAIL_LOG_LEVEL", "loud", "error|warn|info|debug|trace"},
    {"MAILRAIL_NUMA", "maybe", "yes|no"},
};

START_TEST(config_bad_values)
{
    const mr_config_entry_t *table = NULL, *e = find_entry_in(bad_values[_i].name, &table);
    config_any_t cfg, before;
    char err[512] = "";
    char expect[128];

    ck_assert_ptr_nonnull(e);
    memset(&cfg, 0x5a, sizeof(cfg));
    before = cfg;
    ck_assert_int_eq(mr__config_parse_value(e, bad_values[_i].value, &cfg, err, sizeof(err)),
                     MR_ERR_CONFIG);
    ck_assert(memcmp(&cfg, &before, sizeof(cfg)) == 0);
    snprintf(expect, sizeof(expect), "%s=\"%s\"", bad_values[_i].name, bad_values[_i].value);
    ck_assert_msg(strstr(err, expect) != NULL, "message \"%s\" lacks \"%s\"", err, expect);
    ck_assert_msg(strstr(err, bad_values[_i].allowed) != NULL, "message \"%s\" lacks \"%s\"",
                  err, bad_values[_i].allowed);

    /* The same through the environment fails the whole parse. */
    setenv(bad_values[_i].name, bad_values[_i].value, 1);
    ck_assert_int_eq(mr__config_parse(table, &cfg), MR_ERR_CONFIG);
    unsetenv(bad_values[_i].name);
}
END_TEST

/* mr_check_setting(): what mr_init() would accept, without initializing. */
START_TEST(check_setting_before_init)
{
    /* The refusals below log what is allowed, as mr_init() would. */
    ck_assert_int_eq(mr_check_setting("MAILRAIL_FLOWCTL", "node"), MR_OK);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_FLOWCTL", "fast"), MR_ERR_CONFIG);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_DATAGRAM_SIZE", "64K"), MR_OK);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_DATAGRAM_SIZE", "8"), MR_ERR_CONFIG);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_CREDIT_RETURN_THRESHOLD", "0"), MR_ERR_CONFIG);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_NODE_CREDITS", "8"), MR_OK);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_NO_SUCH_SETTING", "1"), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_check_setting(NULL, "1"), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_check_setting("MAILRAIL_FLOWCTL", NULL), MR_ERR_INVALID_PARAM);
}
END_TEST

START_TEST(config_string_too_long)
{
    char value[MR_CONFIG_STRING_MAX + 10];
    mr_core_config_t cfg;
    char err[512];

    memset(value, 'a', sizeof(value) - 1);
    value[sizeof(value) - 1] = '\0';
    ck_assert_int_eq(mr__config_parse_value(find_entry("MAILRAIL_PLUGIN_PATH"), value, &cfg, err,
                                           sizeof(err)), MR_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(err, "MAILRAIL_PLUGIN_PATH"));
}
END_TEST

START_TEST(config_table_is_documented)
{
    const mr_config_entry_t *e = config_tables[_i];

    for (; e->name; e++) {
        ck_assert_msg(strncmp(e->name, "MAILRAIL_", 9) == 0, "%s lacks the prefix", e->name);
        ck_assert_msg(e->doc != NULL && strlen(e->doc) > 20, "%s has no doc", e->name);
        ck_assert_msg(e->type != MR_CONFIG_ENUM || e->choices != NULL, "%s has no choices",
                      e->name);
    }
}
END_TEST

/* ---- Pools --------------------------------------------------------------------------- */

START_TEST(pool_get_put_index)
{
    mr_pool_t pool;
    uint32_t got[8];

    ck_assert_int_eq(mr__pool_init(&pool, 8, 100, _i == 1), MR_OK);
    ck_assert_uint_eq(pool.stride % 64, 0);
    ck_assert_uint_ge(pool.stride, 100);
    for (int i = 0; i < 8; i++) {
        got[i] = mr__pool_get(&pool);
        ck_assert_uint_eq(got[i], (uint32_t)i);
        memset(mr__pool_slot(&pool, got[i]), i, 100); /* Every byte is writable. */
    }
    ck_assert_uint_eq(mr__pool_get(&pool), MR_NIL);
    ck_assert_uint_eq(mr__pool_in_use(&pool), 8);
    for (int i = 0; i < 8; i++) {
        char *slot = mr__pool_slot(&pool, (uint32_t)i);
        ck_assert_uint_eq(mr__pool_index(&pool, slot), (uint32_t)i);
        ck_assert_uint_eq(mr__pool_index(&pool, slot + 1), MR_NIL);
        ck_assert_int_eq(slot[99], i);
    }
    ck_assert_uint_eq(mr__pool_index(&pool, pool.base + pool.mapped_bytes), MR_NIL);
    ck_assert_uint_eq(mr__pool_index(&pool, pool.base - pool.stride), MR_NIL);
    ck_assert(!mr__pool_contains(&pool, &pool));
    mr__pool_put(&pool, 5);
    mr__pool_put(&pool, 2);
    ck_assert_uint_eq(mr__pool_in_use(&pool), 6);
    ck_assert_uint_eq(mr__pool_get(&pool), 2);
    ck_assert_uint_eq(mr__pool_get(&pool), 5);
    mr__pool_fini(&pool);
    ck_assert_ptr_null(pool.base);
}
END_TEST

/* ---- Deferred send queue ------------------------------------------------------------- */

START_TEST(deferq_fifo_per_destination)
{
    mr_deferq_t q;

    ck_assert_int_eq(mr__deferq_init(&q, 4, 16), MR_OK);
    ck_assert_int_eq(mr__deferq_first(&q), -1);
    mr__deferq_push(&q, 2, 10);
    mr__deferq_push(&q, 0, 3);
    mr__deferq_push(&q, 2, 11);
    mr__deferq_push(&q, 2, 4);
    mr__deferq_push(&q, 0, 7);
    ck_assert_uint_eq(q.depth, 5);
    ck_assert_uint_eq(q.peak_depth, 5);
    ck_assert_int_eq(q.ring_count, 2);
    ck_assert_uint_eq(q.queued[0], 2);
    ck_assert_uint_eq(q.queued[1], 0);
    ck_assert_uint_eq(q.queued[2], 3);
    ck_assert_uint_eq(mr__deferq_peek(&q, 1), MR_NIL);
    ck_assert_uint_eq(mr__deferq_pop(&q, 1), MR_NIL);
    ck_assert_uint_eq(mr__deferq_pop(&q, 2), 10);
    ck_assert_uint_eq(mr__deferq_pop(&q, 2), 11);
    ck_assert_uint_eq(mr__deferq_pop(&q, 0), 3);
    mr__deferq_push(&q, 2, 12);
    ck_assert_uint_eq(mr__deferq_pop(&q, 2), 4);
    ck_assert_uint_eq(mr__deferq_pop(&q, 2), 12);
    ck_assert_uint_eq(mr__deferq_pop(&q, 2), MR_NIL);
    ck_assert_uint_eq(q.queued[2], 0);
    ck_assert_uint_eq(q.queued[0], 1);
    ck_assert_int_eq(q.ring_count, 1);
    ck_assert_int_eq(mr__deferq_first(&q), 0);
    ck_assert_uint_eq(mr__deferq_pop(&q, 0), 7);
    ck_assert_int_eq(mr__deferq_first(&q), -1);
    ck_assert_uint_eq(q.depth, 0);
    ck_assert_uint_eq(q.peak_depth, 5);
    mr__deferq_fini(&q);
}
END_TEST

/* Visiting the ring while destinations leave it sees each remaining one once, in order. */
START_TEST(deferq_ring_round_robin)
{
    mr_deferq_t q;
    int order[8], n = 0;

    ck_assert_int_eq(mr__deferq_init(&q, 6, 16), MR_OK);
    mr__deferq_push(&q, 3, 0);
    mr__deferq_push(&q, 1, 1);
    mr__deferq_push(&q, 5, 2);
    mr__deferq_push(&q, 1, 3);
    mr__deferq_push(&q, 0, 4);
    ck_assert_int_eq(q.ring_count, 4);
    /* One pass popping one message per destination, as the core's drain does. */
    int count = q.ring_count, dest = mr__deferq_first(&q);
    for (int i = 0; i < count && dest >= 0; i++) {
        int next = mr__deferq_next(&q, dest);
        order[n++] = dest;
        mr__deferq_pop(&q, dest);
        dest = next;
    }
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(order[0], 3);
    ck_assert_int_eq(order[1], 1);
    ck_assert_int_eq(order[2], 5);
    ck_assert_int_eq(order[3], 0);
    ck_assert_int_eq(q.ring_count, 1);
    ck_assert_int_eq(mr__deferq_first(&q), 1);
    ck_assert_uint_eq(mr__deferq_pop(&q, 1), 3);
    ck_assert_int_eq(q.ring_count, 0);
    mr__deferq_fini(&q);
}
END_TEST

/* ---- Pointer map ---------------------------------------------------------------------- */

/* Random puts and deletes against a plain array as the reference. */
START_TEST(ptrmap_matches_reference)
{
    enum { KEYS = 300, OPS = 20000 };
    static char base[KEYS * 64];
    uint32_t ref[KEYS];
    mr_ptrmap_t map;
    uint64_t rng = 12345;

    ck_assert_int_eq(mr__ptrmap_init(&map, 128), MR_OK);
    for (int k = 0; k < KEYS; k++) ref[k] = MR_NIL;
    for (int op = 0; op < OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        /* Keys 64 bytes apart, as buffers are; at most 128 live at once. */
        int k = (int)((rng >> 33) % KEYS);
        const void *key = base + (size_t)k * 64;
        int live = 0;
        for (int i = 0; i < KEYS; i++) live += ref[i] != MR_NIL;
        if ((rng >> 20) % 3 != 0 && (live < 128 || ref[k] != MR_NIL)) {
            ref[k] = (uint32_t)op;
            mr__ptrmap_put(&map, key, (uint32_t)op);
        } else if ((rng >> 40) % 4 == 0 && ref[k] != MR_NIL) {
            /* A removal that names another value removes nothing. */
            mr__ptrmap_del_if(&map, key, ref[k] + 1);
        } else {
            uint32_t value = ref[k];
            ref[k] = MR_NIL;
            if ((rng >> 42) % 2 != 0) mr__ptrmap_del_if(&map, key, value);
            else mr__ptrmap_del(&map, key);
        }
        if (op % 97 == 0) {
            for (int i = 0; i < KEYS; i++) {
                ck_assert_uint_eq(mr__ptrmap_get(&map, base + (size_t)i * 64), ref[i]);
            }
        }
    }
    ck_assert_uint_eq(mr__ptrmap_get(&map, NULL), MR_NIL);
    ck_assert_uint_eq(mr__ptrmap_get(&map, base + 1), MR_NIL);
    mr__ptrmap_fini(&map);
}
END_TEST

/* ---- Credit returns ------------------------------------------------------------------ */

/* What send_control was asked to send, and what it answers. */
typedef struct credit_calls {
    int n;
    int dest[16];
    uint32_t credits[16];
    int failed_rank;          /* Answers MR_ERR_PEER_FAILED for this rank. */
} credit_calls_t;

static mr_status_t credit_record(void *core, int dest, uint32_t imm)
{
    credit_calls_t *calls = core;

    if (dest == calls->failed_rank) return MR_ERR_PEER_FAILED;
    ck_assert_int_lt(calls->n, 16);
    calls->dest[calls->n] = dest;
    calls->credits[calls->n++] = imm;
    return MR_OK;
}

/*
 * A key that stands for 4 ranks on another host (a node) gets 4 times the
 * window per rank (once the rate is known; the floor of 2 credits per key
 * before), and a return goes whole, in one message, to its latest sender; a
 * sender that is gone leaves it to the next. A key on this host (weight 0)
 * gets its whole share back, from its one last sender.
 */
START_TEST(credit_returns_go_whole_to_a_nodes_latest_sender)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 4, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[2] = {4, 0};
    mr_credit_owed_t o;

    ck_assert_int_eq(mr__credit_owed_init(&o, 2, 64, true, weight, &params), MR_OK);
    ck_assert_uint_eq(o.key[0].held, MR_CREDIT_INITIAL);
    ck_assert_uint_eq(o.key[1].held, 64);
    /* Before any rate is known: the floor, per key whatever it stands for. */
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), MR_CREDIT_INITIAL);
    /* 1.5 credits per rank: a node of 4 may have 6 outstanding. */
    o.win.per_rank_q8 = 3 << 7;
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 6);
    o.win.per_rank_q8 = 2 << 8;
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 8);
    ck_assert_uint_eq(mr__credit_owed_return_at(&o, 0), 2);
    /* The first arrival makes the rest of the window due, to the only sender. */
    mr__credit_owed_arrived(&o, 0, 10);
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_int_eq(calls.dest[0], 10);
    ck_assert_uint_eq(calls.credits[0], 7);
    ck_assert_uint_eq(o.key[0].held, 8);
    ck_assert_uint_eq(o.key[0].owed, 55);

    /* Five senders: the four latest are kept, the latest first. */
    const int order[8] = {12, 13, 14, 10, 11, 13, 12, 13};
    for (int i = 0; i < 8; i++) mr__credit_owed_arrived(&o, 0, order[i]);
    ck_assert_int_eq(o.key[0].nsenders, 4);
    ck_assert_int_eq(o.key[0].sender[0], 13);
    ck_assert_int_eq(o.key[0].sender[1], 12);
    ck_assert_int_eq(o.key[0].sender[2], 11);
    ck_assert_int_eq(o.key[0].sender[3], 10);
    /* 13 is gone: the whole return goes to 12, in one message. */
    calls.n = 0;
    calls.failed_rank = 13;
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_int_eq(calls.dest[0], 12);
    ck_assert_uint_eq(calls.credits[0], 8);
    ck_assert_int_eq(o.key[0].nsenders, 3);
    ck_assert_int_eq(o.key[0].sender[0], 12);
    ck_assert_uint_eq(o.key[0].held, 8);
    ck_assert_uint_eq(o.key[0].owed, 47);

    /* The local key: static, its whole share at once, to its last sender. */
    calls.n = 0;
    for (int i = 0; i < 16; i++) mr__credit_owed_arrived(&o, 1, 4);
    for (int i = 0; i < 16; i++) mr__credit_owed_consume(&o, 1, i < 15 ? 4 : 3);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_int_eq(calls.dest[0], 3);
    ck_assert_uint_eq(calls.credits[0], 16);
    ck_assert_uint_eq(o.key[1].held, 64);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * A debt rides on a data message only from half a return's worth on (here 2
 * of a return threshold of 4): below that most data messages carry no
 * credits, which UCX sends without a header.
 */
START_TEST(credit_piggyback_from_half_a_return)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 4, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[1] = {0};
    mr_credit_owed_t o;

    ck_assert_int_eq(mr__credit_owed_init(&o, 1, 16, false, weight, &params), MR_OK);
    ck_assert_uint_eq(mr__credit_owed_return_at(&o, 0), 4);
    mr__credit_owed_arrived(&o, 0, 5);
    mr__credit_owed_consume(&o, 0, 5);
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 0);
    mr__credit_owed_arrived(&o, 0, 5);
    mr__credit_owed_consume(&o, 0, 5);
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 2);
    ck_assert_uint_eq(o.key[0].owed, 0);
    ck_assert_uint_eq(o.key[0].held, 16);
    ck_assert_int_eq(calls.n, 0);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * The return and piggyback thresholds of an adaptive key follow its window
 * from one message to the next (credit.c keeps them per key and works them
 * out again when the window changes): a window that grows less than a return's
 * worth of room returns nothing, and the old, smaller threshold must not.
 */
START_TEST(credit_thresholds_follow_the_window)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 2, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[1] = {1};
    mr_credit_owed_t o;

    ck_assert_int_eq(mr__credit_owed_init(&o, 1, 64, true, weight, &params), MR_OK);
    ck_assert_uint_eq(mr__credit_owed_return_at(&o, 0), 1);
    /* A window of 16: the first arrival makes 15 due, at progress. */
    o.win.per_rank_q8 = 16 << 8;
    mr__credit_owed_arrived(&o, 0, 5);
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    ck_assert_uint_eq(calls.credits[0], 15);
    ck_assert_uint_eq(o.key[0].held, 16);
    /* 4 arrive: 4 of room, short of a return's worth (8). */
    for (int i = 0; i < 4; i++) mr__credit_owed_arrived(&o, 0, 5);
    ck_assert_int_eq(mr__credit_owed_progress(&o), 0);
    /* A window of 8 (returns from 4 on) has no room for the 12 held. */
    o.win.per_rank_q8 = 8 << 8;
    mr__credit_owed_consume(&o, 0, 5);
    ck_assert_int_eq(calls.n, 1);
    /* A window of 20 has 8 of room: short of its return (10), above its piggyback (5). */
    o.win.per_rank_q8 = 20 << 8;
    mr__credit_owed_consume(&o, 0, 5);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 8);
    ck_assert_uint_eq(o.key[0].held, 20);
    /* A window of 26 has 6 of room: short of its piggyback (7), above the last one. */
    o.win.per_rank_q8 = 26 << 8;
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 0);
    mr__credit_owed_consume(&o, 0, 5);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_uint_eq(o.key[0].held, 20);
    ck_assert_uint_eq(o.key[0].owed, 42);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * The window covers MAILRAIL_CREDIT_HORIZON_US at the best recent rate (1 ms
 * when the caller leaves it 0), or twice a longer credit loop, shared by the
 * active sending ranks, and at most the static share.
 */
START_TEST(credit_window_follows_the_horizon)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 2, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[1] = {4};
    const struct {
        uint64_t horizon_ns, loop_ns;
        uint32_t active;
        double per_rank;
    } cases[] = {
        {0, 0, 1, 10.0},              /* 10,000 messages/s over the default 1 ms. */
        {2000000, 0, 1, 20.0},
        {8000000, 0, 1, 80.0},        /* Four times the horizon, four times the window. */
        {8000000, 0, 4, 20.0},        /* Shared by four active ranks. */
        {2000000, 3000000, 1, 60.0},  /* A 3 ms loop: twice it, 6 ms. */
        {8000000, 3000000, 1, 80.0},  /* ... unless the horizon is longer. */
    };
    mr_credit_owed_t o;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        params.horizon_ns = cases[i].horizon_ns;
        ck_assert_int_eq(mr__credit_owed_init(&o, 1, 1000, true, weight, &params), MR_OK);
        o.win.rate = 10000.0;
        o.win.active = cases[i].active;
        o.win.loop_ns = cases[i].loop_ns;
        mr__credit_window_resize(&o.win, o.limit);
        ck_assert_msg(o.win.per_rank_q8 == (uint64_t)(cases[i].per_rank * 256.0) + 1,
                      "case %zu: %llu/256 per rank, not %.0f", i,
                      (unsigned long long)o.win.per_rank_q8, cases[i].per_rank);
        /* The holder stands for 4 ranks: 4 shares, rounded up. */
        ck_assert_uint_eq(mr__credit_owed_window(&o, 0), (uint32_t)(cases[i].per_rank * 4) + 1);
        mr__credit_owed_fini(&o);
    }
    /* A window beyond the static share is the share. */
    params.horizon_ns = 500000000;
    ck_assert_int_eq(mr__credit_owed_init(&o, 1, 1000, true, weight, &params), MR_OK);
    o.win.rate = 10000.0;
    mr__credit_window_resize(&o.win, o.limit);
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 1000);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * MAILRAIL_CREDIT_GROW: a key whose senders ask for credit (a control message
 * of MR_CREDIT_ASK) gets twice its window, up to its share, at most once per
 * credit loop (never before one was timed), and the credits that makes due go
 * back at progress. Every whole epoch without an ask halves it. Without the
 * setting, or for a static key, asks change nothing.
 */
START_TEST(credit_window_grows_for_senders_that_ask)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 2, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[2] = {4, 0};
    mr_credit_owed_t o;

    ck_assert_int_eq(mr__credit_owed_init(&o, 2, 64, true, weight, &params), MR_OK);
    ck_assert_int_eq(mr__credit_ask(&o, 0, 7), MR_OK);
    ck_assert_int_eq(calls.n, 0);
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 0);
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), MR_CREDIT_INITIAL);
    mr__credit_owed_fini(&o);

    params.grow = true;
    ck_assert_int_eq(mr__credit_owed_init(&o, 2, 64, true, weight, &params), MR_OK);
    /* The sender's side: a control message of MR_CREDIT_ASK, to an adaptive key only. */
    ck_assert_int_eq(mr__credit_ask(&o, 0, 7), MR_OK);
    ck_assert_int_eq(mr__credit_ask(&o, 1, 9), MR_OK);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_int_eq(calls.dest[0], 7);
    ck_assert_uint_eq(calls.credits[0], MR_CREDIT_ASK);
    calls.n = 0;
    mr__credit_owed_arrived(&o, 0, 10);
    mr__credit_owed_asked(&o, 1);
    ck_assert_uint_eq(o.key[1].grown, 0);
    /* No credit loop timed yet: nothing to judge a change by. */
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 0);
    /* Doubled: 2 of the 4 go back at progress, to the latest sender. */
    o.win.loop_ns = 1000000;
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 4);
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 4);
    ck_assert_uint_eq(mr__credit_owed_return_at(&o, 0), 2);
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    ck_assert_int_eq(calls.dest[0], 10);
    ck_assert_uint_eq(calls.credits[0], 3);
    ck_assert_uint_eq(o.key[0].held, 4);
    /* Asked again within a loop: nothing. */
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 4);
    /* A loop later: doubled again, whatever the rate did. */
    o.key[0].grown_ns -= 10000000;
    o.win.rate = 1000.0;
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 8);
    o.key[0].grown_ns -= 10000000;
    o.win.rate = 900.0;
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 16);
    ck_assert_uint_eq(o.grows, 3);
    /* Up to the share, never beyond. */
    o.key[0].grown = 40;
    o.key[0].grown_ns -= 10000000;
    o.win.rate = 4000.0;
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 64);
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 64);
    /* Two whole epochs without an ask: a quarter, at the next arrival. */
    o.win.epoch = o.key[0].asked_epoch + 3;
    mr__credit_owed_arrived(&o, 0, 10);
    ck_assert_uint_eq(o.key[0].grown, 16);
    ck_assert_uint_eq(mr__credit_owed_window(&o, 0), 16);
    /* The next ask doubles it at once. */
    mr__credit_owed_asked(&o, 0);
    ck_assert_uint_eq(o.key[0].grown, 32);
    mr__credit_owed_fini(&o);
}
END_TEST

/* Ends the window's epoch at key 0's next arrival (an interval of 16 arrivals, 2 ms long). */
static void credit_roll_epoch(mr_credit_owed_t *o)
{
    o->key[0].held = 1000; /* The arrival comes on a credit. */
    o->win.interval_start_ns = mr__now_ns() - 2 * MR_NS_PER_MS;
    o->win.interval_arrivals = 15;
    o->win.epoch_end_ns = 1;
    mr__credit_owed_arrived(o, 0, 10);
}

/*
 * The shortest credit loop is that of the last epoch: a new one replaces it,
 * and one that no new loop replaced in a whole epoch halves, until twice it is
 * within the horizon (1 ms by default). A 128 ms loop of a job's start held a
 * 1,024:1 window wide for a whole trial before (docs/incast.md).
 */
START_TEST(credit_loop_not_timed_again_halves)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_flowctl_params_t params = {.return_threshold = 2, .core = &calls,
                                  .send_control = credit_record};
    const uint32_t weight[1] = {4};
    mr_credit_owed_t o;
    uint64_t expect = 128 * MR_NS_PER_MS;
    uint32_t epoch;

    ck_assert_int_eq(mr__credit_owed_init(&o, 1, 1000, true, weight, &params), MR_OK);
    o.win.loop_fresh_ns = expect;
    credit_roll_epoch(&o);
    ck_assert_uint_eq(o.win.loop_ns, expect);
    epoch = o.win.epoch;
    for (int i = 0; i < 8; i++) {
        credit_roll_epoch(&o);
        expect /= 2;
        ck_assert_uint_eq(o.win.epoch, epoch + 1 + (uint32_t)i);
        ck_assert_msg(o.win.loop_ns == expect, "epoch %d: %llu ns, not %llu", i,
                      (unsigned long long)o.win.loop_ns, (unsigned long long)expect);
    }
    /* 0.5 ms: twice it is the horizon, so it stays. */
    ck_assert_uint_eq(expect, MR_NS_PER_MS / 2);
    credit_roll_epoch(&o);
    ck_assert_uint_eq(o.win.loop_ns, MR_NS_PER_MS / 2);
    /* A loop timed in the epoch replaces it, longer or not. */
    o.win.loop_fresh_ns = 3 * MR_NS_PER_MS;
    credit_roll_epoch(&o);
    ck_assert_uint_eq(o.win.loop_ns, 3 * MR_NS_PER_MS);
    ck_assert_uint_eq(o.uncredited, 0);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * A receiver's credits owed to one key (4 ranks on another host, static
 * grants of 64) with cumulative returns, which *calls records.
 */
static void credit_owed_cumulative_one(mr_credit_owed_t *o, credit_calls_t *calls)
{
    mr_flowctl_params_t params = {.return_threshold = 2, .core = calls,
                                  .send_control = credit_record};
    const uint32_t weight[1] = {4};

    ck_assert_int_eq(mr__credit_owed_init(o, 1, 64, false, weight, &params), MR_OK);
    mr__credit_owed_cumulative(o);
}

/*
 * Cumulative returns (the node policy): a return says the total granted back
 * so far, a piggyback too, and one put back is taken off it. A key that sends
 * nothing while it holds credits has its total said again after the repeat
 * interval, through its next senders, twice at most; an arrival in between
 * puts it off.
 */
START_TEST(credit_cumulative_returns_are_said_again)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_credit_owed_t o;

    credit_owed_cumulative_one(&o, &calls);
    /* Static: 64 held; 32 freed make a return of 32, to the latest of 3 senders. */
    for (int i = 0; i < 32; i++) mr__credit_owed_arrived(&o, 0, 10 + i % 3);
    for (int i = 0; i < 32; i++) mr__credit_owed_consume(&o, 0, 10 + i % 3);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_int_eq(calls.dest[0], 11);
    ck_assert_uint_eq(calls.credits[0], 32);
    /* A piggyback says 32 + what it takes; put back, the total is 32 again. */
    for (int i = 0; i < 16; i++) mr__credit_owed_arrived(&o, 0, 11);
    for (int i = 0; i < 16; i++) mr__credit_owed_consume_fast(&o, 0, 11) ||
                                  (mr__credit_owed_consume(&o, 0, 11), true);
    uint32_t n = mr__credit_owed_take(&o, 0);
    ck_assert_uint_eq(n, 16);
    ck_assert_uint_eq(mr__credit_owed_wire(&o, 0, n), 48);
    ck_assert_uint_eq(mr__credit_owed_put_back(&o, 0, 48), 16);
    ck_assert_uint_eq(o.key[0].total, 32);
    /* Nothing arrives: within the interval nothing is said, after it twice at most. */
    ck_assert_int_eq(mr__credit_owed_progress(&o), 0);
    o.key[0].resend_at = 1;
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    ck_assert_int_eq(calls.n, 2);
    ck_assert_uint_eq(calls.credits[1], 32);
    ck_assert_int_ne(calls.dest[1], 11);
    o.key[0].resend_at = 1;
    mr__credit_owed_arrived(&o, 0, 11);
    ck_assert_int_eq(mr__credit_owed_progress(&o), 0);
    ck_assert_uint_gt(o.key[0].resend_at, 1);
    o.key[0].resend_at = 1;
    ck_assert_int_eq(mr__credit_owed_progress(&o), 1);
    o.key[0].resend_at = 1;
    ck_assert_int_eq(mr__credit_owed_progress(&o), 0);
    ck_assert_int_eq(calls.n, 3);
    ck_assert_uint_eq(calls.credits[2], 32);
    ck_assert_int_ne(calls.dest[2], calls.dest[1]);
    ck_assert_uint_eq(o.repeats, 2);
    mr__credit_owed_fini(&o);
}
END_TEST

/*
 * Cumulative totals wrap at 2^30 (bit 30 asks for credit, bit 31 is the
 * core's failure notice): a return across the wrap says a small total, a
 * piggyback that would say 0 waits, and the node applies the difference
 * across the wrap and nothing for a total it has seen or passed.
 */
START_TEST(credit_totals_wrap_below_the_ask_and_notice_bits)
{
    credit_calls_t calls = {.failed_rank = -1};
    mr_credit_owed_t o;

    credit_owed_cumulative_one(&o, &calls);
    o.key[0].total = MR_CREDIT_TOTAL_MASK - 9;
    for (int i = 0; i < 32; i++) mr__credit_owed_arrived(&o, 0, 11);
    for (int i = 0; i < 32; i++) mr__credit_owed_consume(&o, 0, 11);
    ck_assert_int_eq(calls.n, 1);
    ck_assert_uint_eq(calls.credits[0], 22);
    ck_assert_uint_eq(o.key[0].total, 22);
    /* 20 short of the wrap, a piggyback of 20 would say 0: it waits; 21 short, it goes. */
    o.key[0].total = MR_CREDIT_TOTAL_MASK - 19;
    for (int i = 0; i < 20; i++) mr__credit_owed_arrived(&o, 0, 11);
    for (int i = 0; i < 20; i++) mr__credit_owed_consume_fast(&o, 0, 11) ||
                                  (mr__credit_owed_consume(&o, 0, 11), true);
    ck_assert_uint_eq(o.key[0].owed, 20);
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 0);
    o.key[0].total = MR_CREDIT_TOTAL_MASK - 20;
    ck_assert_uint_eq(mr__credit_owed_take(&o, 0), 20);
    ck_assert_uint_eq(mr__credit_owed_wire(&o, 0, 20), MR_CREDIT_TOTAL_MASK);
    ck_assert_int_eq(calls.n, 1);
    mr__credit_owed_fini(&o);

    ck_assert_uint_eq(mr__credit_total_gain(MR_CREDIT_TOTAL_MASK - 9, 22), 32);
    ck_assert_uint_eq(mr__credit_total_gain(22, MR_CREDIT_TOTAL_MASK - 9), 0);
    ck_assert_uint_eq(mr__credit_total_gain(22, 22), 0);
    ck_assert_uint_eq(mr__credit_total_gain(0, 64), 64);
    ck_assert_uint_eq(MR_CREDIT_TOTAL_MASK & MR_CREDIT_ASK, 0);
    ck_assert_uint_eq((MR_CREDIT_TOTAL_MASK | MR_CREDIT_ASK) & 0x80000000u, 0);
}
END_TEST

/* ---- Node credit stash ------------------------------------------------------------------- */

/* Whether a wake-up datagram waits on `fd` (and reads it). */
static bool wake_came(int fd)
{
    char c;

    return recv(fd, &c, 1, MSG_DONTWAIT) == 1;
}

/*
 * No thundering herd: three ranks of a node, two asleep for credits of rank 0
 * (one able to use 4, one 1), one asleep for another receiver. 3 credits wake
 * the first only; 2 more wake the second; the third, which waits for rank 9,
 * is never woken; a rank does not wake itself.
 */
START_TEST(node_wakes_as_many_as_can_use_the_credits)
{
    const int local_rank[4] = {0, 1, 2, 3};
    size_t size = sizeof(mr_node_segment_t) + 10 * sizeof(mr_node_credit_t) +
                  4 * sizeof(mr_node_sleeper_t);
    mr_node_segment_t *seg = aligned_alloc(64, (size + 63) / 64 * 64);
    mr_node_wake_t w[4];
    char job[64];

    ck_assert_ptr_nonnull(seg);
    memset(seg, 0, size);
    seg->ranks = 10;
    seg->local_ranks = 4;
    snprintf(job, sizeof(job), "unit-wake-%d", (int)getpid());
    for (int i = 0; i < 4; i++) {
        mr__node_wake_init(&w[i]);
        ck_assert_int_eq(mr__node_wake_open(&w[i], seg, job, local_rank, 4, i), MR_OK);
        ck_assert_int_ge(w[i].fd, 0);
    }
    ck_assert(mr__node_wake_sleep(&w[1], true, 0 + 1, 4));
    ck_assert(mr__node_wake_sleep(&w[2], true, 0 + 1, 1));
    ck_assert(mr__node_wake_sleep(&w[3], true, 9 + 1, 8));
    ck_assert_uint_eq(atomic_load(&seg->sleeping), 3);

    mr__node_wake_others(&w[0], 0, 3);
    ck_assert(wake_came(w[1].fd));
    ck_assert(!wake_came(w[2].fd));
    ck_assert_uint_eq(atomic_load(&seg->sleeping), 2);
    mr__node_wake_others(&w[0], 0, 2);
    ck_assert(wake_came(w[2].fd));
    ck_assert(!wake_came(w[3].fd));
    mr__node_wake_others(&w[3], 9, 1); /* Its own receiver: nobody else waits for it. */
    ck_assert(!wake_came(w[3].fd));
    ck_assert_uint_eq(atomic_load(&seg->sleeping), 1);
    ck_assert_uint_eq(w[0].woken, 2);

    for (int i = 0; i < 4; i++) mr__node_wake_close(&w[i]);
    free(seg);
}
END_TEST

/* One rank of a two-rank node, initialised on a thread of its own (init has barriers). */
typedef struct stash_rank {
    const mr_flowctl_ops_t *ops;
    mr_flowctl_params_t params;
    mr_flowctl_t *fc;
    mr_status_t status;
} stash_rank_t;

static pthread_barrier_t stash_barrier;

static mr_status_t stash_barrier_wait(void *core)
{
    (void)core;
    pthread_barrier_wait(&stash_barrier);
    return MR_OK;
}

/* The sends a rank of the stash tests has deferred per destination (rank_deferred). */
static uint32_t stash_deferred[3];

static uint32_t stash_deferred_to(void *core, int dest)
{
    (void)core;
    return stash_deferred[dest];
}

static void *stash_init(void *arg)
{
    stash_rank_t *r = arg;
    r->status = r->ops->init(&r->params, &r->fc);
    return NULL;
}

/*
 * Opens ranks 0 and 1 of node 0 with `ops`, rank 2 alone on node 1 (on the
 * hosts `host_of` gives), each on a thread of its own since init has
 * barriers, and fails the test unless both open.
 */
static void stash_pair_open(stash_rank_t r[2], const mr_flowctl_ops_t *ops, const int *host_of,
                            uint32_t recv_slots, bool piggyback, const char *job, void *config,
                            credit_calls_t *calls)
{
    static const int node_of[3] = {0, 0, 1};
    pthread_t thread[2];

    ck_assert_int_eq(pthread_barrier_init(&stash_barrier, NULL, 2), 0);
    for (int i = 0; i < 2; i++) {
        r[i] = (stash_rank_t){
            .ops = ops,
            .params = {.rank = i, .size = 3, .node_count = 2, .node_of_rank = node_of,
                       .host_of_rank = host_of, .recv_slots = recv_slots,
                       .return_threshold = 2, .piggyback = piggyback, .job_id = job,
                       .config = config, .core = calls, .send_control = credit_record,
                       .deferred = stash_deferred_to, .barrier = stash_barrier_wait}};
        ck_assert_int_eq(pthread_create(&thread[i], NULL, stash_init, &r[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(thread[i], NULL);
        ck_assert_int_eq(r[i].status, MR_OK);
    }
}

/*
 * Ranks 0 and 1 share node 0's pool of 8 credits for rank 2. Rank 0 takes a
 * quarter of it into its stash and spends one; rank 1 gets the rest but not
 * the stashed credit until rank 0's next progress call. A credit given back
 * after a refused send goes into the stash, and out at progress, the same way.
 */
START_TEST(node_stash_goes_back_at_progress)
{
    const int host_of[3] = {0, 0, 0};
    const mr_flowctl_ops_t *ops = mr__flowctl_find("node");
    credit_calls_t calls = {.failed_rank = -1};
    stash_rank_t r[2];
    char job[64];
    uint32_t imm;
    void *config;

    ck_assert_ptr_nonnull(ops);
    config = calloc(1, ops->config_size);
    ck_assert_ptr_nonnull(config);
    snprintf(job, sizeof(job), "unit-stash-%d", (int)getpid());
    stash_pair_open(r, ops, host_of, 16, true, job, config, &calls);

    ck_assert(ops->acquire(r[0].fc, 2, &imm));
    ck_assert_uint_eq(imm, 0);
    for (int i = 0; i < 6; i++) ck_assert(ops->acquire(r[1].fc, 2, &imm));
    ck_assert(!ops->acquire(r[1].fc, 2, &imm));
    ops->progress(r[0].fc);
    ck_assert(ops->acquire(r[1].fc, 2, &imm));
    ck_assert(!ops->acquire(r[1].fc, 2, &imm));

    ops->unacquire(r[1].fc, 2, 0);
    ck_assert(!ops->acquire(r[0].fc, 2, &imm));
    ops->progress(r[1].fc);
    ck_assert(ops->acquire(r[0].fc, 2, &imm));
    ck_assert(!ops->acquire(r[1].fc, 2, &imm));
    ck_assert_int_eq(calls.n, 0);

    for (int i = 0; i < 2; i++) ops->finalize(r[i].fc);
    pthread_barrier_destroy(&stash_barrier);
    free(config);
}
END_TEST

/*
 * Credits that come back to a rank with sends of its own waiting for them
 * stay with it (it runs now; a neighbour would have to be woken): rank 0,
 * with 3 sends deferred to rank 2, gets 5 back and keeps 3, rank 1 finds the
 * other 2 in the pool. Rank 0 keeps its 3 over progress calls while its sends
 * wait, and puts back what they no longer need.
 */
START_TEST(node_deposit_keeps_what_it_can_send)
{
    const int host_of[3] = {0, 0, 0};
    const mr_flowctl_ops_t *ops = mr__flowctl_find("node");
    credit_calls_t calls = {.failed_rank = -1};
    stash_rank_t r[2];
    char job[64];
    uint32_t imm;
    void *config;
    int got = 0;

    ck_assert_ptr_nonnull(ops);
    config = calloc(1, ops->config_size);
    ck_assert_ptr_nonnull(config);
    snprintf(job, sizeof(job), "unit-keep-%d", (int)getpid());
    stash_pair_open(r, ops, host_of, 16, false, job, config, &calls);

    /* Rank 1 takes the whole pool of 8 for rank 2 and puts nothing back. */
    while (ops->acquire(r[1].fc, 2, &imm)) got++;
    ck_assert_int_eq(got, 8);
    /* Returns say the total granted so far: 5, then 9, and 9 again adds nothing. */
    stash_deferred[2] = 3;
    ops->on_control(r[0].fc, 2, 5);
    ops->progress(r[0].fc);
    for (got = 0; ops->acquire(r[1].fc, 2, &imm); got++) continue;
    ck_assert_int_eq(got, 2);
    /* Its 3 sends go; nothing waits any more, and nothing is left. */
    for (got = 0; got < 3; got++) ck_assert(ops->acquire(r[0].fc, 2, &imm));
    stash_deferred[2] = 0;
    ops->progress(r[0].fc);
    ck_assert(!ops->acquire(r[1].fc, 2, &imm));

    /* Kept, then no longer wanted: back in the pool at the next progress call. */
    stash_deferred[2] = 4;
    ops->on_control(r[0].fc, 2, 9);
    ops->on_control(r[1].fc, 2, 9);
    ops->on_control(r[1].fc, 2, 7);
    ck_assert(!ops->acquire(r[1].fc, 2, &imm));
    stash_deferred[2] = 1;
    ops->progress(r[0].fc);
    for (got = 0; ops->acquire(r[1].fc, 2, &imm); got++) continue;
    ck_assert_int_eq(got, 3);
    stash_deferred[2] = 0;
    ck_assert_int_eq(calls.n, 0);

    for (int i = 0; i < 2; i++) ops->finalize(r[i].fc);
    pthread_barrier_destroy(&stash_barrier);
    free(config);
}
END_TEST

/*
 * acquire_n() takes what as many acquire() calls would have, for rank and
 * node (with nothing to piggyback: node's owed credits would ride on every
 * message, one at a time): rank 0 asked one credit at a time and rank 1 all
 * at once get the same, and credits given back come out once.
 */
START_TEST(acquire_n_takes_what_acquire_would)
{
    const int host_of[3] = {0, 0, 1};
    const char *names[] = {"rank", "node"};
    credit_calls_t calls = {.failed_rank = -1};

    for (int p = 0; p < 2; p++) {
        const mr_flowctl_ops_t *ops = mr__flowctl_find(names[p]);
        stash_rank_t r[2];
        char job[64];
        uint32_t imm = 0, one_by_one = 0, n;
        void *config;

        ck_assert_ptr_nonnull(ops);
        ck_assert_ptr_nonnull(ops->acquire_n);
        config = calloc(1, ops->config_size);
        ck_assert_ptr_nonnull(config);
        snprintf(job, sizeof(job), "unit-acqn-%s-%d", names[p], (int)getpid());
        /* Ranks 0 and 1 of node 0; both send to rank 2, on node 1. */
        stash_pair_open(r, ops, host_of, 64, p == 0, job, config, &calls);
        /* Rank 0 one by one, until none is left (node: rank 0's stash, then the pool). */
        while (ops->acquire(r[0].fc, 2, &imm)) {
            ck_assert_uint_eq(imm, 0);
            one_by_one++;
        }
        ck_assert_uint_gt(one_by_one, 1);
        if (p == 0) {
            /* rank: rank 1 has a grant of its own, as large; all of it at once. */
            n = 0;
            for (uint32_t got; (got = ops->acquire_n(r[1].fc, 2, 1000, &imm)) > 0;) {
                ck_assert_uint_eq(imm, 0);
                n += got;
            }
            ck_assert_uint_eq(n, one_by_one);
            ck_assert_uint_eq(ops->acquire_n(r[1].fc, 2, 1, &imm), 0);
            ops->unacquire(r[1].fc, 2, 0);
            ops->unacquire(r[1].fc, 2, 0);
            /* The first ends rank 1's wait, alone, as acquire() would; then the other. */
            ck_assert_uint_eq(ops->acquire_n(r[1].fc, 2, 5, &imm), 1);
            ck_assert_uint_eq(ops->acquire_n(r[1].fc, 2, 5, &imm), 1);
            ck_assert_uint_eq(ops->acquire_n(r[1].fc, 2, 5, &imm), 0);
        } else {
            /* node: the pool is shared and empty now; credits given back go through the stash. */
            ck_assert_uint_eq(ops->acquire_n(r[1].fc, 2, 1000, &imm), 0);
            for (int i = 0; i < 3; i++) ops->unacquire(r[0].fc, 2, 0);
            /* The first ends rank 0's wait, alone, as acquire() would; then the rest at once. */
            ck_assert_uint_eq(ops->acquire_n(r[0].fc, 2, 5, &imm), 1);
            ck_assert_uint_eq(ops->acquire_n(r[0].fc, 2, 5, &imm), 2);
            ck_assert_uint_eq(ops->acquire_n(r[0].fc, 2, 5, &imm), 0);
        }
        ck_assert_int_eq(calls.n, 0);
        for (int i = 0; i < 2; i++) ops->finalize(r[i].fc);
        pthread_barrier_destroy(&stash_barrier);
        free(config);
    }
}
END_TEST

/* ---- Node credit segment ------------------------------------------------------------- */

/* Opens a segment by name and returns its fstat(), failing the test if it is not there. */
static struct stat segment_stat(const char *name)
{
    struct stat st;
    int fd = shm_open(name, O_RDONLY, 0);

    ck_assert_msg(fd >= 0, "%s: %s", name, strerror(errno));
    ck_assert_int_eq(fstat(fd, &st), 0);
    close(fd);
    return st;
}

/*
 * A node segment is owner-only (0600) however permissive the umask, and an
 * existing name is never adopted (O_EXCL). One whose creator was SIGKILLed
 * before it could unlink the name (what a killed job leaves) is removed by
 * the cleanup that the next job's creator runs, while a live creator's is
 * kept. (test_flowctl.c checks the same cleanup through mr_init().)
 */
START_TEST(node_segment_owner_only_and_stale_cleanup)
{
    char job[40], name[128], expected[128];
    mr_node_segment_t *seg = NULL, *again = NULL;
    struct stat st;
    mode_t mask;
    pid_t child;
    int status;

    snprintf(job, sizeof(job), "mr-unit%d", (int)getpid());
    mr__node_segment_name(name, sizeof(name), job, 3);
    snprintf(expected, sizeof(expected), "/mailrail-%s-n3", job);
    ck_assert_str_eq(name, expected);
    mask = umask(0);
    ck_assert_int_eq(mr__node_segment_create(name, job, 3, 4, 2, 8, &seg), MR_OK);
    umask(mask);
    st = segment_stat(name);
    ck_assert_uint_eq(st.st_mode & 07777, 0600);
    ck_assert_uint_eq(st.st_uid, geteuid());
    ck_assert_int_eq(seg->creator_pid, (int32_t)getpid());
    ck_assert_uint_eq(atomic_load(&seg->credits[3].n), 8);
    ck_assert_int_eq(mr__node_segment_create(name, job, 3, 4, 2, 8, &again), MR_ERR_SYSTEM);
    ck_assert_ptr_null(again);
    mr__node_segment_cleanup_stale();
    ck_assert_uint_eq(segment_stat(name).st_ino, st.st_ino);
    mr__node_segment_unlink(name);
    ck_assert_int_lt(shm_open(name, O_RDONLY, 0), 0);
    ck_assert_int_eq(errno, ENOENT);
    mr__node_segment_unmap(seg);

    mr__node_segment_name(name, sizeof(name), job, 4);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (mr__node_segment_create(name, job, 4, 2, 1, 1, &seg) == MR_OK) kill(getpid(), SIGKILL);
        _exit(1);
    }
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ck_assert_uint_eq(segment_stat(name).st_mode & 07777, 0600);
    ck_assert_int_ge(mr__node_segment_cleanup_stale(), 1);
    ck_assert_int_lt(shm_open(name, O_RDONLY, 0), 0);
    ck_assert_int_eq(errno, ENOENT);
}
END_TEST

/* Runs `fn(name)` in a child as uid and gid 65534 (nobody); returns its exit status. */
static int as_nobody(int (*fn)(const char *), const char *name)
{
    pid_t child = fork();
    int status;

    ck_assert_int_ge(child, 0);
    if (child == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
            setresuid(65534, 65534, 65534) != 0) {
            _exit(100);
        }
        _exit(fn(name));
    }
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* Another user: 0 when it can neither read, nor write, nor remove (to replace) `name`. */
static int nobody_cannot_touch(const char *name)
{
    if (shm_open(name, O_RDONLY, 0) >= 0 || errno != EACCES) return 1;
    if (shm_open(name, O_RDWR, 0) >= 0 || errno != EACCES) return 2;
    if (shm_unlink(name) == 0) return 3;
    return 0;
}

/* Another user plants a perfect forgery of this job's segment under its name. */
static int nobody_forges(const char *name)
{
    mr_node_segment_t head = {.magic = MR_NODE_SEGMENT_MAGIC, .version = MR_NODE_SEGMENT_VERSION,
                              .node = 5, .ranks = 4, .creator_pid = (int32_t)getpid(),
                              .per_node = 8, .local_ranks = 2};
    size_t bytes = sizeof(head) + 4 * sizeof(mr_node_credit_t) + 2 * sizeof(mr_node_sleeper_t);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0666);

    snprintf(head.job_id, sizeof(head.job_id), "%s", name + strlen("/mailrail-"));
    *strrchr(head.job_id, '-') = '\0';
    if (fd < 0 || fchmod(fd, 0666) != 0 || ftruncate(fd, (off_t)bytes) != 0) return 1;
    return pwrite(fd, &head, sizeof(head), 0) == (ssize_t)sizeof(head) ? 0 : 2;
}

/*
 * The node segment against a second local user (uid 65534): it can neither
 * read, write nor replace a job's segment, and a segment it planted under the
 * job's name, however perfect, is refused by the creator and by the other
 * ranks, with an error that says whose it is. Needs root to switch users.
 */
START_TEST(node_segment_closed_to_other_users)
{
    char job[40], name[128];
    mr_node_segment_t *seg = NULL, *other = NULL;

    if (geteuid() != 0) {
        const char *strict = getenv("MR_TEST_STRICT");
        ck_assert_msg(strict == NULL || strcmp(strict, "1") != 0,
                      "strict_tests: this test needs root to act as a second user");
        printf("node_segment_closed_to_other_users: not root, the second user is not tried\n");
        return;
    }
    snprintf(job, sizeof(job), "mr-sec%d", (int)getpid());
    mr__node_segment_name(name, sizeof(name), job, 5);
    ck_assert_int_eq(mr__node_segment_create(name, job, 5, 4, 2, 8, &seg), MR_OK);
    ck_assert_int_eq(as_nobody(nobody_cannot_touch, name), 0);
    ck_assert_int_eq(mr__node_segment_open(name, job, 5, 4, 2, 8, &other), MR_OK);
    mr__node_segment_unmap(other);
    mr__node_segment_unlink(name);
    mr__node_segment_unmap(seg);

    /* The forgery: refused by the creator (it exists) and by a rank that opens it. */
    ck_assert_int_eq(as_nobody(nobody_forges, name), 0);
    seg = NULL;
    ck_assert_int_eq(mr__node_segment_create(name, job, 5, 4, 2, 8, &seg), MR_ERR_SYSTEM);
    ck_assert_ptr_null(seg);
    ck_assert_int_eq(mr__node_segment_open(name, job, 5, 4, 2, 8, &other), MR_ERR_SYSTEM);
    /* The cleanup of stale segments leaves other users' alone. */
    mr__node_segment_cleanup_stale();
    ck_assert_int_ge(shm_open(name, O_RDONLY, 0), 0);
    ck_assert_int_eq(shm_unlink(name), 0);
}
END_TEST

/*
 * Waits on the bootstrap nap only with more ranks than CPUs, 80 us per rank
 * per CPU within 0.1-50 ms; the launcher's count is read strictly.
 */
START_TEST(backoff_nap_follows_the_crowd)
{
    long cpus = mr__affinity_cpus();

    ck_assert_int_gt(cpus, 0);
    ck_assert_uint_eq(mr__backoff_nap_ns(1), 0);
    ck_assert_uint_eq(mr__backoff_nap_ns(cpus), 0);
    ck_assert_uint_eq(mr__backoff_nap_ns(cpus + 1),
                      (cpus + 1) * 80000 / cpus < 100000 ? 100000 : (cpus + 1) * 80000 / cpus);
    ck_assert_uint_eq(mr__backoff_nap_ns(256 * cpus), 256 * 80000);
    ck_assert_uint_eq(mr__backoff_nap_ns(1000000 * cpus), 50000000);

    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    setenv("MPI_LOCALNRANKS", "513", 1);
    ck_assert_int_eq(mr__launcher_local_ranks(), 513);
    setenv("MPI_LOCALNRANKS", "12x", 1);
    ck_assert_int_eq(mr__launcher_local_ranks(), 0);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "7", 1);
    ck_assert_int_eq(mr__launcher_local_ranks(), 7);
    unsetenv("MPI_LOCALNRANKS");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    ck_assert_int_eq(mr__launcher_local_ranks(), 0);
}
END_TEST

/* The item datagram's header and its variable-size lengths, at their boundaries. */
START_TEST(items_wire_known_answers)
{
    const size_t lengths[] = {0, 1, 127, 128, 16383, 16384, ITEMS_WIRE_VAR_MAX};
    const uint8_t want[][3] = {{0x00}, {0x01}, {0x7f}, {0x80, 0x01}, {0xff, 0x7f},
                               {0x80, 0x80, 0x01}, {0xff, 0xff, 0x7f}};
    uint8_t hdr[ITEMS_WIRE_HDR_LEN], buf[8];
    items_wire_hdr_t h;

    items_wire_hdr_encode(hdr, 0x0105, 24);
    ck_assert_mem_eq(hdr, ((uint8_t[]){5, 1, 0, 0, 24, 0, 0, 0}), ITEMS_WIRE_HDR_LEN);
    ck_assert(items_wire_hdr_decode(hdr, ITEMS_WIRE_HDR_LEN + 48, &h));
    ck_assert_uint_eq(h.number, 0x0105);
    ck_assert_uint_eq(h.item_size, 24);
    ck_assert(!items_wire_hdr_decode(hdr, ITEMS_WIRE_HDR_LEN + 47, &h)); /* Ragged. */
    ck_assert(!items_wire_hdr_decode(hdr, ITEMS_WIRE_HDR_LEN - 1, &h));
    items_wire_hdr_encode(hdr, 1, 0);
    ck_assert_uint_eq(hdr[2], ITEMS_WIRE_VARIABLE);
    ck_assert(items_wire_hdr_decode(hdr, ITEMS_WIRE_HDR_LEN + 3, &h));
    hdr[3] = 1;
    ck_assert(!items_wire_hdr_decode(hdr, ITEMS_WIRE_HDR_LEN, &h)); /* Reserved. */

    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        size_t n = items_wire_len_size(lengths[i]);
        ck_assert_ptr_eq(items_wire_len_put(buf, lengths[i]), buf + n);
        ck_assert_mem_eq(buf, want[i], n);
    }
    /* A length in a longer form than needed, cut off, too long, or past the end. */
    const uint8_t *item;
    size_t length;
    const uint8_t overlong[] = {0x81, 0x00}, cut[] = {0x80}, four[] = {0x80, 0x80, 0x80, 0x01},
                  past[] = {0x03, 'a', 'b'}, good[] = {0x02, 'a', 'b'};
    ck_assert_ptr_null(items_wire_var_next(overlong, overlong + 2, &item, &length));
    ck_assert_ptr_null(items_wire_var_next(cut, cut + 1, &item, &length));
    ck_assert_ptr_null(items_wire_var_next(four, four + 4, &item, &length));
    ck_assert_ptr_null(items_wire_var_next(past, past + 3, &item, &length));
    ck_assert_ptr_eq(items_wire_var_next(good, good + 3, &item, &length), good + 3);
    ck_assert_ptr_eq(item, good + 1);
    ck_assert_uint_eq(length, 2);
}
END_TEST

static Suite *unit_suite(void)
{
    Suite *s = suite_create("unit");
    TCase *tc = tcase_create("config");

    tcase_add_test(tc, config_defaults);
    tcase_add_test(tc, backoff_nap_follows_the_crowd);
    tcase_add_test(tc, config_good_values);
    tcase_add_test(tc, config_send_bytes_follow_the_datagram);
    tcase_add_loop_test(tc, config_bad_values, 0, sizeof(bad_values) / sizeof(bad_values[0]));
    tcase_add_test(tc, config_string_too_long);
    tcase_add_test(tc, check_setting_before_init);
    tcase_add_loop_test(tc, config_table_is_documented, 0,
                        (int)(sizeof(config_tables) / sizeof(config_tables[0])));
    suite_add_tcase(s, tc);
    tc = tcase_create("pool");
    tcase_add_loop_test(tc, pool_get_put_index, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("deferq");
    tcase_add_test(tc, deferq_fifo_per_destination);
    tcase_add_test(tc, deferq_ring_round_robin);
    suite_add_tcase(s, tc);
    tc = tcase_create("ptrmap");
    tcase_add_test(tc, ptrmap_matches_reference);
    suite_add_tcase(s, tc);
    tc = tcase_create("credit");
    tcase_add_test(tc, credit_returns_go_whole_to_a_nodes_latest_sender);
    tcase_add_test(tc, credit_piggyback_from_half_a_return);
    tcase_add_test(tc, credit_thresholds_follow_the_window);
    tcase_add_test(tc, credit_window_follows_the_horizon);
    tcase_add_test(tc, credit_window_grows_for_senders_that_ask);
    tcase_add_test(tc, credit_loop_not_timed_again_halves);
    tcase_add_test(tc, credit_cumulative_returns_are_said_again);
    tcase_add_test(tc, credit_totals_wrap_below_the_ask_and_notice_bits);
    tcase_add_test(tc, node_stash_goes_back_at_progress);
    tcase_add_test(tc, node_wakes_as_many_as_can_use_the_credits);
    tcase_add_test(tc, node_deposit_keeps_what_it_can_send);
    tcase_add_test(tc, acquire_n_takes_what_acquire_would);
    suite_add_tcase(s, tc);
    tc = tcase_create("items_wire");
    tcase_add_test(tc, items_wire_known_answers);
    suite_add_tcase(s, tc);
    tc = tcase_create("node_segment");
    tcase_add_test(tc, node_segment_owner_only_and_stale_cleanup);
    tcase_add_test(tc, node_segment_closed_to_other_users);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(unit_suite());
    int failed;

    mr__log_threshold = MR_LOG_ERROR;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
