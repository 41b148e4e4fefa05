/*
 * mr_connect(): connections made ahead of the traffic, run under mpiexec with
 * 2 and 4 ranks for the substrate named by MAILRAIL_SUBSTRATE. Every test is
 * collective and initializes and finalizes MailRail on its own.
 *
 * After mr_connect() the ranks a rank listed are connected (peers_connected
 * over TCP and UCX; MPI keeps its own connections and counts none), no
 * MailRail message was sent for it, and the traffic that follows arrives
 * exactly once. Bad arguments fail on every rank together, with the rank at
 * fault naming its own error; calls out of place return at once; a rank that
 * comes after the others' timeout finds them again in their next collective.
 */
#include "mr_test.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Whether the substrate makes connections of its own that peers_connected counts. */
static bool counts_connections(void)
{
    const char *name = mr_substrate_name();
    return strcmp(name, "tcp") == 0 || strcmp(name, "ucx") == 0;
}

static uint64_t peers_connected(void)
{
    mr_stats_t stats = {.size = sizeof(stats)};

    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    return stats.peers_connected;
}

/* Every rank, this one included: what a job that talks to all would list. */
static int *all_ranks(void)
{
    int *all = malloc((size_t)world_size * sizeof(*all));

    ck_assert_ptr_nonnull(all);
    for (int r = 0; r < world_size; r++) all[r] = r;
    return all;
}

/* The exchange every test ends with: each rank to each, exactly once. */
static void exchange_all(const int *all)
{
    const uint32_t per_dest = 20;
    tally_t t;

    tally_init(&t, per_dest);
    exchange(all, world_size, per_dest, &t);
    quiesce(&t);
    expect_all_from(&t, all, world_size, per_dest);
    free(t.seen);
}

/*
 * Every rank lists every rank: all pairs are connected when it returns, with
 * no MailRail message sent, and the traffic that follows arrives exactly once.
 */
START_TEST(connect_all_then_exchange)
{
    mr_stats_t stats = {.size = sizeof(stats)};
    int *all = all_ranks();
    double start;

    setup_env(NULL, NULL, "512");
    init_on_world();
    start = now_s();
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    if (world_rank == 0 && getenv("MR_TEST_CONNECT_VERBOSE") != NULL) {
        printf("mr_connect() of %d ranks over %s: %.3f ms\n", world_size, mr_substrate_name(),
               (now_s() - start) * 1e3);
    }
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    if (counts_connections()) ck_assert_uint_eq(stats.peers_connected, (uint64_t)world_size - 1);
    if (strcmp(mr_substrate_name(), "mpi") == 0) ck_assert_uint_eq(stats.peers_connected, 0);
    /* Connecting is no traffic: the counters the workloads report stay as they were. */
    ck_assert_uint_eq(stats.messages_sent, 0);
    ck_assert_uint_eq(stats.messages_received, 0);
    ck_assert_uint_eq(stats.credit_returns_sent, 0);
    exchange_all(all);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(all);
}
END_TEST

/*
 * Even ranks list every other rank, this one and some twice; odd ranks list
 * nothing (NULL, 0). Over TCP a connection serves both ends, so an odd rank
 * holds one to every even rank; over UCX an endpoint is one-way.
 */
START_TEST(connect_some_lists_empty)
{
    int *all = all_ranks();
    int *list = malloc((size_t)(2 * world_size + 1) * sizeof(*list));
    int n = 0, evens = (world_size + 1) / 2;

    ck_assert_ptr_nonnull(list);
    setup_env(NULL, NULL, "512");
    init_on_world();
    if (world_rank % 2 == 0) {
        list[n++] = world_rank;
        for (int r = 0; r < world_size; r++) list[n++] = r;
        for (int r = world_size - 1; r >= 0; r -= 2) list[n++] = r;
        ck_assert_int_eq(mr_connect(list, n), MR_OK);
        if (counts_connections()) ck_assert_uint_eq(peers_connected(), (uint64_t)world_size - 1);
    } else {
        ck_assert_int_eq(mr_connect(NULL, 0), MR_OK);
        if (strcmp(mr_substrate_name(), "tcp") == 0) {
            ck_assert_uint_ge(peers_connected(), (uint64_t)evens);
        }
    }
    exchange_all(all);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(list);
    free(all);
}
END_TEST

/* A second call finds every connection made: it only synchronizes. */
START_TEST(connect_twice)
{
    int *all = all_ranks();
    uint64_t after_first;

    setup_env(NULL, NULL, "512");
    init_on_world();
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    after_first = peers_connected();
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    if (counts_connections()) ck_assert_uint_eq(peers_connected(), after_first);
    /* The ring neighbours and the others, in the other order. */
    int back[2] = {(world_rank + world_size - 1) % world_size, (world_rank + 1) % world_size};
    ck_assert_int_eq(mr_connect(back, 2), MR_OK);
    exchange_all(all);
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(all);
}
END_TEST

