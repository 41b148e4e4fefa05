/*
 * Conformance of the item layer (mailrail_items.h), run under mpiexec for the
 * substrate and flow-control policy named by MAILRAIL_SUBSTRATE and
 * MAILRAIL_FLOWCTL. Collective, like test_conformance.c.
 *
 * Items carry (source, destination, sequence number) and bytes derived from
 * them, so that every pull checks contents and source, and a bitmap per
 * source checks that each item arrives exactly once.
 */
#include "mailrail_items.h"
#include "mr_test.h"

#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The head of a test item; the rest of its bytes follow from it. */
typedef struct item_head {
    uint32_t source, dest, seq, length;
} item_head_t;

static uint8_t item_byte(const item_head_t *h, size_t k)
{
    return (uint8_t)(h->source * 131u + h->seq * 7u + h->length + k);
}

/* Writes a test item of `length` bytes; items shorter than the head are bytes only. */
static void item_fill(uint8_t *buf, size_t length, int dest, uint32_t seq)
{
    item_head_t h = {(uint32_t)world_rank, (uint32_t)dest, seq, (uint32_t)length};
    size_t k = 0;

    if (length >= sizeof(h)) {
        memcpy(buf, &h, sizeof(h));
        k = sizeof(h);
    }
    for (; k < length; k++) buf[k] = item_byte(&h, k);
}

typedef struct items_tally {
    uint8_t *seen;         /* [source][seq], for items that carry a head. */
    uint32_t per_source;
    uint64_t count;        /* Items pulled. */
    uint64_t *from;        /* Items pulled per source. */
    uint32_t *shorts;      /* [source][seq mod 256]: items too short for a head. */
} items_tally_t;

static void items_tally_init(items_tally_t *t, uint32_t per_source)
{
    t->seen = calloc((size_t)world_size * per_source, 1);
    t->from = calloc((size_t)world_size, sizeof(*t->from));
    t->shorts = calloc((size_t)world_size * 256, sizeof(*t->shorts));
    ck_assert_ptr_nonnull(t->shorts);
    t->per_source = per_source;
    t->count = 0;
    ck_assert_ptr_nonnull(t->seen);
    ck_assert_ptr_nonnull(t->from);
}

static void items_tally_free(items_tally_t *t)
{
    free(t->seen);
    free(t->from);
    free(t->shorts);
}

/*
 * Checks the items too short for a head that came from `src`: for each
 * sequence number modulo 256, as many as `sent(src, seq)` says went to this
 * rank with a length of 1 to sizeof(item_head_t) - 1, over seq < `seqs`.
 */
static void expect_shorts_from(const items_tally_t *t, int src, uint32_t seqs,
                               bool (*sent)(int src, uint32_t seq))
{
    uint32_t want[256] = {0};

    for (uint32_t seq = 0; seq < seqs; seq++) {
        if (sent(src, seq)) want[seq & 0xff]++;
    }
    for (int k = 0; k < 256; k++) {
        ck_assert_msg(t->shorts[(size_t)src * 256 + k] == want[k], "short items from %d with "
                      "sequence %d mod 256: %u pulled, %u sent", src, k,
                      t->shorts[(size_t)src * 256 + k], want[k]);
    }
}

/*
 * Checks one pulled item. Items with a head must be intact, from their
 * source, for this rank, and new; shorter ones (no room for a head) must
 * hold the bytes of some sequence number of their source and length.
 */
static void item_check(items_tally_t *t, const mr_item_t *it)
{
    item_head_t h;

    ck_assert_int_ge(it->source, 0);
    ck_assert_int_lt(it->source, world_size);
    ck_assert(it->data != NULL || it->length == 0);
    if (it->length >= sizeof(h)) {
        memcpy(&h, it->data, sizeof(h));
        ck_assert_uint_eq(h.source, (uint32_t)it->source);
        ck_assert_uint_eq(h.dest, (uint32_t)world_rank);
        ck_assert_uint_eq(h.length, it->length);
        ck_assert_uint_lt(h.seq, t->per_source);
        /* A plain loop: a Check assertion per byte would dominate the test's time. */
        size_t bad = it->length;
        for (size_t k = it->length; k-- > sizeof(h);) {
            if (((const uint8_t *)it->data)[k] != item_byte(&h, k)) bad = k;
        }
        ck_assert_msg(bad == it->length, "item %u from %d: byte %zu corrupt", h.seq, it->source,
                      bad);
        uint8_t *slot = &t->seen[(size_t)it->source * t->per_source + h.seq];
        ck_assert_msg(*slot == 0, "item %u from %d pulled twice", h.seq, it->source);
        *slot = 1;
    } else if (it->length > 0) {
        /* The first byte tells the sequence number modulo 256, the rest follows. */
        const uint8_t *b = it->data;
        h = (item_head_t){(uint32_t)it->source, (uint32_t)world_rank, 0, (uint32_t)it->length};
        uint8_t base = item_byte(&h, 0);
        uint32_t seq7 = (uint32_t)(uint8_t)(b[0] - base) * 183u; /* 7 * 183 = 1 mod 256 */
        h.seq = seq7 & 0xff;
        size_t bad = it->length;
        for (size_t k = it->length; k-- > 0;) {
            if (b[k] != item_byte(&h, k)) bad = k;
        }
        ck_assert_msg(bad == it->length, "short item from %d: byte %zu corrupt", it->source, bad);
        t->shorts[(size_t)it->source * 256 + h.seq]++; /* Counted against what was sent. */
    }
    t->from[it->source]++;
    t->count++;
}

