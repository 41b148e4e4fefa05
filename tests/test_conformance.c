/*
 * Multi-rank conformance tests, run under mpiexec with 2 and 4 ranks for the
 * substrate and flow-control policy named by MAILRAIL_SUBSTRATE and
 * MAILRAIL_FLOWCTL. Every test is collective: each rank runs the same
 * sequence, and each test initializes and finalizes MailRail on its own, on
 * the application's communicator.
 *
 * Messages carry a header (source, destination, sequence number, length)
 * followed by bytes derived from it, so that every receive checks the
 * payload and the source, and a bitmap per source checks exactly-once
 * delivery.
 */
#include "mr_test.h"

#include "mr_node_segment.h"

#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- Delivery ------------------------------------------------------------------------ */

START_TEST(all_to_all_exactly_once)
{
    const uint32_t per_dest = 60;
    int all[MR_TEST_MAX_RANKS];
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    setup_env("16", "32", "1024");
    init_on_world();
    for (int r = 0; r < world_size; r++) all[r] = r;
    tally_init(&t, per_dest);
    exchange(all, world_size, per_dest, &t);
    quiesce(&t);
    expect_all_from(&t, all, world_size, per_dest);

    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.messages_sent, (uint64_t)per_dest * world_size);
    ck_assert_uint_eq(stats.messages_received, (uint64_t)per_dest * world_size);
    /* Quiesced: nothing in a slot, nothing held by the substrate. */
    ck_assert_uint_eq(stats.recv_slots_in_use, 0);
    ck_assert_uint_eq(stats.recv_inflight, 0);
    ck_assert_uint_ge(stats.peak_recv_inflight, 1);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/*
 * Every other rank floods rank 0, which has only 4 receive slots, in bursts
 * of 6 messages between progress calls: the MPI and UCX substrates pack
 * them, and rank 0 takes each batch apart as slots free up.
 */