/* The handler that tries to connect: only sends are allowed in a handler. */
static mr_status_t connect_in_handler(const mr_message_t *m, void *arg)
{
    (void)m;
    *(mr_status_t *)arg = mr_connect(NULL, 0);
    return MR_OK;
}

/*
 * Bad arguments, on every rank and on one: each call fails on every rank, the
 * rank at fault with its own status; calls out of place return at once; and a
 * good call works after them.
 */
START_TEST(connect_bad_input)
{
    int *all = all_ranks();
    int bad[2] = {0, world_size};
    int negative[1] = {-1};
    mr_status_t in_handler = MR_OK;
    double start;

    ck_assert_int_eq(mr_connect(all, world_size), MR_ERR_NOT_INITIALIZED);
    setup_env(NULL, NULL, "512");
    init_on_world();

    /* On every rank at once. */
    ck_assert_int_eq(mr_connect(NULL, 1), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_connect(all, -1), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_connect(bad, 2), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_connect(negative, 1), MR_ERR_INVALID_RANK);

    /* On the last rank only: the others fail too, at once rather than at the timeout. */
    start = now_s();
    if (world_rank == world_size - 1) {
        ck_assert_int_eq(mr_connect(bad, 2), MR_ERR_INVALID_RANK);
    } else {
        ck_assert_int_eq(mr_connect(all, world_size), MR_ERR_INVALID_PARAM);
    }
    ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "a bad call on one rank held the others");

    /* Inside a handler: refused there, without joining the collective. */
    ck_assert_int_eq(mr_handler_register(7, connect_in_handler, &in_handler), MR_OK);
    ck_assert_int_eq(mr_send_handler_copy("x", 1, world_rank, 7), MR_OK);
    start = now_s();
    while (in_handler == MR_OK) {
        ck_assert_int_ge(mr_poll(), MR_OK);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "the handler never ran");
    }
    ck_assert_int_eq(in_handler, MR_ERR_IN_HANDLER);

    /* While a quiescence is under way (its first wave never ends it): refused at once. */
    mr_status_t st = mr_quiesce();
    ck_assert_int_eq(st, MR_AGAIN);
    ck_assert_int_eq(mr_connect(all, world_size), MR_ERR_INVALID_PARAM);
    start = now_s();
    while ((st = mr_quiesce()) == MR_AGAIN) {
        ck_assert_int_ge(mr_poll(), MR_OK);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "quiescence never reached");
    }
    ck_assert_int_eq(st, MR_OK);

    /* Nothing was broken by the refusals. */
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    exchange_all(all);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    ck_assert_int_eq(mr_connect(NULL, 0), MR_ERR_NOT_INITIALIZED);
    free(all);
}
END_TEST

/*
 * A rank that comes late, after the others' MAILRAIL_TIMEOUT: they return
 * MR_ERR_TIMEOUT with the reduction pending, their next collective call
 * (mr_quiesce()) completes it once the late rank has joined, and the late
 * rank, whose own connections are made, returns MR_OK. The job goes on.
 */
START_TEST(connect_late_rank)
{
    int *all = all_ranks();
    int late = world_size - 1;
    const uint32_t per_dest = 5;
    tally_t t;

    setup_env(NULL, NULL, "512");
    setenv("MAILRAIL_TIMEOUT", "3", 1);
    init_on_world();
    unsetenv("MAILRAIL_TIMEOUT");
    if (world_rank == late) {
        /* Away from MailRail: no progress, no dial accepted. */
        struct timespec away = {.tv_sec = 5, .tv_nsec = 0};
        nanosleep(&away, NULL);
        ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    } else {
        ck_assert_int_eq(mr_connect(all, world_size), MR_ERR_TIMEOUT);
    }
    tally_init(&t, per_dest);
    quiesce(&t);
    exchange(all, world_size, per_dest, &t);
    quiesce(&t);
    expect_all_from(&t, all, world_size, per_dest);
    /* The pending reduction is done: a new call is a collective like any other. */
    ck_assert_int_eq(mr_connect(all, world_size), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
    free(all);
}
END_TEST

static Suite *connect_suite(void)
{
    Suite *s = suite_create("connect");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 0);
    tcase_add_test(tc, connect_all_then_exchange);
    tcase_add_test(tc, connect_some_lists_empty);
    tcase_add_test(tc, connect_twice);
    tcase_add_test(tc, connect_bad_input);
    tcase_add_test(tc, connect_late_rank);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return run_suite_on_all_ranks(argc, argv, connect_suite);
}