/* Pulls whatever is there, one by one, checking each item. */
static void pull_all(mr_items_t *a, items_tally_t *t)
{
    mr_item_t it;
    mr_status_t st;

    while ((st = mr_items_pull(a, &it)) == MR_OK) item_check(t, &it);
    ck_assert_int_eq(st, MR_AGAIN);
}

/* Pushes, pulling while backpressured, within the time limit. */
static void push_or_pull(mr_items_t *a, const void *item, size_t length, int dest,
                         items_tally_t *t, int *again)
{
    double start = now_s();
    mr_status_t st;

    while ((st = mr_items_push(a, item, length, dest)) == MR_AGAIN) {
        if (again) (*again)++;
        pull_all(a, t);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
    }
    ck_assert_int_eq(st, MR_OK);
}

/* What a rank pulls while its phase ends: n aggregators into their tallies, datagrams into d. */
typedef struct phase_pulls {
    mr_items_t **a;
    items_tally_t *t;
    int n;
    tally_t *d;           /* NULL: no plain datagrams expected. */
} phase_pulls_t;

/* Ends the phase through `end`, pulling as `p` says before every attempt, within the time limit. */
static void end_phase_pulling(mr_items_t *end, const phase_pulls_t *p)
{
    double start = now_s();
    mr_status_t st;

    do {
        if (p->d != NULL) drain(p->d);
        for (int k = 0; k < p->n; k++) pull_all(p->a[k], &p->t[k]);
        st = mr_items_end_phase(end);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "the phase never ended");
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
}

static void end_phase(mr_items_t *a, items_tally_t *t)
{
    end_phase_pulling(a, &(phase_pulls_t){.a = &a, .t = t, .n = 1});
}

/* Every (source, seq < per_source) item arrived once, and nothing else. */
static void expect_all(const items_tally_t *t, uint32_t per_source)
{
    for (int src = 0; src < world_size; src++) {
        for (uint32_t seq = 0; seq < per_source; seq++) {
            ck_assert_msg(t->seen[(size_t)src * t->per_source + seq] == 1,
                          "item %u from %d never arrived", seq, src);
        }
    }
    ck_assert_uint_eq(t->count, (uint64_t)world_size * per_source);
}

/* ---- Delivery ------------------------------------------------------------------------ */