START_TEST(incast_exactly_once)
{
    const uint32_t per_sender = 200;
    int victim = 0, senders[MR_TEST_MAX_RANKS], nsend = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    setup_env("8", "4", "512");
    init_on_world();
    for (int r = 1; r < world_size; r++) senders[nsend++] = r;
    tally_init(&t, per_sender);
    if (world_rank != victim) exchange_bursts(&victim, 1, per_sender, 6, &t);
    quiesce(&t);
    if (world_rank == victim) {
        expect_all_from(&t, senders, nsend, per_sender);
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        /* Quiesced; the grants fit the 4 slots (none grants the pool itself). */
        ck_assert_uint_eq(stats.recv_inflight, 0);
        if (strcmp(mr_flowctl_name(), "none") == 0) ck_assert_uint_eq(stats.recv_granted, 4);
        else ck_assert_uint_le(stats.recv_granted, 4);
    } else {
        ck_assert_uint_eq(t.count, 0);
        /*
         * Without flow control, up to 6 messages leave between progress calls
         * and MPI and UCX pack all but the first; with 4 slots' worth of
         * credits for all senders, there is rarely more than one to pack.
         */
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        if (strcmp(mr_substrate_name(), "tcp") == 0) {
            ck_assert_uint_eq(stats.messages_coalesced, 0);
        } else if (strcmp(mr_flowctl_name(), "none") == 0) {
            ck_assert_uint_gt(stats.messages_coalesced, 0);
        }
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/*
 * Messages from one sender to one receiver arrive in the order they were
 * sent, also when several leave between two progress calls (and may be
 * coalesced into one transport message, MAILRAIL_COALESCE_BYTES).
 */
START_TEST(order_per_destination)
{
    const uint32_t count = 300;
    int next_dest = (world_rank + 1) % world_size;
    uint32_t expected[MR_TEST_MAX_RANKS] = {0};
    mr_message_t m;
    uint32_t got = 0;
    double start = now_s();

    setup_env("4", "4", "256");
    init_on_world();
    for (uint32_t seq = 0; seq < count || got < count;) {
        /* Bursts of up to 3, of varying length. */
        for (int burst = 0; burst < 3 && seq < count; burst++) {
            void *buf;
            if (mr_reserve(&buf) != MR_OK) break;
            fill_message(buf, 16 + seq % 3 * 24, world_rank, next_dest, seq);
            ck_assert_int_eq(mr_send(buf, 16 + seq % 3 * 24, next_dest), MR_OK);
            seq++;
        }
        while (mr_receive(&m) == MR_OK) {
            uint32_t s = check_message(&m);
            ck_assert_uint_eq(s, expected[m.source]);
            expected[m.source]++;
            got++;
            mr_release(m.data);
        }
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "stalled at %u/%u", got, count);
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

START_TEST(zero_and_max_length)
{
    size_t dgram;
    int dest = (world_rank + 1) % world_size;
    int src = (world_rank + world_size - 1) % world_size;
    mr_message_t m;
    void *buf;
    int got_empty = 0, got_full = 0;
    double start = now_s();

    setup_env(NULL, NULL, "8K");
    init_on_world();
    dgram = mr_datagram_size();
    ck_assert_uint_eq(dgram, 8192);
    ck_assert_int_eq(mr_reserve(&buf), MR_OK);
    ck_assert_int_eq(mr_send(buf, 0, dest), MR_OK);
    ck_assert_int_eq(mr_reserve(&buf), MR_OK);
    fill_message(buf, dgram, world_rank, dest, 1);
    ck_assert_int_eq(mr_send(buf, dgram, dest), MR_OK);
    while (got_empty + got_full < 2) {
        if (mr_receive(&m) == MR_OK) {
            ck_assert_int_eq(m.source, src);
            ck_assert_ptr_nonnull(m.data);
            if (m.length == 0) {
                got_empty++;
                ck_assert_int_eq(got_full, 0); /* Sent first, so it arrives first. */
            } else {
                ck_assert_uint_eq(m.length, dgram);
                ck_assert_uint_eq(check_message(&m), 1);
                got_full++;
            }
            ck_assert_int_eq(mr_release(m.data), MR_OK);
        }
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    }
    ck_assert_int_eq(got_empty, 1);
    ck_assert_int_eq(got_full, 1);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Backpressure and quiescence ----------------------------------------------------- */

/* Sends messages 0 and 1 of `length` bytes to `dest` from two reserved buffers. */
static void send_pair(void *a, void *b, size_t length, int dest)
{
    fill_message(a, length, world_rank, dest, 0);
    fill_message(b, length, world_rank, dest, 1);
    ck_assert_int_eq(mr_send(a, length, dest), MR_OK);
    ck_assert_int_eq(mr_send(b, length, dest), MR_OK);
}

/*
 * Progress gives the buffers back once the substrate is done with them: a
 * reserve succeeds again, and both messages of send_pair() arrive, once.
 */
static void backpressure_ends(tally_t *t)
{
    ck_assert_int_eq(mr_release(reserve_or_progress(t)), MR_OK);
    quiesce(t);
    ck_assert_uint_eq(t->count, 2);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t->seen);
}

START_TEST(backpressure)
{
    void *a, *b, *c;
    mr_stats_t stats = {.size = sizeof(stats)};
    int dest = (world_rank + 1) % world_size;
    tally_t t;

    setup_env("2", NULL, "128");
    init_on_world();
    tally_init(&t, 8);
    ck_assert_int_eq(mr_reserve(&a), MR_OK);
    ck_assert_int_eq(mr_reserve(&b), MR_OK);
    ck_assert_ptr_ne(a, b);
    c = (void *)0x1;
    ck_assert_int_eq(mr_reserve(&c), MR_AGAIN);
    ck_assert_ptr_eq(c, (void *)0x1); /* Untouched on MR_AGAIN. */
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.reserve_failures, 1);

    send_pair(a, b, 64, dest);
    backpressure_ends(&t);
}
END_TEST

/*
 * MAILRAIL_SEND_BYTES: once the messages in flight hold that many bytes,
 * reserve says MR_AGAIN although slots are free, until sends complete.
 */
START_TEST(send_bytes_backpressure)
{
    void *a, *b, *c = (void *)0x1;
    int dest = (world_rank + 1) % world_size;
    tally_t t;

    setenv("MAILRAIL_SEND_BYTES", "1K", 1);
    setup_env("8", NULL, "512");
    init_on_world();
    unsetenv("MAILRAIL_SEND_BYTES");
    tally_init(&t, 8);
    ck_assert_int_eq(mr_reserve(&a), MR_OK);
    ck_assert_int_eq(mr_reserve(&b), MR_OK);
    send_pair(a, b, 512, dest);
    /* 1 KiB in flight: no completion is seen before progress, so this is certain. */
    ck_assert_int_eq(mr_reserve(&c), MR_AGAIN);
    ck_assert_ptr_eq(c, (void *)0x1);
    backpressure_ends(&t);
}
END_TEST

/*
 * MAILRAIL_SEND_BYTES unset bounds the bytes in flight at 64 datagrams when
 * that is more than 256K: 64 messages of 16 KiB (1 MiB) leave, where 256K
 * would have stopped the 17th reserve, and the 65th reserve says MR_AGAIN.
 * Each arrives once.
 */
START_TEST(send_bytes_follow_the_datagram)
{
    enum { N = 64, LEN = 16384 };
    void *buf, *c = (void *)0x1;
    int dest = (world_rank + 1) % world_size;
    tally_t t;

    unsetenv("MAILRAIL_SEND_BYTES");
    setup_env("80", NULL, "16K");
    init_on_world();
    tally_init(&t, N);
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_msg(mr_reserve(&buf) == MR_OK, "reserve %u of %d failed", i, N);
        fill_message(buf, LEN, world_rank, dest, i);
        ck_assert_int_eq(mr_send(buf, LEN, dest), MR_OK);
    }
    /* 1 MiB in flight: no completion is seen before progress. */
    ck_assert_int_eq(mr_reserve(&c), MR_AGAIN);
    ck_assert_ptr_eq(c, (void *)0x1);
    quiesce(&t);
    ck_assert_uint_eq(t.count, N);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/*
 * Messages that spawn messages: a token hops `hops` times around the ring.
 * Quiescence may only return once the last hop was received.
 */
START_TEST(quiescence_waits_for_chains)
{
    const uint32_t hops = 25 * (uint32_t)world_size;
    uint64_t received = 0, total = 0;
    mr_message_t m;
    mr_status_t st;
    double start = now_s();
    void *buf;

    setup_env(NULL, NULL, "64");
    init_on_world();
    if (world_rank == 0) {
        ck_assert_int_eq(mr_reserve(&buf), MR_OK);
        memcpy(buf, &hops, sizeof(hops));
        ck_assert_int_eq(mr_send(buf, sizeof(hops), 1 % world_size), MR_OK);
    }
    do {
        while (mr_receive(&m) == MR_OK) {
            uint32_t left;
            ck_assert_uint_eq(m.length, sizeof(left));
            ck_assert_int_eq(m.source, (world_rank + world_size - 1) % world_size);
            memcpy(&left, m.data, sizeof(left));
            mr_release(m.data);
            received++;
            if (left > 1) {
                while (mr_reserve(&buf) != MR_OK) ck_assert(now_s() - start < WAIT_LIMIT_S);
                left--;
                memcpy(buf, &left, sizeof(left));
                ck_assert_int_eq(mr_send(buf, sizeof(left), (world_rank + 1) % world_size),
                                 MR_OK);
            }
        }
        st = mr_quiesce();
        ck_assert(now_s() - start < WAIT_LIMIT_S);
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
    /* Nothing may arrive after quiescence. */
    ck_assert_int_eq(mr_receive(&m), MR_AGAIN);
    MPI_Allreduce(&received, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    ck_assert_uint_eq(total, hops);
    /* A second quiescence with no traffic also completes. */
    tally_t t;
    tally_init(&t, 1);
    quiesce(&t);
    ck_assert_uint_eq(t.count, 0);
    free(t.seen);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Bad input ----------------------------------------------------------------------- */

/*
 * mr_wait() with MAILRAIL_WAIT_NAP=`nap`: refuses bad timeouts, sleeps about
 * its timeout when nothing comes (napping or not), and wakes early for a
 * message, which mr_receive() then returns.
 */
static void wait_sleeps_and_wakes(const char *nap)
{
    int prev = (world_rank + world_size - 1) % world_size, next = (world_rank + 1) % world_size;
    tally_t t;
    double start;
    int calls = 0;
    mr_status_t st = MR_AGAIN;

    setup_env(NULL, NULL, NULL);
    setenv("MAILRAIL_WAIT_NAP", nap, 1);
    init_on_world();
    unsetenv("MAILRAIL_WAIT_NAP");
    tally_init(&t, 1);
    ck_assert_int_eq(mr_wait(-1), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_wait(60001), MR_ERR_INVALID_PARAM);
    /* Nothing is sent until everyone has slept once. */
    start = now_s();
    while (now_s() - start < 0.1 && (st = mr_wait(20)) == MR_AGAIN) calls++;
    ck_assert_int_eq(st, MR_AGAIN);
    /* Sleeping, five calls fill 100 ms; spinning, or naps that end the call, thousands. */
    ck_assert_msg(calls <= 12, "mr_wait(20) returned %d times in 100 ms with nothing to do "
                  "(MAILRAIL_WAIT_NAP=%s)", calls, nap);
    ck_assert_uint_eq(t.count, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    /* Each rank sends one message to the next; the wait ends when it comes. */
    void *buf = reserve_or_progress(&t);
    fill_message(buf, sizeof(msg_header_t) + 8, world_rank, next, 0);
    ck_assert_int_eq(mr_send(buf, sizeof(msg_header_t) + 8, next), MR_OK);
    start = now_s();
    while (t.count == 0 && now_s() - start < WAIT_LIMIT_S) {
        st = mr_wait(1000);
        ck_assert_msg(st == MR_OK || st == MR_AGAIN, "mr_wait: %s", mr_status_string(st));
        drain(&t);
    }
    ck_assert_uint_eq(t.count, 1);
    ck_assert_uint_eq(t.seen[(size_t)prev * t.per_source], 1);
    /* Woken by the message, not by the 1 s timeout (nor, napping, after all of it). */
    ck_assert_msg(now_s() - start < 0.9, "the message took %.3f s to wake mr_wait(1000) "
                  "(MAILRAIL_WAIT_NAP=%s)", now_s() - start, nap);
    quiesce(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}

START_TEST(wait_sleeps_and_wakes_at_once)
{
    wait_sleeps_and_wakes("never");
}
END_TEST

START_TEST(wait_naps_and_wakes)
{
    wait_sleeps_and_wakes("always");
}
END_TEST

/*
 * A napping mr_wait() naps too when the substrate cannot sleep: here every
 * receive slot is held by the application while more messages wait in the
 * substrate (under none), where UCX's wait used to return at once, so that
 * each mr_wait(20) lasted microseconds. The held and the waiting messages
 * all arrive afterwards, once each.
 */
START_TEST(wait_naps_while_the_application_holds_every_slot)
{
    enum { SLOTS = 4, SENT = 16, LEN = 256 }; /* Datagram-sized: none coalesced. */
    void *held[SENT];
    int sender = 0, receiver = world_size - 1, got = 0, calls = 0;
    mr_status_t st = MR_AGAIN;
    tally_t t;
    double start;

    setup_env(NULL, "4", "256");
    setenv("MAILRAIL_WAIT_NAP", "always", 1);
    init_on_world();
    unsetenv("MAILRAIL_WAIT_NAP");
    tally_init(&t, SENT);
    if (world_rank == sender) {
        for (uint32_t seq = 0; seq < SENT; seq++) {
            void *buf = reserve_or_progress(&t);
            fill_message(buf, LEN, sender, receiver, seq);
            ck_assert_int_eq(mr_send(buf, LEN, receiver), MR_OK);
        }
    }
    if (world_rank == receiver) {
        mr_message_t m;
        /* Take and keep what the slots hold, and give the rest 50 ms to arrive behind them. */
        start = now_s();
        while (now_s() - start < 0.05 || got == 0) {
            if (now_s() - start > WAIT_LIMIT_S) break;
            if ((st = mr_receive(&m)) == MR_AGAIN) continue;
            ck_assert_int_eq(st, MR_OK);
            ck_assert_uint_eq(check_message(&m), (uint32_t)got);
            held[got++] = m.data;
        }
        ck_assert_msg(got > 0 && got <= SLOTS, "%d messages held with %d receive slots", got,
                      SLOTS);
        start = now_s();
        while (now_s() - start < 0.1 && (st = mr_wait(20)) == MR_AGAIN) calls++;
        ck_assert_int_eq(st, MR_AGAIN);
        ck_assert_msg(calls <= 12, "mr_wait(20) returned %d times in 100 ms while the "
                      "application held every slot", calls);
        for (int i = 0; i < got; i++) ck_assert_int_eq(mr_release(held[i]), MR_OK);
        start = now_s();
        while (got < SENT && now_s() - start < WAIT_LIMIT_S) {
            if ((st = mr_receive(&m)) == MR_AGAIN) continue;
            ck_assert_int_eq(st, MR_OK);
            ck_assert_uint_eq(check_message(&m), (uint32_t)got);
            got++;
            ck_assert_int_eq(mr_release(m.data), MR_OK);
        }
        ck_assert_msg(got == SENT, "%d of %d messages arrived", got, SENT);
    }
    quiesce(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/* Sends `count` small messages to `receiver`, in order, a progress call after each `burst`. */
static void send_small(int receiver, uint32_t count, uint32_t burst, tally_t *t)
{
    for (uint32_t seq = 0; seq < count; seq++) {
        void *buf = reserve_or_progress(t);
        fill_message(buf, sizeof(msg_header_t) + 16, world_rank, receiver, seq);
        ck_assert_int_eq(mr_send(buf, sizeof(msg_header_t) + 16, receiver), MR_OK);
        if (burst != 0 && seq % burst == burst - 1) ck_assert_int_ge(mr_poll(), MR_OK);
    }
}

/* Receives the first `want` messages of one sender, in order, and keeps them. */
static int receive_and_hold(void **held, int want)
{
    int got = 0;
    double start = now_s();

    while (got < want && now_s() - start < WAIT_LIMIT_S) {
        mr_message_t m;
        mr_status_t st = mr_receive(&m);
        if (st == MR_AGAIN) continue;
        ck_assert_int_eq(st, MR_OK);
        ck_assert_uint_eq(check_message(&m), (uint32_t)got);
        held[got++] = m.data;
    }
    return got;
}

/*
 * A receiver may hold its messages while it waits for more from the same
 * sender: grants must not depend on releases (adaptive grants start at 2).
 */
START_TEST(holding_messages_does_not_stall_the_sender)
{
    enum { HELD = 24 };
    void *held[HELD];
    int sender = 0, receiver = world_size - 1, got = 0;
    tally_t t;

    setup_env(NULL, NULL, NULL);
    init_on_world();
    tally_init(&t, HELD);
    if (world_rank == sender) {
        send_small(receiver, HELD, 0, &t);
    } else if (world_rank == receiver) {
        got = receive_and_hold(held, HELD);
        ck_assert_msg(got == HELD, "%d of %d messages arrived while the receiver held them", got,
                      HELD);
        for (int i = 0; i < got; i++) ck_assert_int_eq(mr_release(held[i]), MR_OK);
    }
    quiesce(&t);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/*
 * mr_finalize() discards what arrived and was never received, and gives back
 * what the application still holds: single messages and batches, one of
 * them partly handed out. The receiver takes the first two of four bursts
 * of 6 (MPI and UCX pack all but the first of each burst: the second is
 * the first frame of a batch) and lets the rest wait in the arrival queue.
 * A batch was once given back twice here, writing past the receive pool's
 * free stack (ASan's heap-buffer-overflow; glibc's heap checks later).
 */
START_TEST(finalize_discards_what_was_never_received)
{
    enum { BURSTS = 4, BURST = 6, TOTAL = BURSTS * BURST, TAKEN = 2 };
    int sender = 0, receiver = world_size - 1;
    mr_stats_t stats = {.size = sizeof(stats)};
    tally_t t;

    setup_env(NULL, NULL, NULL);
    init_on_world();
    tally_init(&t, TOTAL);
    if (world_rank == sender) {
        send_small(receiver, TOTAL, BURST, &t);
        /* Batches were made where the substrate packs (not over TCP). */
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        if (strcmp(mr_substrate_name(), "tcp") != 0 && strcmp(mr_flowctl_name(), "none") == 0) {
            ck_assert_uint_gt(stats.messages_coalesced, 0);
        }
    } else if (world_rank == receiver) {
        void *held[TAKEN];
        int got = receive_and_hold(held, TAKEN);
        double start = now_s();

        ck_assert_msg(got == TAKEN, "%d of %d messages arrived", got, TAKEN);
        /* Everything else arrives and waits, untaken. */
        do {
            ck_assert_int_ge(mr_poll(), MR_OK);
            ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%llu of %d messages arrived",
                          (unsigned long long)stats.recv_inflight, TOTAL);
        } while (stats.recv_inflight < TOTAL);
        ck_assert_uint_eq(stats.recv_inflight, TOTAL);
        ck_assert_uint_eq(stats.messages_received, TAKEN);
        (void)held; /* Still held at mr_finalize(), on purpose. */
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

START_TEST(bad_input_loses_nothing)
{
    int dest = (world_rank + 1) % world_size;
    void *buf, *other;
    char stack_buf[64];
    mr_message_t m;
    tally_t t;

    setup_env(NULL, NULL, "256");
    init_on_world();
    tally_init(&t, 4);
    ck_assert_int_eq(mr_init(), MR_ERR_ALREADY_INITIALIZED);
    ck_assert_int_eq(mr_reserve(NULL), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_receive(NULL), MR_ERR_INVALID_PARAM);
    /* Nobody has failed; the count is written, no rank is. */
    int failed[2] = {-7, -7}, nfailed = -1;
    ck_assert_int_eq(mr_failed_ranks(failed, 2, &nfailed), MR_OK);
    ck_assert_int_eq(nfailed, 0);
    ck_assert_int_eq(failed[0], -7);
    ck_assert_int_eq(mr_failed_ranks(NULL, 0, &nfailed), MR_OK);
    ck_assert_int_eq(mr_failed_ranks(NULL, 1, &nfailed), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_failed_ranks(failed, -1, &nfailed), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_failed_ranks(failed, 2, NULL), MR_ERR_INVALID_PARAM);

    ck_assert_int_eq(mr_reserve(&buf), MR_OK);
    fill_message(buf, 100, world_rank, dest, 0);
    ck_assert_int_eq(mr_send(buf, 100, -1), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_send(buf, 100, world_size), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_send(buf, 257, dest), MR_ERR_MESSAGE_TOO_LONG);
    ck_assert_int_eq(mr_send(stack_buf, 10, dest), MR_ERR_INVALID_BUFFER);
    ck_assert_int_eq(mr_send((char *)buf + 1, 10, dest), MR_ERR_INVALID_BUFFER);
    /* The buffer survived every refusal and still goes out intact. */
    ck_assert_int_eq(mr_send(buf, 100, dest), MR_OK);
    ck_assert_int_eq(mr_send(buf, 100, dest), MR_ERR_BUFFER_STATE);
    ck_assert_int_eq(mr_release(buf), MR_ERR_BUFFER_STATE);

    /* A reserved buffer can be given back unsent. */
    ck_assert_int_eq(mr_reserve(&other), MR_OK);
    ck_assert_int_eq(mr_release(other), MR_OK);
    ck_assert_int_eq(mr_release(other), MR_ERR_BUFFER_STATE);

    ck_assert_int_eq(mr_release(stack_buf), MR_ERR_INVALID_BUFFER);
    ck_assert_int_eq(mr_release(NULL), MR_ERR_INVALID_BUFFER);

    double start = now_s();
    while (mr_receive(&m) != MR_OK) ck_assert(now_s() - start < WAIT_LIMIT_S);
    ck_assert_uint_eq(check_message(&m), 0);
    ck_assert_uint_eq(m.length, 100);
    ck_assert_int_eq(mr_release((char *)m.data + 8), MR_ERR_INVALID_BUFFER);
    ck_assert_int_eq(mr_release(m.data), MR_OK);
    ck_assert_int_eq(mr_release(m.data), MR_ERR_BUFFER_STATE);

    /*
     * A burst to one rank, sent between two progress calls, travels coalesced
     * where the substrate packs messages (UCX, MPI), and arrives as frames of
     * one receive slot: each is released once, in any order; a pointer into
     * one is refused, and so is a frame released twice, also once the whole
     * batch is free.
     */
    enum { BURST = 6 };
    mr_message_t got[BURST];
    int left = (world_rank + world_size - 1) % world_size;
    for (uint32_t i = 0; i < BURST; i++) {
        ck_assert_int_eq(mr_reserve(&buf), MR_OK);
        fill_message(buf, 40 + i, world_rank, dest, 1 + i);
        ck_assert_int_eq(mr_send(buf, 40 + i, dest), MR_OK);
    }
    mr_stats_t sent = {.size = sizeof(sent)};
    ck_assert_int_eq(mr_get_stats(&sent), MR_OK);
    if (strcmp(mr_substrate_name(), "tcp") != 0) ck_assert_uint_eq(sent.messages_coalesced, BURST - 1);
    start = now_s();
    for (uint32_t i = 0; i < BURST; i++) {
        while (mr_receive(&got[i]) != MR_OK) ck_assert(now_s() - start < WAIT_LIMIT_S);
        ck_assert_int_eq(got[i].source, left);
        ck_assert_uint_eq(got[i].length, 40 + i);
        ck_assert_uint_eq(check_message(&got[i]), 1 + i);
        /* Coalesced or not, a payload starts 8-byte aligned, as a slot does. */
        ck_assert_uint_eq((uintptr_t)got[i].data % 8, 0);
    }
    ck_assert_int_eq(mr_release(got[BURST - 1].data), MR_OK);
    ck_assert_int_eq(mr_release(got[0].data), MR_OK);
    ck_assert_int_eq(mr_release(got[0].data), MR_ERR_BUFFER_STATE);
    ck_assert_int_eq(mr_release((char *)got[2].data + 8), MR_ERR_INVALID_BUFFER);
    ck_assert_int_eq(mr_release((char *)got[2].data + 1), MR_ERR_INVALID_BUFFER);
    for (int i = 1; i < BURST - 1; i++) ck_assert_int_eq(mr_release(got[i].data), MR_OK);
    ck_assert_int_eq(mr_release(got[3].data), MR_ERR_BUFFER_STATE);
    ck_assert_int_eq(mr_release(got[BURST - 1].data), MR_ERR_BUFFER_STATE);
    quiesce(&t);
    ck_assert_uint_eq(t.count, 0);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);

    /* After finalize every call says so. */
    ck_assert_int_eq(mr_reserve(&buf), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_send(buf, 1, 0), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_receive(&m), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_release(m.data), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_quiesce(), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_wait(0), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_send_handler_copy("x", 1, 0, 0), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_failed_ranks(NULL, 0, &nfailed), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(finalize_checked(), MR_ERR_NOT_INITIALIZED);
    mr_stats_t stats = {.size = sizeof(stats)};
    ck_assert_int_eq(mr_get_stats(&stats), MR_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(mr_rank(), -1);
    ck_assert_int_eq(mr_size(), -1);
    ck_assert_int_eq(mr_node_of(0), -1);
    ck_assert_ptr_null(mr_substrate_name());
}
END_TEST

/* ---- Failed inits leave nothing behind ---------------------------------------------- */

/* Returns a copy of an environment variable's value, or NULL when it is unset. */
static char *save_env(const char *name)
{
    return getenv(name) ? strdup(getenv(name)) : NULL;
}

/* Puts back (and frees) what save_env() returned. */
static void restore_env(const char *name, char *saved)
{
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
    free(saved);
}

/* The open file descriptors, one "fd -> target" per line, without the one listing them. */
static void list_fds(char *out, size_t len)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    size_t used = 0;

    ck_assert_ptr_nonnull(d);
    out[0] = '\0';
    while ((e = readdir(d)) != NULL) {
        char path[300], target[256];
        ssize_t n;

        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        n = readlink(path, target, sizeof(target) - 1);
        target[n < 0 ? 0 : n] = '\0';
        used += (size_t)snprintf(out + used, len - used, "%s -> %s\n", e->d_name, target);
        ck_assert_uint_lt(used, len);
    }
    closedir(d);
}

/* Counts the node segments in /dev/shm created by one of the `n` processes in `pids`. */
static int segments_of(const int *pids, int n)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int found = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        char path[300];
        mr_node_segment_t head;
        int fd;

        if (strncmp(e->d_name, MR_NODE_SEGMENT_PREFIX, strlen(MR_NODE_SEGMENT_PREFIX)) != 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* Another job's, unlinked meanwhile. */
        if (pread(fd, &head, sizeof(head), 0) == (ssize_t)sizeof(head) &&
            head.magic == MR_NODE_SEGMENT_MAGIC) {
            for (int i = 0; i < n; i++) found += head.creator_pid == pids[i];
        }
        close(fd);
    }
    closedir(d);
    return found;
}

/* What a failed mr_init_mpi() did: its status, its log, the descriptors before and after. */
typedef struct init_attempt {
    mr_status_t status;
    int pids[MR_TEST_MAX_RANKS];             /* Of every rank of the job. */
    char log[8192];
    char fds_before[8192], fds_after[8192];
} init_attempt_t;

/*
 * Calls mr_init_mpi() on MPI_COMM_WORLD with stderr captured into a->log,
 * listing the open file descriptors before and after. Collective. Asserts
 * nothing about the outcome, so that the caller can restore the settings
 * first and then call expect_nothing_left().
 */
static void attempt_init(init_attempt_t *a)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int pid = (int)getpid();
    FILE *capture = tmpfile();
    size_t n;
    int saved;

    ck_assert_ptr_nonnull(capture);
    MPI_Allgather(&pid, 1, MPI_INT, a->pids, 1, MPI_INT, MPI_COMM_WORLD);
    fflush(stderr);
    saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_eq(dup2(fileno(capture), STDERR_FILENO), STDERR_FILENO);
    list_fds(a->fds_before, sizeof(a->fds_before));
    a->status = mr_init_mpi(&comm, sizeof(comm));
    list_fds(a->fds_after, sizeof(a->fds_after));
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(capture);
    n = fread(a->log, 1, sizeof(a->log) - 1, capture);
    a->log[n] = '\0';
    fclose(capture);
    fputs(a->log, stderr); /* The test log shows what the user would see. */
}

/*
 * Checks that the init attempt failed and left nothing behind: MailRail is
 * not initialized, no file descriptor was opened or closed, and no node
 * segment of this job is left in /dev/shm on any rank. Collective.
 */
static void expect_nothing_left(const init_attempt_t *a)
{
    ck_assert_int_ne(a->status, MR_OK);
    ck_assert_int_eq(mr_rank(), -1);
    ck_assert_msg(strcmp(a->fds_before, a->fds_after) == 0,
                  "mr_init left file descriptors behind.\nBefore:\n%s\nAfter:\n%s",
                  a->fds_before, a->fds_after);
    /* Once every rank has unwound its init, none of them may have left a segment. */
    MPI_Barrier(MPI_COMM_WORLD);
    ck_assert_int_eq(segments_of(a->pids, world_size), 0);
}

/*
 * A bad setting fails init with MR_ERR_CONFIG or MR_ERR_PLUGIN, with a
 * message that names the setting and its value, and leaves nothing behind;
 * then a good init works in the same process.
 */
START_TEST(bad_settings_fail_init)
{
    static const struct {
        const char *name, *value;
        mr_status_t expect;
        const char *says; /* What the log must contain. */
    } cases[] = {
        {"MAILRAIL_DATAGRAM_SIZE", "huge", MR_ERR_CONFIG,
         "MAILRAIL_DATAGRAM_SIZE=\"huge\" is invalid: allowed is"},
        {"MAILRAIL_SEND_SLOTS", "12x", MR_ERR_CONFIG,
         "MAILRAIL_SEND_SLOTS=\"12x\" is invalid: allowed is"},
        {"MAILRAIL_RECV_SLOTS", "0", MR_ERR_CONFIG, "MAILRAIL_RECV_SLOTS=\"0\" is invalid"},
        {"MAILRAIL_FLOWCTL", "fast", MR_ERR_CONFIG, "MAILRAIL_FLOWCTL=\"fast\" is invalid"},
        {"MAILRAIL_LOG_LEVEL", "7", MR_ERR_CONFIG, "MAILRAIL_LOG_LEVEL=\"7\" is invalid"},
        {"MAILRAIL_SUBSTRATE", "nonexistent", MR_ERR_PLUGIN,
         "MAILRAIL_SUBSTRATE=\"nonexistent\" cannot be used"},
        {"MAILRAIL_SUBSTRATE", "carrier-pigeon", MR_ERR_PLUGIN,
         "MAILRAIL_SUBSTRATE=\"carrier-pigeon\" cannot be used"},
        {"MAILRAIL_SUBSTRATE", "../tcp", MR_ERR_PLUGIN, "MAILRAIL_SUBSTRATE=\"../tcp\""},
        {"MAILRAIL_PLUGIN_PATH", "/nonexistent", MR_ERR_PLUGIN, "/nonexistent"},
    };
    const char *substrate = getenv("MAILRAIL_SUBSTRATE") ? getenv("MAILRAIL_SUBSTRATE") : "ucx";
    static init_attempt_t a;
    MPI_Comm comm = MPI_COMM_WORLD;

    setup_env(NULL, NULL, NULL);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *saved = save_env(cases[i].name);

        setenv(cases[i].name, cases[i].value, 1);
        attempt_init(&a);
        restore_env(cases[i].name, saved);
        expect_nothing_left(&a);
        ck_assert_int_eq(a.status, cases[i].expect);
        ck_assert_msg(strstr(a.log, cases[i].says) != NULL,
                      "%s=%s: the log does not say \"%s\":\n%s", cases[i].name, cases[i].value,
                      cases[i].says, a.log);
        /* An unknown substrate's message lists the ones that work. */
        if (strcmp(cases[i].value, "nonexistent") == 0) {
            ck_assert_ptr_nonnull(strstr(a.log, "Substrates found: "));
            ck_assert_ptr_nonnull(strstr(strstr(a.log, "Substrates found: "), substrate));
        }
    }
    /* The status names say what kind of thing to fix. */
    ck_assert_ptr_nonnull(strstr(mr_status_string(MR_ERR_CONFIG), "MAILRAIL_"));
    ck_assert_ptr_nonnull(strstr(mr_status_string(MR_ERR_PLUGIN), "plugin"));
    ck_assert_int_eq(mr_init_mpi(NULL, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_init_mpi(&comm, 1), MR_ERR_INVALID_PARAM);
    MPI_Comm null_comm = MPI_COMM_NULL;
    ck_assert_int_eq(mr_init_mpi(&null_comm, sizeof(null_comm)), MR_ERR_INVALID_PARAM);
    /* After all those failures a good init still works. */
    ck_assert_int_eq(mr_init(), MR_OK);
    ck_assert_int_eq(mr_size(), world_size);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * A misspelt setting does not fail init, but rank 0 names it, with the
 * setting it probably meant; a setting of another substrate is not flagged.
 */
START_TEST(unknown_settings_are_named)
{
    const char *substrate = getenv("MAILRAIL_SUBSTRATE") ? getenv("MAILRAIL_SUBSTRATE") : "ucx";
    bool tcp = strcmp(substrate, "tcp") == 0, mpi = strcmp(substrate, "mpi") == 0;
    /* A typo of the loaded substrate's own setting, when the core checks its names. */
    const char *own = tcp ? "MAILRAIL_TCP_PORTS" : mpi ? "MAILRAIL_MPI_SEND_WINDOWS" : NULL;
    const char *own_meant = tcp ? "MAILRAIL_TCP_PORT" : "MAILRAIL_MPI_SEND_WINDOW";
    /* Another substrate's setting (MPI's has no prefix): unused, not unknown. */
    const char *other = tcp ? "MAILRAIL_MAX_RECVS" : "MAILRAIL_TCP_PORT";
    const char *vars[] = {"MAILRAIL_DATAGRAM_SIZ", "MAILRAIL_XYZZY", "MAILRAIL_LOG_LEVEL", other,
                          own};
    const char *values[] = {"1K", "1", "warn", "7", "7"};
    size_t nvars = own != NULL ? 5 : 4;
    static init_attempt_t a;
    char *saved[5];
    char expect[160];

    setup_env(NULL, NULL, NULL);
    for (size_t i = 0; i < nvars; i++) {
        saved[i] = save_env(vars[i]);
        setenv(vars[i], values[i], 1);
    }
    attempt_init(&a);
    for (size_t i = 0; i < nvars; i++) restore_env(vars[i], saved[i]);
    ck_assert_int_eq(a.status, MR_OK);
    /* The misspelt size was ignored: the default stays. */
    ck_assert_uint_eq(mr_datagram_size(), 4096);
    if (world_rank == 0) {
        ck_assert_msg(strstr(a.log, "MAILRAIL_DATAGRAM_SIZ is not a MailRail setting and is "
                                    "ignored; did you mean MAILRAIL_DATAGRAM_SIZE?") != NULL,
                      "no warning about the typo:\n%s", a.log);
        ck_assert_ptr_nonnull(strstr(a.log, "MAILRAIL_XYZZY is not a MailRail setting"));
        ck_assert_ptr_null(strstr(a.log, other));
        if (own != NULL) {
            snprintf(expect, sizeof(expect), "%s is not a MailRail setting and is ignored; did "
                     "you mean %s?", own, own_meant);
            ck_assert_msg(strstr(a.log, expect) != NULL, "no \"%s\" in:\n%s", expect, a.log);
        }
    } else {
        ck_assert_ptr_null(strstr(a.log, "is not a MailRail setting"));
    }
    ck_assert_ptr_null(strstr(a.log, "MAILRAIL_LOG_LEVEL is not"));
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* ---- Active-message handlers ----------------------------------------------------------- */

enum { H_REQUEST = 7, H_REPLY = 200, H_LONELY = 255 };

typedef struct handler_state {
    tally_t requests, replies;
    uint8_t *copy;             /* A buffer of the test's for mr_send_handler_copy(). */
    uint64_t again;            /* Requests whose reply found no send buffer at first. */
    bool checked_calls;        /* The calls refused inside a handler were tried. */
} handler_state_t;

/* Every length from a header's worth to the largest a handler's message may have. */
static size_t handler_length(uint32_t seq, int dest)
{
    size_t room = mr_datagram_size() - 1 - sizeof(msg_header_t);
    return sizeof(msg_header_t) + ((size_t)seq * 37 + (size_t)dest * 11) % (room + 1);
}

/* A request: checked, then answered with a reply of the same length and seq. */
static mr_status_t on_request(const mr_message_t *m, void *arg)
{
    handler_state_t *hs = arg;
    uint32_t seq = check_message(m);
    mr_stats_t stats = {.size = sizeof(stats)};
    mr_message_t other;
    void *buf;

    if (!hs->checked_calls) {
        /* Only sends (and reads of counters) are allowed here: a handler never waits. */
        hs->checked_calls = true;
        ck_assert_int_eq(mr_receive(&other), MR_ERR_IN_HANDLER);
        ck_assert_int_eq(mr_poll(), MR_ERR_IN_HANDLER);
        ck_assert_int_eq(mr_wait(0), MR_ERR_IN_HANDLER);
        ck_assert_int_eq(mr_quiesce(), MR_ERR_IN_HANDLER);
        ck_assert_int_eq(mr_handler_register(H_LONELY, NULL, NULL), MR_ERR_IN_HANDLER);
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    }
    if (seq % 2 == 0) {
        /* Half the replies are copies of the test's own bytes, sent without mr_reserve(). */
        fill_message(hs->copy, m->length, mr_rank(), m->source, seq);
        mr_status_t st = mr_send_handler_copy(hs->copy, m->length, m->source, H_REPLY);
        if (st == MR_AGAIN) {
            hs->again++;
            return MR_AGAIN;
        }
        ck_assert_int_eq(st, MR_OK);
        tally_mark(&hs->requests, m->source, seq);
        return MR_OK;
    }
    if (mr_reserve(&buf) != MR_OK) {
        /* No send buffer now: called again later with the same message, nothing sent yet. */
        hs->again++;
        return MR_AGAIN;
    }
    tally_mark(&hs->requests, m->source, seq);
    fill_message(buf, m->length, mr_rank(), m->source, seq);
    ck_assert_int_eq(mr_send_handler(buf, m->length, m->source, H_REPLY), MR_OK);
    return MR_OK;
}

static mr_status_t on_reply(const mr_message_t *m, void *arg)
{
    handler_state_t *hs = arg;

    tally_mark(&hs->replies, m->source, check_message(m));
    return MR_OK;
}

static mr_status_t on_lonely(const mr_message_t *m, void *arg)
{
    (void)m;
    (void)arg;
    ck_abort_msg("handler %d ran on rank %d, which never registered it", H_LONELY, mr_rank());
    return MR_OK;
}

/* Progress between quiescence waves: mr_poll() on even ranks, mr_wait() and mr_receive() on odd ones. */
static void progress_handlers(void *arg)
{
    mr_message_t m;
    mr_status_t st;

    (void)arg;
    if (mr_rank() % 2 == 0) {
        st = mr_poll();
        ck_assert_msg(st == MR_OK || st == MR_AGAIN, "mr_poll: %s", mr_status_string(st));
    } else {
        st = mr_wait(1);
        ck_assert_msg(st == MR_OK || st == MR_AGAIN, "mr_wait: %s", mr_status_string(st));
        ck_assert_int_eq(mr_receive(&m), MR_AGAIN); /* Handlers' messages never come here. */
    }
}

/*
 * Handlers: every rank sends requests of every length to a handler on every
 * rank (itself included), whose handler answers each with a reply to another
 * handler, from inside the handler, through a send pool of 4 buffers so that
 * replies often find none and their handler is called again. Requests and
 * replies of odd sequence numbers go from buffers of mr_reserve(), the others
 * as copies (mr_send_handler_copy()). Every request
 * and every reply is checked (payload, source, destination) and counted
 * exactly once; quiescence waits for the replies; a message to a handler the
 * destination never registered is dropped there and counted.
 */
START_TEST(handlers_exactly_once_with_replies)
{
    const uint32_t per_dest = 40;
    int all[MR_TEST_MAX_RANKS];
    handler_state_t hs = {0};
    mr_stats_t stats = {.size = sizeof(stats)};
    tally_t unused;
    void *buf;

    setup_env("4", "16", "512");
    init_on_world();
    tally_init(&unused, 1);
    tally_init(&hs.requests, per_dest);
    tally_init(&hs.replies, per_dest);
    for (int r = 0; r < world_size; r++) all[r] = r;
    hs.copy = malloc(mr_datagram_size()); /* Before any progress can run a handler. */
    ck_assert_ptr_nonnull(hs.copy);
    ck_assert_int_eq(mr_handler_register(-1, on_request, &hs), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_handler_register(MR_HANDLERS_MAX, on_request, &hs), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_handler_register(H_REQUEST, on_request, &hs), MR_OK);
    ck_assert_int_eq(mr_handler_register(H_REPLY, on_reply, &hs), MR_OK);

    /* Refusals leave the buffer the caller's. */
    buf = reserve_or_progress(&unused);
    fill_message(buf, 64, world_rank, 0, 0);
    ck_assert_int_eq(mr_send_handler(buf, 64, 0, 3), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_send_handler(buf, 64, 0, MR_HANDLERS_MAX), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_send_handler(buf, mr_datagram_size(), 0, H_REQUEST),
                     MR_ERR_MESSAGE_TOO_LONG);
    ck_assert_int_eq(mr_send_handler(buf, 64, world_size, H_REQUEST), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_release(buf), MR_OK);
    fill_message(hs.copy, 64, world_rank, 0, 0);
    ck_assert_int_eq(mr_send_handler_copy(hs.copy, 64, 0, 3), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_send_handler_copy(hs.copy, 64, 0, -1), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_send_handler_copy(NULL, 64, 0, H_REQUEST), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_send_handler_copy(hs.copy, mr_datagram_size(), 0, H_REQUEST),
                     MR_ERR_MESSAGE_TOO_LONG);
    ck_assert_int_eq(mr_send_handler_copy(hs.copy, 64, world_size, H_REQUEST),
                     MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr_send_handler_copy(hs.copy, 64, -1, H_REQUEST), MR_ERR_INVALID_RANK);

    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int r = 0; r < world_size; r++) {
            size_t length = handler_length(seq, r);
            if (seq % 2 == 0) {
                uint8_t *copy = malloc(length);
                ck_assert_ptr_nonnull(copy);
                fill_message(copy, length, world_rank, r, seq);
                mr_status_t st;
                while ((st = mr_send_handler_copy(copy, length, r, H_REQUEST)) == MR_AGAIN) {
                    progress_handlers(NULL);
                }
                ck_assert_int_eq(st, MR_OK);
                memset(copy, 0xee, length); /* The bytes were copied: the call took nothing. */
                free(copy);
                continue;
            }
            buf = reserve_or_progress(&unused);
            fill_message(buf, length, world_rank, r, seq);
            ck_assert_int_eq(mr_send_handler(buf, length, r, H_REQUEST), MR_OK);
        }
    }
    /* Rank 0 alone knows H_LONELY: rank 1 drops what it gets for it. */
    if (world_rank == 0 && world_size > 1) {
        ck_assert_int_eq(mr_handler_register(H_LONELY, on_lonely, NULL), MR_OK);
        buf = reserve_or_progress(&unused);
        ck_assert_int_eq(mr_send_handler(buf, 8, 1, H_LONELY), MR_OK);
    }
    quiesce_with(progress_handlers, NULL);
    expect_all_from(&hs.requests, all, world_size, per_dest);
    expect_all_from(&hs.replies, all, world_size, per_dest);

    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    uint64_t lonely = world_rank == 0 && world_size > 1;
    uint64_t dropped = world_rank == 1 ? 1 : 0;
    ck_assert_uint_eq(stats.handler_calls, 2 * (uint64_t)per_dest * world_size);
    ck_assert_uint_eq(stats.handler_dropped, dropped);
    ck_assert_uint_eq(stats.handler_retries, hs.again);
    ck_assert_uint_eq(stats.messages_sent, 2 * (uint64_t)per_dest * world_size + lonely);
    ck_assert_uint_eq(stats.messages_received, 2 * (uint64_t)per_dest * world_size + dropped);
    ck_assert_uint_eq(stats.recv_slots_in_use, 0);
    printf("rank %d (%s/%s): %llu handler calls, %llu in the transport's callback, %llu called "
           "again for want of a send buffer, %llu parked\n", world_rank, mr_substrate_name(),
           mr_flowctl_name(),
           (unsigned long long)stats.handler_calls, (unsigned long long)stats.handler_now,
           (unsigned long long)stats.handler_retries, (unsigned long long)stats.handler_parked);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(unused.seen);
    free(hs.requests.seen);
    free(hs.replies.seen);
    free(hs.copy);
}
END_TEST

enum { H_WAITER = 9, H_OTHER = 10 };

/* Rank 0's state in handlers_wait_per_source. */
typedef struct wait_state {
    tally_t others;            /* H_OTHER's messages, per source. */
    int expected;              /* How many sources send one each: every rank but rank 1. */
    uint64_t waited;           /* H_WAITER's calls that asked to be called again. */
} wait_state_t;

/* Rank 1's message: called again until every other source's message has run. */
static mr_status_t on_waiter(const mr_message_t *m, void *arg)
{
    wait_state_t *ws = arg;
    uint32_t seq = check_message(m);

    ck_assert_int_eq(m->source, 1);
    ck_assert_uint_eq(seq, 0);
    int seen = 0;
    for (int r = 0; r < world_size; r++) seen += r != 1 && ws->others.seen[r] != 0;
    if (seen < ws->expected) {
        ws->waited++;
        return MR_AGAIN;
    }
    return MR_OK;
}

static mr_status_t on_other(const mr_message_t *m, void *arg)
{
    wait_state_t *ws = arg;

    ck_assert_int_ne(m->source, 1);
    tally_mark(&ws->others, m->source, check_message(m));
    return MR_OK;
}

/*
 * A handler that waits holds up its own source only. Rank 1 sends rank 0 a
 * message whose handler asks to be called again until rank 0 has run one
 * message from every other rank (itself included). Those are sent only once
 * rank 1's handler has asked at least once, so they arrive behind it: under
 * one queue for all sources they would wait behind it for ever, and the test
 * fails at its time limit. Payloads and sources are checked.
 */
START_TEST(handlers_wait_per_source)
{
    wait_state_t ws = {.expected = world_size - 1};
    tally_t unused;
    double start;
    void *buf;

    setup_env("16", "64", "512");
    init_on_world();
    tally_init(&ws.others, 1);
    tally_init(&unused, 1);
    ck_assert_int_eq(mr_handler_register(H_WAITER, on_waiter, &ws), MR_OK);
    ck_assert_int_eq(mr_handler_register(H_OTHER, on_other, &ws), MR_OK);
    if (world_rank == 1) {
        buf = reserve_or_progress(&unused);
        fill_message(buf, 100, 1, 0, 0);
        ck_assert_int_eq(mr_send_handler(buf, 100, 0, H_WAITER), MR_OK);
    }
    /* Rank 0 says "go" once rank 1's handler has asked to be called again. */
    start = now_s();
    if (world_rank == 0) {
        while (ws.waited == 0) {
            mr_status_t st = mr_poll();
            ck_assert_msg(st == MR_OK || st == MR_AGAIN, "mr_poll: %s", mr_status_string(st));
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "rank 1's message never ran");
        }
        for (int r = 2; r < world_size; r++) {
            buf = reserve_or_progress(&unused);
            ck_assert_int_eq(mr_send(buf, 1, r), MR_OK);
        }
    } else if (world_rank > 1) {
        mr_message_t m;
        bool go = false;
        while (!go) {
            mr_status_t st = mr_receive(&m);
            if (st == MR_AGAIN) {
                ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "no go from rank 0");
                continue;
            }
            ck_assert_int_eq(st, MR_OK);
            ck_assert_int_eq(m.source, 0);
            ck_assert_int_eq(mr_release(m.data), MR_OK);
            go = true;
        }
    }
    if (world_rank != 1) {
        buf = reserve_or_progress(&unused);
        fill_message(buf, 200, world_rank, 0, 0);
        ck_assert_int_eq(mr_send_handler(buf, 200, 0, H_OTHER), MR_OK);
    }
    if (world_rank == 0) {
        int all_but_1[MR_TEST_MAX_RANKS], n = 0;
        for (int r = 0; r < world_size; r++) {
            if (r != 1) all_but_1[n++] = r;
        }
        start = now_s();
        /* Rank 1's handler returns MR_OK once the others ran: its message counts then. */
        for (;;) {
            mr_stats_t stats = {.size = sizeof(stats)};
            mr_status_t st = mr_poll();
            ck_assert_msg(st == MR_OK || st == MR_AGAIN, "mr_poll: %s", mr_status_string(st));
            ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
            if (stats.handler_calls == (uint64_t)world_size) break;
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S,
                          "the other sources' messages waited behind rank 1's (%llu of %d "
                          "handled)", (unsigned long long)stats.handler_calls, world_size);
        }
        expect_all_from(&ws.others, all_but_1, n, 1);
        ck_assert_uint_gt(ws.waited, 0);
    }
    quiesce_with(progress_handlers, NULL);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(ws.others.seen);
    free(unused.seen);
}
END_TEST

/* ---- Topology ------------------------------------------------------------------------ */

/* mr_init_mpi() on a thread of its own: what it returns. */
static void *init_on_thread(void *comm)
{
    static mr_status_t status;

    status = mr_init_mpi(comm, sizeof(MPI_Comm));
    return &status;
}

/*
 * MailRail on a sub-communicator: even and odd world ranks form two separate
 * jobs (of one rank each with two processes, which exercises sending to
 * oneself only), with their own ranks, and traffic stays inside each.
 */
START_TEST(sub_communicator)
{
    MPI_Comm half;
    int half_rank, half_size;
    const uint32_t per_dest = 20;
    int all[MR_TEST_MAX_RANKS];
    tally_t t;

    setup_env("8", "8", "256");
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    MPI_Comm_rank(half, &half_rank);
    MPI_Comm_size(half, &half_size);
    /*
     * MPI_Init gave MPICH's default level: MailRail refuses a thread that is
     * not MPI's main one, alone and leaving nothing behind (mailrail.h, "Threads").
     */
    int provided;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
        pthread_t thread;
        void *result;
        ck_assert_int_eq(pthread_create(&thread, NULL, init_on_thread, &half), 0);
        ck_assert_int_eq(pthread_join(thread, &result), 0);
        ck_assert_int_eq(*(mr_status_t *)result, MR_ERR_UNSUPPORTED);
        ck_assert_int_eq(mr_rank(), -1);
    }
    ck_assert_int_eq(mr_init_mpi(&half, sizeof(half)), MR_OK);
    ck_assert_int_eq(mr_rank(), half_rank);
    ck_assert_int_eq(mr_size(), half_size);
    for (int r = 0; r < half_size; r++) all[r] = r;
    tally_init(&t, per_dest);
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int r = 0; r < half_size; r++) {
            void *buf = reserve_or_progress(&t);
            fill_message(buf, 64, half_rank, r, seq);
            ck_assert_int_eq(mr_send(buf, 64, r), MR_OK);
        }
    }
    quiesce(&t);
    expect_all_from(&t, all, half_size, per_dest);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    MPI_Comm_free(&half);
    free(t.seen);
}
END_TEST

START_TEST(virtual_nodes)
{
    setup_env(NULL, NULL, NULL);
    init_on_world();
    ck_assert_int_eq(mr_node_count(), 1);
    for (int r = 0; r < world_size; r++) ck_assert_int_eq(mr_node_of(r), 0);
    ck_assert_int_eq(mr_node_of(world_size), -1);
    ck_assert_int_eq(finalize_checked(), MR_OK);

    setenv("MAILRAIL_RANKS_PER_NODE", "2", 1);
    init_on_world();
    ck_assert_int_eq(mr_node_count(), (world_size + 1) / 2);
    for (int r = 0; r < world_size; r++) ck_assert_int_eq(mr_node_of(r), r / 2);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    unsetenv("MAILRAIL_RANKS_PER_NODE");
}
END_TEST

/* ---- A stranger on the TCP port ------------------------------------------------------ */

/* Connects to "tcp A.B.C.D:PORT" and returns the socket. */
static int connect_to(const char *address)
{
    char ip[64];
    unsigned port;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int fd;

    ck_assert_int_eq(sscanf(address, "tcp %63[0-9.]:%u", ip, &port), 2);
    ck_assert_int_eq(inet_pton(AF_INET, ip, &sa.sin_addr), 1);
    sa.sin_port = htons((uint16_t)port);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

START_TEST(stranger_is_rejected)
{
    const int victim = world_size - 1, attacker = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};
    double start;

    setup_env(NULL, NULL, "256");
    setenv("MAILRAIL_TCP_AUTH_TIMEOUT", "1", 1);
    init_on_world();
    unsetenv("MAILRAIL_TCP_AUTH_TIMEOUT");
    tally_init(&t, 10);
    if (world_rank == attacker) {
        char address[128];
        uint8_t nonce[16], junk[64];
        ck_assert_int_eq(mr_peer_address(victim, address, sizeof(address)), MR_OK);
        ck_assert_ptr_nonnull(strstr(address, "127.0.0.1"));

        /* 1. Garbage instead of a handshake. */
        int fd = connect_to(address);
        memset(junk, 0xab, sizeof(junk));
        send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
        /* 2. A handshake with the right shape and a wrong MAC: magic "MRAU", version 3,
              the attacker's own rank, a 32-byte MAC of zeros (substrates/tcp/tcp_wire.h). */
        int fd2 = connect_to(address);
        ck_assert_int_eq(recv(fd2, nonce, sizeof(nonce), MSG_WAITALL), (ssize_t)sizeof(nonce));
        uint8_t auth[44] = {0x55, 0x41, 0x52, 0x4d, 0x03, 0x00, 0x00, 0x00, (uint8_t)attacker};
        send(fd2, auth, sizeof(auth), MSG_NOSIGNAL);
        /* 3. A data frame as if authenticated, with an absurd length. */
        int fd3 = connect_to(address);
        uint32_t frame[3] = {0xffffffffu, 0, 1};
        send(fd3, frame, sizeof(frame), MSG_NOSIGNAL);
        /* The victim closes every one of them: end of stream or a reset, not a timeout. */
        start = now_s();
        for (int *f = (int[]){fd, fd2, fd3}, k = 0; k < 3; k++) {
            struct timeval limit = {.tv_sec = (time_t)WAIT_LIMIT_S};
            ssize_t n;
            char c;
            setsockopt(f[k], SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
            while ((n = recv(f[k], &c, 1, 0)) > 0) ck_assert(now_s() - start < WAIT_LIMIT_S);
            ck_assert_msg(n == 0 || errno == ECONNRESET, "stranger %d: the victim did not close "
                          "its connection (recv: %s)", k + 1, strerror(errno));
            close(f[k]);
        }
    }
    if (world_rank == victim) {
        start = now_s();
        do {
            drain(&t);
            ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "rejected %llu of 3 strangers",
                          (unsigned long long)stats.connections_rejected);
        } while (stats.connections_rejected < 3);
        ck_assert_uint_eq(t.count, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* The job goes on: everybody sends to the victim, which gets exactly that. */
    int senders[MR_TEST_MAX_RANKS];
    for (int r = 0; r < world_size; r++) senders[r] = r;
    exchange(&victim, 1, 10, &t);
    quiesce(&t);
    if (world_rank == victim) expect_all_from(&t, senders, world_size, 10);
    else ck_assert_uint_eq(t.count, 0);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/*
 * A failure on one rank during init fails init on every rank, promptly,
 * instead of leaving the others waiting in a collective: rank 1's TCP port
 * is taken before it can listen. The node policy has created and mapped its
 * segment by then, so unwinding it is checked too. Nothing is left behind,
 * the logs say what to fix, and a good init then works.
 */
/* Binds a loopback TCP port as the TCP substrate does; -1 when it is in use. */
static int bind_loopback(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * Finds n consecutive free ports below the kernel's ephemeral range (which
 * starts at 32768 by default, so no connect() or bind to port 0 by MPI, UCX
 * or another test can take them while the job starts), and keeps the second
 * one listening in *taken. Returns the first port, or -1.
 */
static int reserve_port_block(int n, int *taken)
{
    for (int tries = 0, base = 20000 + (int)(getpid() % 500) * 20; tries < 500;
         tries++, base = base + 20 > 32000 - n ? 20000 : base + 20) {
        int fd[MR_TEST_MAX_RANKS], ok = 0;

        while (ok < n && (fd[ok] = bind_loopback(base + ok)) >= 0) ok++;
        for (int i = 0; i < ok; i++) {
            if (i == 1 && ok == n && listen(fd[i], 1) == 0) *taken = fd[i];
            else close(fd[i]);
        }
        if (ok == n && *taken >= 0) return base;
    }
    return -1;
}

START_TEST(init_fails_everywhere_when_one_rank_fails)
{
    const uint32_t per_dest = 20;
    int taken = -1, base = 0, all[MR_TEST_MAX_RANKS];
    static init_attempt_t a;
    char port[16], says[64], *policy = save_env("MAILRAIL_FLOWCTL");
    tally_t t;
    double start;

    setup_env(NULL, NULL, NULL);
    if (world_rank == 0) {
        /* Rank r will listen on base + r, and rank 1's port is taken. */
        base = reserve_port_block(world_size, &taken);
        ck_assert_int_gt(base, 0);
    }
    MPI_Bcast(&base, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(port, sizeof(port), "%d", base);
    setenv("MAILRAIL_TCP_PORT", port, 1);
    setenv("MAILRAIL_TIMEOUT", "20", 1);
    setenv("MAILRAIL_FLOWCTL", "node", 1);
    start = now_s();
    attempt_init(&a);
    unsetenv("MAILRAIL_TCP_PORT");
    unsetenv("MAILRAIL_TIMEOUT");
    if (taken >= 0) close(taken);
    ck_assert_msg(now_s() - start < 10.0, "init took %.1f s to fail", now_s() - start);
    expect_nothing_left(&a);
    if (world_rank == 1) {
        /* The rank that failed says which port and why. */
        ck_assert_int_eq(a.status, MR_ERR_TRANSPORT);
        snprintf(says, sizeof(says), "MAILRAIL_TCP_PORT=%d): %s", base, strerror(EADDRINUSE));
        ck_assert_msg(strstr(a.log, says) != NULL, "the log does not say \"%s\":\n%s", says,
                      a.log);
    } else {
        /* The others point at it. */
        ck_assert_int_eq(a.status, MR_ERR_PEER_FAILED);
        ck_assert_msg(strstr(a.log, "1 other rank(s) failed to initialize") != NULL,
                      "the log does not name the failure elsewhere:\n%s", a.log);
    }
    /* MPI is still usable, and a good init works and carries traffic. */
    init_on_world();
    ck_assert_str_eq(mr_flowctl_name(), "node");
    for (int r = 0; r < world_size; r++) all[r] = r;
    tally_init(&t, per_dest);
    exchange(all, world_size, per_dest, &t);
    quiesce(&t);
    expect_all_from(&t, all, world_size, per_dest);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
    restore_env("MAILRAIL_FLOWCTL", policy);
}
END_TEST

/* ---- Soak mode ----------------------------------------------------------------------- */

/*
 * With MR_TEST_SOAK_MESSAGES=<n> the suite runs this test only: for each
 * policy in MR_TEST_SOAK_POLICIES (default "none,rank,node") MailRail is
 * initialized afresh and the job moves about <n> messages, every rank sending
 * its share round-robin to every other rank. Every message is checked in the
 * hot loop without Check assertions (Check records each assertion it passes,
 * which would cost more than the message): payload bytes, source, length, and
 * its sequence number, which must be exactly the next one from its source.
 * Since delivery is FIFO per source and destination, that catches a lost, a
 * duplicated and a reordered message alike; the totals are checked at the end.
 *
 * Memory must stay flat: a warm-up phase of 1/20 of the messages runs first,
 * then /proc/self/status is read after its quiescence and again after the
 * main phase's quiescence. Private resident memory (VmRSS minus RssShmem) may
 * grow by at most MR_TEST_SOAK_RSS_SLACK_KB (default 1024 KiB) on any rank:
 * at 20 million messages that is 0.05 bytes per message, so any per-message
 * leak fails. VmRSS and VmHWM may grow by at most that plus
 * MR_TEST_SOAK_SHM_SLACK_KB (default 16384 KiB) of shared memory: the
 * shared-memory transports touch their segments lazily, and UCX's mm
 * transport grows its receive descriptor pool in shared chunks of
 * UCX_POSIX_RX_BUFS_GROW x UCX_POSIX_SEG_SIZE = 512 x 8256 bytes (4 MiB) until
 * the pool covers the descriptors in use at once, which the FIFO and the
 * receive pool bound. 1 to 5.5 MiB of RssShmem appeared after the warm-up,
 * as much after 0.2 as after 20 million messages.
 */
#define SOAK_REQUIRE(cond, ...)                                                              \
    do {                                                                                     \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                              \
    } while (0)

typedef struct soak_state {
    uint32_t expect[MR_TEST_MAX_RANKS];     /* Next sequence number from each source. */
    uint32_t next_seq[MR_TEST_MAX_RANKS];   /* Next sequence number to each destination. */
    uint64_t received;
} soak_state_t;

typedef struct soak_memory {
    long rss_kb, hwm_kb, anon_kb, file_kb, shmem_kb;
} soak_memory_t;

static uint64_t soak_setting(const char *name, uint64_t fallback)
{
    const char *text = getenv(name);
    char *end;
    unsigned long long value;

    if (text == NULL || *text == '\0') return fallback;
    errno = 0;
    value = strtoull(text, &end, 10);
    ck_assert_msg(text[0] >= '0' && text[0] <= '9' && *end == '\0' && errno == 0 && value > 0,
                  "%s=\"%s\" is not a positive integer", name, text);
    return value;
}

static soak_memory_t soak_read_memory(void)
{
    soak_memory_t mem = {-1, -1, -1, -1, -1};
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        sscanf(line, "VmRSS: %ld kB", &mem.rss_kb);
        sscanf(line, "VmHWM: %ld kB", &mem.hwm_kb);
        sscanf(line, "RssAnon: %ld kB", &mem.anon_kb);
        sscanf(line, "RssFile: %ld kB", &mem.file_kb);
        sscanf(line, "RssShmem: %ld kB", &mem.shmem_kb);
    }
    fclose(f);
    ck_assert_int_gt(mem.rss_kb, 0);
    ck_assert_int_gt(mem.hwm_kb, 0);
    return mem;
}

/* Receives and checks whatever is there; `state` is the soak_state_t. */
static void soak_receive(void *state)
{
    soak_state_t *s = state;
    mr_message_t m;
    msg_header_t h;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        SOAK_REQUIRE(m.length >= sizeof(h) && m.source >= 0 && m.source < world_size,
                     "message of %zu bytes from rank %d", m.length, m.source);
        memcpy(&h, m.data, sizeof(h));
        SOAK_REQUIRE(h.source == m.source && h.dest == world_rank && h.length == m.length,
                     "header (%d -> %d, %u bytes) of a %zu-byte message from %d",
                     h.source, h.dest, h.length, m.length, m.source);
        SOAK_REQUIRE(h.seq == s->expect[m.source],
                     "message %u from %d arrived when %u was expected (lost, duplicated or "
                     "reordered)", h.seq, m.source, s->expect[m.source]);
        SOAK_REQUIRE(first_corrupt_byte(&m, &h) == m.length,
                     "byte %zu of message %u from %d is corrupt", first_corrupt_byte(&m, &h),
                     h.seq, m.source);
        s->expect[m.source]++;
        s->received++;
        SOAK_REQUIRE(mr_release(m.data) == MR_OK, "mr_release failed");
    }
    SOAK_REQUIRE(st == MR_AGAIN, "mr_receive: %s", mr_status_string(st));
}

/* Sends `per_dest` messages to every other rank, round-robin, of varying lengths. */
static void soak_send(soak_state_t *s, uint64_t per_dest)
{
    size_t room = mr_datagram_size() - sizeof(msg_header_t) + 1;

    for (uint64_t i = 0; i < per_dest; i++) {
        for (int k = 1; k < world_size; k++) {
            int dest = (world_rank + k) % world_size;
            uint32_t seq = s->next_seq[dest]++;
            size_t len = sizeof(msg_header_t) + (seq * 37u + (uint32_t)dest) % room;
            double start = 0;
            void *buf;
            mr_status_t st;

            while ((st = mr_reserve(&buf)) == MR_AGAIN) {
                if (start == 0) start = now_s();
                else SOAK_REQUIRE(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
                soak_receive(s);
            }
            SOAK_REQUIRE(st == MR_OK, "mr_reserve: %s", mr_status_string(st));
            fill_message(buf, len, world_rank, dest, seq);
            st = mr_send(buf, len, dest);
            SOAK_REQUIRE(st == MR_OK, "mr_send: %s", mr_status_string(st));
            soak_receive(s);
        }
    }
}

/* Runs one policy: warm-up, measured main phase, exactly-once and memory checks. */
static void soak_policy(const char *policy, uint64_t per_dest, long slack_kb, long shm_slack_kb)
{
    uint64_t warm_per_dest = per_dest / 20 ? per_dest / 20 : 1;
    uint64_t sent_here = (uint64_t)(world_size - 1) * (warm_per_dest + per_dest);
    uint64_t job_total = sent_here * (uint64_t)world_size, received_total = 0;
    soak_state_t *s = calloc(1, sizeof(*s));
    soak_memory_t warm, end;
    mr_stats_t stats = {.size = sizeof(stats)};
    double start, elapsed, slowest = 0;

    ck_assert_ptr_nonnull(s);
    setenv("MAILRAIL_FLOWCTL", policy, 1);
    init_on_world();
    ck_assert_str_eq(mr_flowctl_name(), policy);

    soak_send(s, warm_per_dest);
    quiesce_with(soak_receive, s);
    warm = soak_read_memory();
    MPI_Barrier(MPI_COMM_WORLD);
    start = now_s();
    soak_send(s, per_dest);
    quiesce_with(soak_receive, s);
    elapsed = now_s() - start;
    end = soak_read_memory();

    /* Exactly once: every sequence number of every source, and the totals. */
    for (int r = 0; r < world_size; r++) {
        ck_assert_uint_eq(s->expect[r], r == world_rank ? 0 : warm_per_dest + per_dest);
        ck_assert_uint_eq(s->next_seq[r], r == world_rank ? 0 : warm_per_dest + per_dest);
    }
    ck_assert_uint_eq(s->received, sent_here);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_uint_eq(stats.messages_sent, sent_here);
    ck_assert_uint_eq(stats.messages_received, sent_here);
    ck_assert_uint_eq(stats.recv_slots_in_use, 0);
    MPI_Allreduce(&s->received, &received_total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    ck_assert_uint_eq(received_total, job_total);

    printf("soak rank %d %s/%s: VmRSS %ld -> %ld kB (%+ld), VmHWM %ld -> %ld kB (%+ld); "
           "anonymous %+ld, file %+ld, shared %+ld kB\n",
           world_rank, mr_substrate_name(), policy, warm.rss_kb, end.rss_kb,
           end.rss_kb - warm.rss_kb, warm.hwm_kb, end.hwm_kb, end.hwm_kb - warm.hwm_kb,
           end.anon_kb - warm.anon_kb, end.file_kb - warm.file_kb,
           end.shmem_kb - warm.shmem_kb);
    if (world_rank == 0) {
        uint64_t main_total = (uint64_t)world_size * (uint64_t)(world_size - 1) * per_dest;
        printf("soak %s/%s on %d ranks: %llu messages (%llu after warm-up) in %.2f s = %.0f "
               "msg/s, all delivered exactly once\n",
               mr_substrate_name(), policy, world_size, (unsigned long long)job_total,
               (unsigned long long)main_total, slowest, (double)main_total / slowest);
    }
    fflush(stdout);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    ck_assert_msg(end.rss_kb - end.shmem_kb - (warm.rss_kb - warm.shmem_kb) <= slack_kb,
                  "%s: private resident memory grew from %ld to %ld kB after warm-up "
                  "(allowed: %ld kB)", policy, warm.rss_kb - warm.shmem_kb,
                  end.rss_kb - end.shmem_kb, slack_kb);
    ck_assert_msg(end.rss_kb - warm.rss_kb <= slack_kb + shm_slack_kb,
                  "%s: VmRSS grew from %ld to %ld kB after warm-up (allowed: %ld kB)", policy,
                  warm.rss_kb, end.rss_kb, slack_kb + shm_slack_kb);
    ck_assert_msg(end.hwm_kb - warm.hwm_kb <= slack_kb + shm_slack_kb,
                  "%s: VmHWM grew from %ld to %ld kB after warm-up (allowed: %ld kB)", policy,
                  warm.hwm_kb, end.hwm_kb, slack_kb + shm_slack_kb);
    free(s);
}

START_TEST(soak_exactly_once_flat_memory)
{
    uint64_t messages = soak_setting("MR_TEST_SOAK_MESSAGES", 0);
    long slack_kb = (long)soak_setting("MR_TEST_SOAK_RSS_SLACK_KB", 1024);
    long shm_slack_kb = (long)soak_setting("MR_TEST_SOAK_SHM_SLACK_KB", 16384);
    const char *policies = getenv("MR_TEST_SOAK_POLICIES");
    char list[64], *save = NULL, *initial_policy = save_env("MAILRAIL_FLOWCTL");
    uint64_t per_dest;
    int ran = 0;

    ck_assert_int_ge(world_size, 2);
    per_dest = messages / ((uint64_t)world_size * (uint64_t)(world_size - 1));
    ck_assert_msg(per_dest > 0 && per_dest < UINT32_MAX / 2,
                  "MR_TEST_SOAK_MESSAGES=%llu does not fit %d ranks",
                  (unsigned long long)messages, world_size);
    setup_env(NULL, NULL, getenv("MR_TEST_SOAK_DATAGRAM") ? getenv("MR_TEST_SOAK_DATAGRAM")
                                                          : "256");
    ck_assert_msg(policies == NULL || strlen(policies) < sizeof(list),
                  "MR_TEST_SOAK_POLICIES is longer than %zu characters", sizeof(list) - 1);
    snprintf(list, sizeof(list), "%s", policies ? policies : "none,rank,node");
    for (char *p = strtok_r(list, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        soak_policy(p, per_dest, slack_kb, shm_slack_kb);
        ran++;
    }
    ck_assert_int_gt(ran, 0);
    restore_env("MAILRAIL_FLOWCTL", initial_policy);
}
END_TEST

static Suite *conformance_suite(void)
{
    Suite *s = suite_create("conformance");
    TCase *tc = tcase_create("core");
    const char *substrate = getenv("MAILRAIL_SUBSTRATE");

    tcase_set_timeout(tc, 0);
    if (getenv("MR_TEST_SOAK_MESSAGES") != NULL) {
        tcase_add_test(tc, soak_exactly_once_flat_memory);
        suite_add_tcase(s, tc);
        return s;
    }
    tcase_add_test(tc, all_to_all_exactly_once);
    tcase_add_test(tc, send_bytes_backpressure);
    tcase_add_test(tc, send_bytes_follow_the_datagram);
    tcase_add_test(tc, incast_exactly_once);
    tcase_add_test(tc, order_per_destination);
    tcase_add_test(tc, zero_and_max_length);
    tcase_add_test(tc, backpressure);
    tcase_add_test(tc, quiescence_waits_for_chains);
    tcase_add_test(tc, handlers_exactly_once_with_replies);
    tcase_add_test(tc, handlers_wait_per_source);
    tcase_add_test(tc, bad_input_loses_nothing);
    tcase_add_test(tc, wait_sleeps_and_wakes_at_once);
    tcase_add_test(tc, wait_naps_and_wakes);
    tcase_add_test(tc, wait_naps_while_the_application_holds_every_slot);
    tcase_add_test(tc, holding_messages_does_not_stall_the_sender);
    tcase_add_test(tc, finalize_discards_what_was_never_received);
    tcase_add_test(tc, bad_settings_fail_init);
    tcase_add_test(tc, unknown_settings_are_named);
    tcase_add_test(tc, virtual_nodes);
    tcase_add_test(tc, sub_communicator);
    if (substrate == NULL || strcmp(substrate, "tcp") == 0) {
        tcase_add_test(tc, stranger_is_rejected);
        tcase_add_test(tc, init_fails_everywhere_when_one_rank_fails);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return run_suite_on_all_ranks(argc, argv, conformance_suite);
}