/* Fixed-size items from every rank to every rank, oneself included. */
START_TEST(fixed_items_exactly_once)
{
    const uint32_t per_dest = test_count(3000);
    uint8_t item[24];
    mr_items_t *a;
    items_tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    setup_env(NULL, NULL, "1K");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(item), &a), MR_OK);
    ck_assert_uint_eq(mr_items_max_size(a), sizeof(item));
    items_tally_init(&t, per_dest);
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int k = 0; k < world_size; k++) {
            int dest = (world_rank + k) % world_size;
            item_fill(item, sizeof(item), dest, seq);
            push_or_pull(a, item, sizeof(item), dest, &t, NULL);
        }
    }
    end_phase(a, &t);
    expect_all(&t, per_dest);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.items_pushed, (uint64_t)per_dest * world_size);
    ck_assert_uint_eq(stats.items_pulled, (uint64_t)per_dest * world_size);
    /* Dense packing: 42 items of 24 bytes per 1 KiB datagram (8-byte header). */
    ck_assert_uint_le(stats.messages_sent, (per_dest / 42 + 1) * (uint64_t)world_size);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    items_tally_free(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* The item sizes of sizes_from_one_byte_to_the_datagram, one aggregator each. */
static const size_t fixed_sizes[] = {1, 3, 8, 16, 100, 512 - 8};
/* Which of them fixed_sizes_sent() answers for. */
static int fixed_size_index;

/* Whether `src` sent this rank a short item `seq` of size fixed_sizes[fixed_size_index]. */
static bool fixed_sizes_sent(int src, uint32_t seq)
{
    return fixed_sizes[fixed_size_index] < sizeof(item_head_t) &&
           (int)(seq + (uint32_t)fixed_size_index + (uint32_t)src) % world_size == world_rank;
}

/* Fixed sizes from 1 byte to the largest, each on its own aggregator, all at once. */
START_TEST(sizes_from_one_byte_to_the_datagram)
{
    const size_t *sizes = fixed_sizes;
    const int nsizes = (int)(sizeof(fixed_sizes) / sizeof(fixed_sizes[0]));
    const uint32_t per_dest = test_count(300);
    mr_items_t *a[6];
    items_tally_t t[6];
    uint8_t item[512];

    setup_env(NULL, NULL, "512");
    init_on_world();
    ck_assert_int_eq(mr_items_create(512 - 7, &a[0]), MR_ERR_MESSAGE_TOO_LONG);
    for (int s = 0; s < nsizes; s++) {
        ck_assert_int_eq(mr_items_create(sizes[s], &a[s]), MR_OK);
        items_tally_init(&t[s], per_dest);
    }
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int s = 0; s < nsizes; s++) {
            int dest = (int)(seq + (uint32_t)s + (uint32_t)world_rank) % world_size;
            item_fill(item, sizes[s], dest, seq);
            push_or_pull(a[s], item, sizes[s], dest, &t[s], NULL);
        }
    }
    end_phase_pulling(a[0], &(phase_pulls_t){.a = a, .t = t, .n = nsizes});
    /* Each rank got per_dest items of each size, spread over the sources as sent. */
    for (int s = 0; s < nsizes; s++) {
        uint64_t count = t[s].count, total = 0;
        MPI_Allreduce(&count, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        ck_assert_uint_eq(total, (uint64_t)per_dest * world_size);
        for (int src = 0; src < world_size; src++) {
            uint64_t want = 0;
            for (uint32_t seq = 0; seq < per_dest; seq++) {
                if ((int)(seq + (uint32_t)s + (uint32_t)src) % world_size == world_rank) want++;
            }
            ck_assert_uint_eq(t[s].from[src], want);
            fixed_size_index = s;
            expect_shorts_from(&t[s], src, per_dest, fixed_sizes_sent);
        }
        ck_assert_int_eq(mr_items_destroy(a[s]), MR_OK);
        items_tally_free(&t[s]);
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* variable_sizes' lengths, by sequence number modulo their count (the last is the largest). */
static size_t variable_lengths[] = {0, 1, 15, 16, 17, 127, 128, 129, 1000, 0};
#define VARIABLE_NLEN (sizeof(variable_lengths) / sizeof(variable_lengths[0]))

/* Whether `src` sent this rank a short item `seq` (every rank sends every item to every rank). */
static bool variable_sizes_sent(int src, uint32_t seq)
{
    size_t len = variable_lengths[seq % VARIABLE_NLEN];
    (void)src;
    return len > 0 && len < sizeof(item_head_t);
}

/* Variable sizes: 0 bytes, the 1/2-byte length boundaries, and the largest item. */
START_TEST(variable_sizes)
{
    mr_items_t *a;
    items_tally_t t;
    size_t max, *lengths = variable_lengths;
    const int nlen = (int)VARIABLE_NLEN;
    const uint32_t per_dest = test_count(200);
    uint8_t *item;
    mr_item_t batch[7];
    size_t n;
    const void *block;
    int block_source;

    setup_env(NULL, NULL, "2K");
    init_on_world();
    ck_assert_int_eq(mr_items_create(MR_ITEMS_VARIABLE, &a), MR_OK);
    max = mr_items_max_size(a);
    /* A 2 KiB datagram: 8 bytes of header, 2 of length. */
    ck_assert_uint_eq(max, 2048 - 8 - 2);
    lengths[nlen - 1] = max;
    item = malloc(max + 1);
    items_tally_init(&t, per_dest * (uint32_t)nlen);
    ck_assert_int_eq(mr_items_push(a, item, max + 1, world_rank), MR_ERR_MESSAGE_TOO_LONG);
    ck_assert_int_eq(mr_items_pull_block(a, &block, &n, &block_source), MR_ERR_INVALID_PARAM);
    for (uint32_t seq = 0; seq < per_dest * (uint32_t)nlen; seq++) {
        for (int k = 0; k < world_size; k++) {
            int dest = (world_rank + k) % world_size;
            size_t len = lengths[seq % (uint32_t)nlen];
            item_fill(item, len, dest, seq);
            push_or_pull(a, len ? item : NULL, len, dest, &t, NULL);
        }
    }
    /* Pull in batches this time. */
    double start = now_s();
    mr_status_t st;
    do {
        while ((st = mr_items_pull_batch(a, batch, 7, &n)) == MR_OK) {
            ck_assert_uint_ge(n, 1);
            ck_assert_uint_le(n, 7);
            for (size_t k = 0; k < n; k++) item_check(&t, &batch[k]);
        }
        ck_assert_int_eq(st, MR_AGAIN);
        ck_assert_uint_eq(n, 0);
        st = mr_items_end_phase(a);
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    ck_assert_uint_eq(t.count, (uint64_t)world_size * per_dest * (uint32_t)nlen);
    /* Items with a head were each checked once; the others by their bytes and counts. */
    for (int src = 0; src < world_size; src++) {
        ck_assert_uint_eq(t.from[src], (uint64_t)per_dest * (uint32_t)nlen);
        for (uint32_t seq = 0; seq < per_dest * (uint32_t)nlen; seq++) {
            if (lengths[seq % (uint32_t)nlen] >= sizeof(item_head_t)) {
                ck_assert_msg(t.seen[(size_t)src * t.per_source + seq] == 1,
                              "item %u from %d never arrived", seq, src);
            }
        }
        expect_shorts_from(&t, src, per_dest * (uint32_t)nlen, variable_sizes_sent);
    }
    free(item);
    items_tally_free(&t);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* Items to oneself only: pulled from oneself, with the blocks of pull_block. */
START_TEST(items_to_self_in_blocks)
{
    const uint32_t count = test_count(5000);
    mr_items_t *a;
    const void *data;
    size_t n;
    int source;
    uint64_t sum = 0, got = 0;
    mr_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};

    setup_env("4", NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(uint64_t), &a), MR_OK);
    ck_assert_int_eq(mr_get_stats(&before), MR_OK);
    double start = now_s();
    for (uint64_t v = 1; v <= count; v++) {
        while (mr_items_push(a, &v, sizeof(v), world_rank) == MR_AGAIN) {
            /* 4 send slots: the rank must pull its own items to go on. */
            while (mr_items_pull_block(a, &data, &n, &source) == MR_OK) {
                ck_assert_int_eq(source, world_rank);
                ck_assert_uint_eq((uintptr_t)data % 8, 0);
                for (size_t k = 0; k < n; k++) sum += ((const uint64_t *)data)[k];
                got += n;
            }
            ck_assert(now_s() - start < WAIT_LIMIT_S);
        }
    }
    ck_assert_int_eq(mr_items_flush(a), MR_OK);
    /* Items waiting to be pulled are news: mr_wait() does not sleep on them. */
    double before_wait = now_s();
    ck_assert_int_eq(mr_wait(5000), MR_OK);
    ck_assert(now_s() - before_wait < 1.0);
    while (got < count) {
        if (mr_items_pull_block(a, &data, &n, &source) == MR_OK) {
            ck_assert_int_eq(source, world_rank);
            for (size_t k = 0; k < n; k++) sum += ((const uint64_t *)data)[k];
            got += n;
        }
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    }
    ck_assert_uint_eq(got, count);
    ck_assert_uint_eq(sum, (uint64_t)count * (count + 1) / 2);
    /* Nothing went through flow control or the substrate. */
    ck_assert_int_eq(mr_get_stats(&after), MR_OK);
    ck_assert_uint_eq(after.deferred_sends, before.deferred_sends);
    ck_assert_uint_eq(after.peak_recv_slots_in_use, before.peak_recv_slots_in_use);
    ck_assert_uint_eq(after.piggybacked_credits, before.piggybacked_credits);
    ck_assert_uint_eq(after.credit_returns_sent, before.credit_returns_sent);
    items_tally_t t;
    items_tally_init(&t, 1);
    end_phase(a, &t);
    ck_assert_uint_eq(t.count, 0);
    items_tally_free(&t);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Backpressure and phases --------------------------------------------------------- */

/*
 * One send slot per rank, a few receive slots, and rank 0 pulling slowly:
 * every rank pushes to every rank; no deadlock, everything once, and the
 * pools are never exceeded.
 */
START_TEST(backpressure_with_one_send_slot)
{
    const uint32_t per_dest = test_count(1500);
    uint8_t item[16];
    mr_items_t *a;
    items_tally_t t;
    int again = 0;
    mr_stats_t stats = {.size = sizeof(stats)};

    setup_env("1", "4", "128");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(item), &a), MR_OK);
    items_tally_init(&t, per_dest);
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int k = 0; k < world_size; k++) {
            int dest = (world_rank + k) % world_size;
            item_fill(item, sizeof(item), dest, seq);
            double start = now_s();
            mr_status_t st;
            while ((st = mr_items_push(a, item, sizeof(item), dest)) == MR_AGAIN) {
                again++;
                mr_item_t it;
                /* The slow receiver takes one item per attempt. */
                if (world_rank == 0) {
                    if (mr_items_pull(a, &it) == MR_OK) item_check(&t, &it);
                } else {
                    pull_all(a, &t);
                }
                ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
            }
            ck_assert_int_eq(st, MR_OK);
        }
    }
    end_phase(a, &t);
    expect_all(&t, per_dest);
    ck_assert_int_gt(again, 0);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.recv_inflight, 0);
    ck_assert_uint_ge(stats.reserve_failures, (uint64_t)again);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    items_tally_free(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * Items that push items: a token hops `hops` times around the ring. The phase
 * may only end once the last hop was pulled.
 */
START_TEST(end_phase_waits_for_chains)
{
    const uint32_t hops = 40 * (uint32_t)world_size, tokens = 5;
    uint64_t pulled = 0, total = 0;
    mr_items_t *a;
    mr_item_t it;
    mr_status_t st;
    double start = now_s();

    setup_env(NULL, NULL, "64");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(uint32_t), &a), MR_OK);
    if (world_rank == 0) {
        for (uint32_t k = 0; k < tokens; k++) {
            ck_assert_int_eq(mr_items_push(a, &hops, sizeof(hops), 1 % world_size), MR_OK);
        }
    }
    do {
        while ((st = mr_items_pull(a, &it)) == MR_OK) {
            uint32_t left;
            ck_assert_int_eq(it.source, (world_rank + world_size - 1) % world_size);
            memcpy(&left, it.data, sizeof(left));
            pulled++;
            if (left > 1) {
                left--;
                ck_assert_int_eq(mr_items_push(a, &left, sizeof(left), (world_rank + 1) %
                                                                           world_size), MR_OK);
            }
        }
        ck_assert_int_eq(st, MR_AGAIN);
        st = mr_items_end_phase(a);
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    ck_assert_int_eq(mr_items_pull(a, &it), MR_AGAIN);
    MPI_Allreduce(&pulled, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    ck_assert_uint_eq(total, (uint64_t)hops * tokens);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * The bulk push: every rank pushes its items to every rank in runs of
 * mr_items_push_many(), destinations interleaved, through few send slots
 * so that runs stop on backpressure and resume where they stopped.
 */
START_TEST(push_many_exactly_once)
{
    const uint32_t per_dest = test_count(2000);
    const size_t n = (size_t)per_dest * (size_t)world_size, run = 300;
    uint8_t *items = malloc(n * 24);
    int *dests = malloc(n * sizeof(*dests));
    items_tally_t t;
    mr_items_t *a, *var;
    size_t pushed, done = 0;
    int again = 0, bad[2] = {-1, 0};
    double start = now_s();
    mr_status_t st;

    ck_assert_ptr_nonnull(items);
    ck_assert_ptr_nonnull(dests);
    setup_env("6", NULL, "512");
    init_on_world();
    ck_assert_int_eq(mr_items_create(24, &a), MR_OK);
    ck_assert_int_eq(mr_items_create(MR_ITEMS_VARIABLE, &var), MR_OK);
    items_tally_init(&t, per_dest);
    for (size_t i = 0; i < n; i++) {
        dests[i] = (int)((i * 7 + (size_t)world_rank) % (size_t)world_size);
        item_fill(items + i * 24, 24, dests[i], (uint32_t)(i / (size_t)world_size));
    }
    /* Refusals push nothing: a bad first destination, NULLs, variable sizes. */
    ck_assert_int_eq(mr_items_push_many(a, items, 2, bad, &pushed), MR_ERR_INVALID_RANK);
    ck_assert_uint_eq(pushed, 0);
    ck_assert_int_eq(mr_items_push_many(a, items, 1, dests, NULL), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push_many(a, NULL, 1, dests, &pushed), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push_many(var, items, 1, dests, &pushed), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push_many(a, items, 0, NULL, &pushed), MR_OK);
    ck_assert_uint_eq(pushed, 0);
    while (done < n) {
        size_t count = n - done < run ? n - done : run;
        st = mr_items_push_many(a, items + done * 24, count, dests + done, &pushed);
        ck_assert_uint_le(pushed, count);
        done += pushed;
        if (st == MR_AGAIN) {
            again++;
            pull_all(a, &t);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
        } else {
            ck_assert_int_eq(st, MR_OK);
            ck_assert_uint_eq(pushed, count);
        }
    }
    end_phase(a, &t);
    expect_all(&t, per_dest);
    mr_stats_t stats = {.size = sizeof(stats)};
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.items_pushed, n);
    printf("rank %d: %d runs stopped by backpressure\n", world_rank, again);
    ck_assert_int_eq(mr_items_destroy(var), MR_OK);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    items_tally_free(&t);
    free(items);
    free(dests);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Item handlers -------------------------------------------------------------------- */

typedef struct item_handler_state {
    mr_items_t *replies;          /* Where the request handler answers. */
    items_tally_t requests, answers;
    uint64_t again;
} item_handler_state_t;

/* A request: checked, then answered with an item of the same seq to its source. */
static mr_status_t on_item_request(const mr_item_t *it, void *arg)
{
    item_handler_state_t *hs = arg;
    item_head_t h;
    uint8_t answer[24];
    mr_item_t pulled;

    memcpy(&h, it->data, sizeof(h));
    item_fill(answer, sizeof(answer), it->source, h.seq);
    mr_status_t st = mr_items_push(hs->replies, answer, sizeof(answer), it->source);
    if (st == MR_AGAIN) {
        hs->again++;
        return MR_AGAIN; /* Nothing pushed: called again with the same item. */
    }
    ck_assert_int_eq(st, MR_OK);
    item_check(&hs->requests, it);
    /* Pulling and ending a phase are for outside handlers. */
    ck_assert_int_eq(mr_items_pull(hs->replies, &pulled), MR_ERR_IN_HANDLER);
    return MR_OK;
}

static mr_status_t on_item_answer(const mr_item_t *it, void *arg)
{
    item_check(&((item_handler_state_t *)arg)->answers, it);
    return MR_OK;
}

/*
 * Item handlers: every rank pushes requests to every rank, oneself included;
 * a handler checks each and answers it with an item pushed from inside the
 * handler, through one send slot per rank so that answers often find none
 * and their handler is called again; a second handler checks the answers.
 * The phase ends only when every answer has been handled.
 */
START_TEST(item_handlers_answer_from_inside)
{
    const uint32_t per_dest = test_count(500);
    item_handler_state_t hs = {0};
    mr_items_t *requests;
    mr_item_t it;
    uint8_t item[32];
    double start = now_s();
    mr_status_t st;
    char slots[16];

    snprintf(slots, sizeof(slots), "%d", world_size + 1);
    setup_env(slots, NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(item), &requests), MR_OK);
    ck_assert_int_eq(mr_items_create(24, &hs.replies), MR_OK);
    ck_assert_int_eq(mr_items_handler(requests, on_item_request, &hs), MR_OK);
    ck_assert_int_eq(mr_items_handler(hs.replies, on_item_answer, &hs), MR_OK);
    ck_assert_int_eq(mr_items_pull(requests, &it), MR_ERR_INVALID_PARAM);
    items_tally_init(&hs.requests, per_dest);
    items_tally_init(&hs.answers, per_dest);
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int k = 0; k < world_size; k++) {
            int dest = (world_rank + k) % world_size;
            item_fill(item, sizeof(item), dest, seq);
            while ((st = mr_items_push(requests, item, sizeof(item), dest)) == MR_AGAIN) {
                ck_assert(mr_poll() >= 0);
                ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
            }
            ck_assert_int_eq(st, MR_OK);
        }
    }
    do {
        ck_assert(mr_poll() >= 0);
        st = mr_items_end_phase(requests);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "the phase never ended");
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    expect_all(&hs.requests, per_dest);
    expect_all(&hs.answers, per_dest);
    printf("rank %d: %llu item handlers called again for want of a send slot\n", world_rank,
           (unsigned long long)hs.again);
    ck_assert_int_eq(mr_items_handler(requests, NULL, NULL), MR_OK);
    ck_assert_int_eq(mr_items_pull(requests, &it), MR_AGAIN);
    ck_assert_int_eq(mr_items_destroy(requests), MR_OK);
    ck_assert_int_eq(mr_items_destroy(hs.replies), MR_OK);
    items_tally_free(&hs.requests);
    items_tally_free(&hs.answers);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* Items and plain datagrams in one phase: each reaches only its own receiver. */
START_TEST(items_beside_datagrams)
{
    const uint32_t count = 400;
    mr_items_t *a;
    items_tally_t t;
    tally_t d;
    uint8_t item[20];
    int dest = (world_rank + 1) % world_size;

    setup_env(NULL, NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(item), &a), MR_OK);
    items_tally_init(&t, count);
    tally_init(&d, count);
    for (uint32_t seq = 0; seq < count; seq++) {
        void *buf = reserve_or_progress(&d);
        fill_message(buf, 64, world_rank, dest, seq);
        ck_assert_int_eq(mr_send(buf, 64, dest), MR_OK);
        for (int k = 0; k < world_size; k++) {
            item_fill(item, sizeof(item), k, seq);
            push_or_pull(a, item, sizeof(item), k, &t, NULL);
        }
        drain(&d);
    }
    end_phase_pulling(a, &(phase_pulls_t){.a = &a, .t = &t, .n = 1, .d = &d});
    expect_all(&t, count);
    ck_assert_uint_eq(d.count, count);
    free(d.seen);
    items_tally_free(&t);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * Two aggregators, each with the last item of a datagram pulled and nothing
 * pulled after it: ending the phase through either one counts both
 * datagrams as received, so the phase ends.
 */
START_TEST(end_phase_releases_every_aggregator)
{
    mr_items_t *a, *b;
    mr_item_t it;
    uint64_t v = 11;
    uint32_t w = 12;
    int dest = (world_rank + 1) % world_size, got_a = 0, got_b = 0;
    double start = now_s();

    setup_env(NULL, NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(sizeof(v), &a), MR_OK);
    ck_assert_int_eq(mr_items_create(sizeof(w), &b), MR_OK);
    ck_assert_int_eq(mr_items_push(a, &v, sizeof(v), dest), MR_OK);
    ck_assert_int_eq(mr_items_push(b, &w, sizeof(w), dest), MR_OK);
    ck_assert_int_eq(mr_items_flush(a), MR_OK);
    ck_assert_int_eq(mr_items_flush(b), MR_OK);
    while (got_a == 0 || got_b == 0) {
        if (got_a == 0 && mr_items_pull(a, &it) == MR_OK) {
            ck_assert_uint_eq(*(const uint64_t *)it.data, v);
            got_a++;
        }
        if (got_b == 0 && mr_items_pull(b, &it) == MR_OK) {
            ck_assert_uint_eq(*(const uint32_t *)it.data, w);
            got_b++;
        }
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    }
    end_phase_pulling(a, &(phase_pulls_t){.n = 0});
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(mr_items_destroy(b), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * An aggregator destroyed and another created in its place between phases,
 * while a slow rank still pulls the old one: items pushed to the new one
 * reach only the new one, by its number, even though it takes the old one's
 * place in the table.
 */
START_TEST(recreated_aggregators_keep_their_items)
{
    mr_items_t *a, *c;
    mr_item_t it;
    uint64_t v = 7;
    int old_got = 0, new_got = 0;
    items_tally_t t;
    double start = now_s();
    mr_status_t st;

    setup_env(NULL, NULL, "256");
    init_on_world();
    items_tally_init(&t, 1);
    ck_assert_int_eq(mr_items_create(sizeof(v), &a), MR_OK);
    end_phase(a, &t);
    if (world_rank == 1) {
        /* The slow rank still pulls its old aggregator, making progress. */
        while (now_s() - start < 0.3) old_got += mr_items_pull(a, &it) == MR_OK;
    }
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(mr_items_create(sizeof(v), &c), MR_OK);
    ck_assert_ptr_eq(c, a); /* The same place: only the number tells them apart. */
    if (world_rank == 0) ck_assert_int_eq(mr_items_push(c, &v, sizeof(v), 1), MR_OK);
    do {
        while (mr_items_pull(c, &it) == MR_OK) {
            ck_assert_int_eq(it.source, 0);
            ck_assert_uint_eq(*(const uint64_t *)it.data, v);
            new_got++;
        }
        st = mr_items_end_phase(c);
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    ck_assert_int_eq(old_got, 0);
    ck_assert_int_eq(new_got, world_rank == 1 ? 1 : 0);
    ck_assert_int_eq(mr_items_destroy(c), MR_OK);
    items_tally_free(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Bad input ----------------------------------------------------------------------- */

START_TEST(bad_input_is_refused)
{
    mr_items_t *a, *b, *all[MR_ITEMS_MAX];
    mr_item_t it;
    uint64_t v = 7;
    char stack[64];
    size_t n;
    const void *data;
    int source;

    ck_assert_int_eq(mr_items_create(8, &a), MR_ERR_NOT_INITIALIZED);
    setup_env(NULL, NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(8, NULL), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_create(8, &a), MR_OK);
    ck_assert_int_eq(mr_items_push(a, &v, 8, -1), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_items_push(a, &v, 8, world_size), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_items_push(a, &v, 4, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push(a, &v, 9, 0), MR_ERR_MESSAGE_TOO_LONG);
    ck_assert_int_eq(mr_items_push(a, NULL, 8, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push((mr_items_t *)stack, &v, 8, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push(NULL, &v, 8, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_pull(a, NULL), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_pull_batch(a, &it, 0, &n), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_pull_block(a, NULL, &n, &source), MR_ERR_INVALID_PARAM);
    ck_assert_uint_eq(mr_items_max_size((mr_items_t *)stack), 0);

    /* The refusals lost nothing: the good push arrives, once. */
    int dest = (world_rank + 1) % world_size;
    uint8_t good[8];
    item_fill(good, sizeof(good), dest, 5);
    ck_assert_int_eq(mr_items_push(a, good, 8, dest), MR_OK);
    items_tally_t t;
    items_tally_init(&t, 1);
    end_phase(a, &t);
    ck_assert_uint_eq(t.count, 1);
    ck_assert_uint_eq(t.from[(world_rank + world_size - 1) % world_size], 1);

    /* An item's bytes are not a buffer to release. */
    ck_assert_int_eq(mr_items_push(a, &v, 8, world_rank), MR_OK);
    ck_assert_int_eq(mr_items_flush(a), MR_OK);
    double start = now_s();
    while (mr_items_pull(a, &it) != MR_OK) ck_assert(now_s() - start < WAIT_LIMIT_S);
    ck_assert_uint_eq(*(const uint64_t *)it.data, 7);
    ck_assert_int_eq(mr_release((void *)it.data), MR_ERR_INVALID_BUFFER);

    /* At most MR_ITEMS_MAX at once; a destroyed one is refused; its place is reused. */
    int made = 1;
    all[0] = a;
    while (made < MR_ITEMS_MAX) {
        ck_assert_int_eq(mr_items_create(16, &all[made]), MR_OK);
        made++;
    }
    ck_assert_int_eq(mr_items_create(16, &b), MR_ERR_LIMIT);
    ck_assert_int_eq(mr_items_destroy(all[3]), MR_OK);
    ck_assert_int_eq(mr_items_destroy(all[3]), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_push(all[3], &v, 16, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_items_create(16, &b), MR_OK);
    ck_assert_ptr_eq(b, all[3]);
    for (int k = 0; k < MR_ITEMS_MAX; k++) ck_assert_int_eq(mr_items_destroy(all[k]), MR_OK);
    items_tally_free(&t);

    /* After finalize, every call is refused. */
    ck_assert_int_eq(mr_items_create(8, &a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    ck_assert_int_eq(mr_items_push(a, &v, 8, 0), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_items_pull(a, &it), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_items_pull_block(a, &data, &n, &source), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_items_flush(a), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_items_end_phase(a), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_items_destroy(a), MR_ERR_NOT_INITIALIZED);
}
END_TEST

/*
 * Ranks that create their aggregators with different sizes: the receiver
 * says so with MR_ERR_PROTOCOL and drops those items; the phase still ends.
 */
START_TEST(mismatched_aggregators_are_named)
{
    mr_items_t *a;
    uint8_t item[16] = {0};
    size_t size = world_rank == 0 ? 8 : 16;
    mr_item_t it;
    int protocol = 0;
    mr_status_t st;

    setup_env(NULL, NULL, "256");
    init_on_world();
    ck_assert_int_eq(mr_items_create(size, &a), MR_OK);
    ck_assert_int_eq(mr_items_push(a, item, size, (world_rank + 1) % world_size), MR_OK);
    double start = now_s();
    do {
        while ((st = mr_items_pull(a, &it)) != MR_AGAIN) {
            if (st == MR_ERR_PROTOCOL) {
                protocol++;
            } else {
                ck_assert_int_eq(st, MR_OK);
                ck_assert_uint_eq(it.length, size);
            }
        }
        st = mr_items_end_phase(a);
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    /* Rank 0 gets 16-byte items from its left neighbour; rank 1 gets 8 from rank 0. */
    int src = (world_rank + world_size - 1) % world_size;
    size_t src_size = src == 0 ? 8 : 16;
    ck_assert_int_eq(protocol, src_size != size ? 1 : 0);
    ck_assert_int_eq(mr_items_destroy(a), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* One case per test, so that CK_RUN_CASE=name runs one alone. */
#define ITEMS_CASE(s, test)                                                                  \
    do {                                                                                     \
        TCase *tc = tcase_create(#test);                                                     \
        tcase_set_timeout(tc, 120);                                                          \
        tcase_add_test(tc, test);                                                            \
        suite_add_tcase(s, tc);                                                              \
    } while (0)

static Suite *items_suite(void)
{
    Suite *s = suite_create("items");

    ITEMS_CASE(s, fixed_items_exactly_once);
    ITEMS_CASE(s, sizes_from_one_byte_to_the_datagram);
    ITEMS_CASE(s, variable_sizes);
    ITEMS_CASE(s, items_to_self_in_blocks);
    ITEMS_CASE(s, backpressure_with_one_send_slot);
    ITEMS_CASE(s, end_phase_waits_for_chains);
    ITEMS_CASE(s, item_handlers_answer_from_inside);
    ITEMS_CASE(s, push_many_exactly_once);
    ITEMS_CASE(s, items_beside_datagrams);
    ITEMS_CASE(s, end_phase_releases_every_aggregator);
    ITEMS_CASE(s, recreated_aggregators_keep_their_items);
    ITEMS_CASE(s, bad_input_is_refused);
    ITEMS_CASE(s, mismatched_aggregators_are_named);
    return s;
}

int main(int argc, char **argv)
{
    return run_suite_on_all_ranks(argc, argv, items_suite);
}
