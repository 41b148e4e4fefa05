/*
 * Flow-control tests, run under mpiexec with 8 ranks (7:1 incast) for the
 * policy in MAILRAIL_FLOWCTL. Pools are tiny (1 or 2 credits per pair) so
 * that the deferred path is exercised hard. The ranks are grouped into two
 * virtual nodes of four (MAILRAIL_RANKS_PER_NODE=4) so that node-based
 * credits are shared for real.
 */
#include "mr_node_segment.h"
#include "mr_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The policy the suite runs under (MAILRAIL_FLOWCTL when it started). */
static char initial_policy[16];

static const char *policy(void)
{
    const char *p = getenv("MAILRAIL_FLOWCTL");
    return p ? p : "none";
}

static bool credit_policy(void)
{
    return strcmp(initial_policy, "none") != 0;
}

static uint64_t sum_over_ranks(uint64_t value)
{
    uint64_t total = 0;
    MPI_Allreduce(&value, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

/* Sets up `credits_per_pair` receive slots per rank of the job. */
static void tiny_pools(int credits_per_pair, const char *send_slots)
{
    char recv[32];
    snprintf(recv, sizeof(recv), "%d", credits_per_pair * world_size);
    setup_env(send_slots, recv, "256");
    setenv("MAILRAIL_RANKS_PER_NODE", "4", 1);
}

/*
 * mr_get_credit_grants() after a quiesced incast with one credit per pair (a
 * node's share under node): one entry per rank under rank, per node under
 * node, none under none; never more outstanding than granted.
 */
static void check_credit_grants(void)
{
    uint32_t out[MR_TEST_MAX_RANKS];
    int holders = -1;
    mr_status_t st = mr_get_credit_grants(out, world_size, &holders);

    if (!credit_policy()) {
        ck_assert_int_eq(st, MR_ERR_UNSUPPORTED);
        return;
    }
    ck_assert_int_eq(st, MR_OK);
    ck_assert_int_eq(holders, strcmp(initial_policy, "rank") == 0 ? world_size : mr_node_count());
    /* Recv slots are one per rank: a pair holds 1, a node of 4 its 4. */
    uint32_t share = strcmp(initial_policy, "rank") == 0 ? 1 : 4;
    for (int h = 0; h < holders; h++) ck_assert_uint_le(out[h], share);
    ck_assert_int_eq(mr_get_credit_grants(NULL, 1, &holders), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_get_credit_grants(out, -1, &holders), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr_get_credit_grants(out, 0, &holders), MR_OK);
}

/* mr_init() with tiny pools and static credits per pair (rank) and per node (node). */
static void init_with_credits(int slots_per_rank, const char *send_slots, const char *rank_credits,
                              const char *node_credits)
{
    tiny_pools(slots_per_rank, send_slots);
    setenv("MAILRAIL_RANK_CREDITS", rank_credits, 1);
    setenv("MAILRAIL_NODE_CREDITS", node_credits, 1);
    init_on_world();
    unsetenv("MAILRAIL_RANK_CREDITS");
    unsetenv("MAILRAIL_NODE_CREDITS");
}

/* mr_init() with one slot per rank; lists the senders of an incast to rank 0. */
static int incast_setup(uint32_t per_sender, int *senders, tally_t *t)
{
    int nsend = 0;

    tiny_pools(1, "8");
    init_on_world();
    for (int r = 1; r < world_size; r++) senders[nsend++] = r;
    tally_init(t, per_sender);
    return nsend;
}

/* 7:1 incast: every other rank floods rank 0, with one credit per pair. */
START_TEST(incast_exactly_once)
{
    const uint32_t per_sender = 150;
    int victim = 0, senders[MR_TEST_MAX_RANKS];
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};
    int nsend = incast_setup(per_sender, senders, &t);

    if (world_rank != victim) exchange(&victim, 1, per_sender, &t);
    quiesce(&t);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    if (world_rank == victim) {
        expect_all_from(&t, senders, nsend, per_sender);
        /* Quiesced: nothing in a slot or held; the grant is the pool (finalize_checked). */
        ck_assert_uint_eq(stats.recv_slots_in_use, 0);
        ck_assert_uint_eq(stats.recv_inflight, 0);
        ck_assert_uint_eq(stats.recv_granted, (uint64_t)world_size);
        if (credit_policy()) ck_assert_uint_gt(stats.credit_returns_sent, 0);
    } else {
        ck_assert_uint_eq(t.count, 0);
        ck_assert_uint_eq(stats.messages_sent, per_sender);
    }
    /* With a handful of credits and 150 messages each, senders had to defer. */
    uint64_t deferred = sum_over_ranks(stats.deferred_sends);
    if (credit_policy()) ck_assert_uint_gt(deferred, 0);
    check_credit_grants();
    ck_assert_int_eq(finalize_checked(), MR_OK);
    uint32_t one;
    int holders;
    ck_assert_int_eq(mr_get_credit_grants(&one, 1, &holders), MR_ERR_NOT_INITIALIZED);
    free(t.seen);
}
END_TEST

/*
 * One all-to-all round with `credits` per pair: exactly once, payload and
 * source checked, the receive pool never exceeded. Returns this rank's stats.
 */
static mr_stats_t all_to_all_round(int credits)
{
    const uint32_t per_dest = 40;
    int all[MR_TEST_MAX_RANKS];
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    char pair[16], node[16];

    /* Static grants: the whole share at once, so that returns and piggybacks are exact. */
    tiny_pools(credits, "8");
    snprintf(pair, sizeof(pair), "%d", credits);
    snprintf(node, sizeof(node), "%d", credits * 4);
    setenv("MAILRAIL_RANK_CREDITS", pair, 1);
    setenv("MAILRAIL_NODE_CREDITS", node, 1);
    init_on_world();
    unsetenv("MAILRAIL_RANK_CREDITS");
    unsetenv("MAILRAIL_NODE_CREDITS");
    for (int r = 0; r < world_size; r++) all[r] = r;
    tally_init(&t, per_dest);
    exchange(all, world_size, per_dest, &t);
    quiesce(&t);
    expect_all_from(&t, all, world_size, per_dest);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    /* Static grants: credits per pair from every rank, or a node's share from each node. */
    if (credit_policy()) {
        ck_assert_uint_eq(stats.recv_granted, (uint64_t)credits * world_size);
        ck_assert_uint_le(stats.peak_recv_inflight, stats.recv_granted);
    }
    ck_assert_uint_eq(stats.messages_sent, (uint64_t)per_dest * world_size);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
    return stats;
}

/*
 * The pool bound from the wire's side: rank 0 takes messages into all its
 * slots (one per rank) and holds them while the others keep sending.
 * Under rank and node the messages in flight to it (in slots, or held by
 * the substrate for want of one) never exceed what it granted; under none
 * they do, by what the substrate took in besides, and the test prints how much.
 */
START_TEST(pool_bound_from_the_wire)
{
    const uint32_t per_sender = 40;
    int victim = 0, senders[MR_TEST_MAX_RANKS];
    void *held[MR_TEST_MAX_RANKS];
    int nheld = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};
    int nsend = incast_setup(per_sender, senders, &t);

    if (world_rank != victim) {
        exchange(&victim, 1, per_sender, &t);
    } else {
        /* Hold every slot for 300 ms; under none until they overflow, within 5 s. */
        double start = now_s();
        mr_message_t m;
        do {
            if (nheld < world_size && mr_receive(&m) == MR_OK) {
                uint32_t seq = check_message(&m);
                t.seen[(size_t)m.source * per_sender + seq] = 1;
                t.count++;
                held[nheld++] = m.data;
                continue;
            }
            (void)mr_wait(5);
            ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        } while (now_s() - start < 0.3 ||
                 (!credit_policy() && stats.peak_recv_inflight <= stats.recv_granted &&
                  now_s() - start < 5.0));
        ck_assert_int_ge(nheld, nsend); /* Under rank, one per sender is all they may send. */
        ck_assert_uint_eq(stats.recv_granted, (uint64_t)world_size);
        if (credit_policy()) {
            ck_assert_uint_le(stats.peak_recv_inflight, stats.recv_granted);
        } else {
            ck_assert_uint_gt(stats.peak_recv_inflight, stats.recv_granted);
            fprintf(stderr, "pool_bound_from_the_wire: none over %s: %llu messages in flight "
                    "to a rank that has %llu slots\n", mr_substrate_name(),
                    (unsigned long long)stats.peak_recv_inflight,
                    (unsigned long long)stats.recv_granted);
        }
        ck_assert_uint_ge(stats.recv_inflight, (uint64_t)nheld);
        for (int i = 0; i < nheld; i++) ck_assert_int_eq(mr_release(held[i]), MR_OK);
    }
    quiesce(&t);
    if (world_rank == victim) expect_all_from(&t, senders, nsend, per_sender);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/* The receive loop of held_frames_count_as_messages's quiescence: releases what comes. */
static void release_all(void *arg)
{
    mr_message_t m;

    (void)arg;
    while (mr_receive(&m) == MR_OK) ck_assert_int_eq(mr_release(m.data), MR_OK);
}

/*
 * Every message the application holds is in flight to its rank, each frame of
 * a batch counted as one: rank 1 sends 32 small messages to rank 0 in one
 * burst (UCX and MPI coalesce them, and a batch of data takes one receive
 * slot), and rank 0 holds every one it receives for 300 ms. While it holds
 * them, recv_inflight and its peak are at least as many; counted per slot
 * they were fewer (2 against 32 over UCX and MPI under none, on 2026-12-04).
 */
START_TEST(held_frames_count_as_messages)
{
    enum { BURST = 32 };
    void *held[BURST];
    int nheld = 0, most = 0;
    uint64_t coalesced = 0, inflight_at_most = 0;
    mr_stats_t st = {.size = sizeof(st)};

    init_with_credits(4, "64", "4", "4");
    if (world_rank == 1) {
        for (uint32_t seq = 0; seq < BURST; seq++) {
            void *buf = NULL;
            double start = now_s();
            while (mr_reserve(&buf) == MR_AGAIN) {
                (void)mr_wait(1);
                ck_assert(now_s() - start < WAIT_LIMIT_S);
            }
            fill_message(buf, 16, 1, 0, seq);
            ck_assert_int_eq(mr_send(buf, 16, 0), MR_OK);
        }
    } else if (world_rank == 0) {
        uint8_t seen[BURST] = {0};
        int got = 0;
        double start = now_s();
        mr_message_t m;
        while (got < BURST) {
            bool holding = now_s() - start < 0.3;
            if (!holding) {
                while (nheld > 0) ck_assert_int_eq(mr_release(held[--nheld]), MR_OK);
            }
            if (mr_receive(&m) == MR_OK) {
                uint32_t seq = check_message(&m);
                ck_assert_uint_lt(seq, BURST);
                ck_assert_int_eq(seen[seq]++, 0);
                got++;
                if (!holding) {
                    ck_assert_int_eq(mr_release(m.data), MR_OK);
                    continue;
                }
                held[nheld++] = m.data;
                ck_assert_int_eq(mr_get_stats(&st), MR_OK);
                /* What the application holds is in flight to it, frame by frame. */
                ck_assert_uint_ge(st.recv_inflight, (uint64_t)nheld);
                ck_assert_uint_ge(st.peak_recv_inflight, (uint64_t)nheld);
                if (nheld > most) {
                    most = nheld;
                    inflight_at_most = st.recv_inflight;
                }
                continue;
            }
            (void)mr_wait(1);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%d of %d messages came", got, BURST);
        }
        while (nheld > 0) ck_assert_int_eq(mr_release(held[--nheld]), MR_OK);
    }
    quiesce_with(release_all, NULL);
    /* The sender's count, once its batches left. */
    ck_assert_int_eq(mr_get_stats(&st), MR_OK);
    coalesced = st.messages_coalesced;
    MPI_Bcast(&coalesced, 1, MPI_UINT64_T, 1, MPI_COMM_WORLD);
    if (world_rank == 0) {
        ck_assert_int_eq(mr_get_stats(&st), MR_OK);
        fprintf(stderr, "held_frames_count_as_messages: %s over %s: %d messages held at once, "
                "%llu in flight then, in at most %llu slots; the sender coalesced %llu\n",
                policy(), mr_substrate_name(), most, (unsigned long long)inflight_at_most,
                (unsigned long long)st.peak_recv_slots_in_use, (unsigned long long)coalesced);
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/* MPI_Barrier() while MailRail makes progress: sends may need it to leave (a dial). */
static void progress_barrier(void)
{
    MPI_Request req;
    int done = 0;

    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    while (!done) {
        (void)mr_poll();
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    }
}

/*
 * A message of rank 1's burst, whose sequence numbers run from `first` for
 * `burst` messages: checked (bytes, source, range) and seen exactly once.
 */
static void take_burst_message(const mr_message_t *m, uint8_t *seen, int first, int burst)
{
    uint32_t seq = check_message(m);

    ck_assert_int_eq(m->source, 1);
    ck_assert_uint_ge(seq, (uint32_t)first);
    ck_assert_uint_lt(seq, (uint32_t)(first + burst));
    ck_assert_int_eq(seen[seq - (uint32_t)first]++, 0);
}

/*
 * A batch that waits in the substrate for a slot counts its frames: rank 1
 * sends rank 0 a lone message for each of its slots but one, and rank 0
 * holds them; then rank 1 sends a burst of small messages, whose first
 * leaves alone and takes the last slot, and whose rest UCX and MPI coalesce
 * into batches that can only wait outside the pool. recv_inflight must count
 * a held batch by its frames, not once: MPI reads every message sent into
 * its ring, UCX nothing more after the first batch it holds. Under none only
 * (credits would stop the burst).
 */
START_TEST(held_batch_counts_its_frames)
{
    enum { BURST = 24 };
    void *held[MR_TEST_MAX_RANKS];
    int slots = world_size, nheld = 0, total = world_size - 1 + BURST;
    uint64_t coalesced = 0, inflight = 0;
    mr_stats_t st = {.size = sizeof(st)};
    mr_message_t m;

    tiny_pools(1, "64"); /* One slot per rank: world_size slots at rank 0. */
    init_on_world();
    if (world_rank == 1) {
        /* Each alone: a progress call between two sends leaves nothing to pack. */
        for (uint32_t seq = 0; seq < (uint32_t)slots - 1; seq++) {
            void *buf = NULL;
            ck_assert_int_eq(mr_reserve(&buf), MR_OK);
            fill_message(buf, 16, 1, 0, seq);
            ck_assert_int_eq(mr_send(buf, 16, 0), MR_OK);
            (void)mr_poll();
        }
    } else if (world_rank == 0) {
        double start = now_s();
        while (nheld < slots - 1) {
            if (mr_receive(&m) == MR_OK) {
                ck_assert_int_eq(m.source, 1);
                ck_assert_uint_eq(check_message(&m), (uint32_t)nheld);
                held[nheld++] = m.data;
                continue;
            }
            (void)mr_wait(1);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%d of %d lone messages came", nheld,
                          slots - 1);
        }
    }
    progress_barrier();
    if (world_rank == 1) {
        for (uint32_t seq = 0; seq < BURST; seq++) {
            void *buf = NULL;
            ck_assert_int_eq(mr_reserve(&buf), MR_OK);
            fill_message(buf, 16, 1, 0, (uint32_t)slots - 1 + seq);
            ck_assert_int_eq(mr_send(buf, 16, 0), MR_OK);
        }
        (void)mr_poll();
        ck_assert_int_eq(mr_get_stats(&st), MR_OK);
        coalesced = st.messages_coalesced;
    }
    MPI_Bcast(&coalesced, 1, MPI_UINT64_T, 1, MPI_COMM_WORLD);
    if (world_rank == 0) {
        uint8_t seen[BURST] = {0};
        int got = 0;
        /* Until every message sent is counted in flight (the last slot's held too), or 3 s. */
        double start = now_s();
        do {
            if (nheld < slots && mr_receive(&m) == MR_OK) {
                /* The last slot's: the burst's first, unless the substrate reordered. */
                take_burst_message(&m, seen, slots - 1, BURST);
                got++;
                held[nheld++] = m.data;
            } else {
                (void)mr_wait(1);
            }
            ck_assert_int_eq(mr_get_stats(&st), MR_OK);
            inflight = st.recv_inflight;
        } while (inflight < (uint64_t)total && now_s() - start < 3.0);
        fprintf(stderr, "held_batch_counts_its_frames: %s: %d messages held in %d slots, %d more "
                "sent (%llu coalesced): %llu in flight\n", mr_substrate_name(), nheld, slots,
                total - nheld, (unsigned long long)coalesced, (unsigned long long)inflight);
        /*
         * Counted per batch, a batch held outside the pool read as one: UCX, which reads
         * nothing after it, then showed nheld + 1, MPI fewer than it read (2026-12-05).
         */
        if (coalesced > 0) ck_assert_uint_ge(inflight, (uint64_t)nheld + 2);
        if (coalesced > 0 && strcmp(mr_substrate_name(), "mpi") == 0) {
            ck_assert_uint_eq(inflight, (uint64_t)total); /* MPI reads every message. */
        }
        ck_assert_uint_ge(inflight, (uint64_t)nheld);
        ck_assert_uint_le(inflight, (uint64_t)total);
        while (nheld > 0) ck_assert_int_eq(mr_release(held[--nheld]), MR_OK);
        /* Then the rest of the burst, each message exactly once. */
        start = now_s();
        while (got < BURST) {
            if (mr_receive(&m) == MR_OK) {
                take_burst_message(&m, seen, slots - 1, BURST);
                ck_assert_int_eq(mr_release(m.data), MR_OK);
                got++;
                continue;
            }
            (void)mr_wait(1);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%d of the burst's %d messages came",
                          got, BURST);
        }
    }
    quiesce_with(release_all, NULL);
    ck_assert_int_eq(finalize_checked(), MR_OK);
}
END_TEST

/*
 * All-to-all with two static credits per pair: everyone defers. Then with
 * four, so that credits are returned after two and some are owed when a data
 * message leaves: piggybacking pays them back, unless it is turned off.
 */
START_TEST(all_to_all_exactly_once)
{
    mr_stats_t stats;
    uint64_t piggybacked;

    all_to_all_round(2);
    stats = all_to_all_round(4);
    piggybacked = sum_over_ranks(stats.piggybacked_credits);
    if (credit_policy()) ck_assert_uint_gt(piggybacked, 0);
    else ck_assert_uint_eq(piggybacked, 0);

    /* Without piggybacking every credit goes back in a control message. */
    setenv("MAILRAIL_PIGGYBACK", "no", 1);
    stats = all_to_all_round(4);
    ck_assert_uint_eq(sum_over_ranks(stats.piggybacked_credits), 0);
    unsetenv("MAILRAIL_PIGGYBACK");
}
END_TEST

/*
 * Every rank sends to every other as fast as it can and receives only while
 * mr_reserve() says MR_AGAIN: with one credit per pair and four send buffers
 * this must still finish.
 */
START_TEST(no_deadlock_when_receiving_only_under_backpressure)
{
    const uint32_t per_dest = 60;
    int others[MR_TEST_MAX_RANKS], n = 0;
    tally_t t;
    double start = now_s();

    tiny_pools(1, "4");
    init_on_world();
    for (int r = 0; r < world_size; r++) {
        if (r != world_rank) others[n++] = r;
    }
    tally_init(&t, per_dest);
    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int k = 0; k < n; k++) {
            void *buf;
            while (mr_reserve(&buf) == MR_AGAIN) {
                drain(&t);
                ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "deadlock at message %u", seq);
            }
            fill_message(buf, 32, world_rank, others[k], seq);
            ck_assert_int_eq(mr_send(buf, 32, others[k]), MR_OK);
        }
    }
    quiesce(&t);
    expect_all_from(&t, others, n, per_dest);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/* Messages from one sender to one receiver keep their order under the policy. */
START_TEST(fifo_per_destination)
{
    const uint32_t count = 200;
    uint32_t next_seq[MR_TEST_MAX_RANKS] = {0};
    uint32_t got = 0, expected = 0;
    mr_message_t m;
    double start = now_s();

    tiny_pools(1, "6");
    init_on_world();
    /* Rank 0 is the victim of everybody, everybody else also sends to rank 1. */
    for (uint32_t seq = 0; seq < count; seq++) {
        for (int dest = 0; dest < 2 && dest < world_size; dest++) {
            void *buf;
            if (dest == world_rank) continue;
            while (mr_reserve(&buf) == MR_AGAIN) {
                while (mr_receive(&m) == MR_OK) {
                    ck_assert_uint_eq(check_message(&m), next_seq[m.source]++);
                    got++;
                    mr_release(m.data);
                }
                ck_assert(now_s() - start < WAIT_LIMIT_S);
            }
            fill_message(buf, 48, world_rank, dest, seq);
            ck_assert_int_eq(mr_send(buf, 48, dest), MR_OK);
        }
    }
    if (world_rank < 2) expected = (uint32_t)(world_size - 1) * count;
    while (got < expected) {
        if (mr_receive(&m) == MR_OK) {
            ck_assert_uint_eq(check_message(&m), next_seq[m.source]++);
            got++;
            mr_release(m.data);
        }
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "got %u of %u", got, expected);
    }
    tally_t t;
    tally_init(&t, 1);
    quiesce(&t);
    ck_assert_uint_eq(t.count, 0);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/* Runs the 7:1 incast under `flowctl` and returns the credit returns sent by all ranks. */
static uint64_t incast_credit_returns(const char *flowctl)
{
    const uint32_t per_sender = 200;
    int victim = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    setenv("MAILRAIL_FLOWCTL", flowctl, 1);
    /* Static grants, as in the paper: eight credits per pair under rank; 32 per node under node. */
    init_with_credits(8, "16", "8", "32");
    tally_init(&t, per_sender);
    if (world_rank != victim) exchange(&victim, 1, per_sender, &t);
    quiesce(&t);
    ck_assert_uint_eq(t.count, world_rank == victim ? (uint64_t)(world_size - 1) * per_sender : 0);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
    return sum_over_ranks(stats.credit_returns_sent);
}

/*
 * Node-based credits need fewer credit-return messages than rank-based ones
 * on the same incast: the node's pool is larger, so is the return threshold,
 * and credits of the victim's own node never cross the network.
 */
START_TEST(node_returns_fewer_credits_than_rank)
{
    uint64_t by_rank = incast_credit_returns("rank");
    uint64_t by_node = incast_credit_returns("node");

    setenv("MAILRAIL_FLOWCTL", initial_policy, 1);
    if (world_rank == 0) {
        printf("credit-return messages on a %d:1 incast, 2 nodes of 4 ranks: rank %llu, node "
               "%llu, node/rank = %.3f\n", world_size - 1, (unsigned long long)by_rank,
               (unsigned long long)by_node, (double)by_node / (double)by_rank);
    }
    ck_assert_uint_gt(by_rank, 0);
    /* Expected (4/7 of the senders are remote) x (return after 16, not 4) = 1/7; allow 1/2. */
    ck_assert_uint_le(by_node * 2, by_rank);
}
END_TEST

/*
 * Senders that sleep in mr_wait() for credit are woken when it comes: the
 * four ranks of node 0 send to rank 4 (node 1) with 2 credits per node (1
 * per pair under rank) and sleep up to 5 s at a time whenever they cannot
 * send. Under node, credits come back to one of them, which puts them in the
 * node's pool and wakes a neighbour; under rank, to each on its own
 * connection. A sleeper that is not woken sleeps the full 5 s, which fails.
 */
START_TEST(sleepers_are_woken_for_credit)
{
    const uint32_t per_sender = 60;
    const int victim = 4;
    double longest = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    init_with_credits(2, "4", "1", "2");
    tally_init(&t, per_sender);
    bool sender = world_rank < 4 && world_size > victim;
    for (uint32_t seq = 0; sender && seq < per_sender; seq++) {
        void *buf;
        mr_status_t st;
        while ((st = mr_reserve(&buf)) == MR_AGAIN) {
            drain(&t);
            double t0 = now_s();
            st = mr_wait(5000);
            if (now_s() - t0 > longest) longest = now_s() - t0;
            ck_assert(st == MR_OK || st == MR_AGAIN);
        }
        ck_assert_int_eq(st, MR_OK);
        fill_message(buf, 64, world_rank, victim, seq);
        ck_assert_int_eq(mr_send(buf, 64, victim), MR_OK);
    }
    /* Until every deferred send has left: each wait must end well before 5 s. */
    while (sender) {
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        if (stats.deferred_now == 0) break;
        double t0 = now_s();
        mr_status_t st = mr_wait(5000);
        if (now_s() - t0 > longest) longest = now_s() - t0;
        ck_assert(st == MR_OK || st == MR_AGAIN);
    }
    /* The victim sleeps too while nothing comes. */
    while (world_rank == victim && t.count < 4 * per_sender) {
        if (drain(&t) == 0) ck_assert(mr_wait(5000) == MR_OK || t.count < 4 * per_sender);
    }
    quiesce(&t);
    if (world_rank == victim) {
        const int senders[4] = {0, 1, 2, 3};
        expect_all_from(&t, senders, 4, per_sender);
    }
    ck_assert_msg(longest < 2.5, "rank %d slept %.2f s in mr_wait() with credit due", world_rank,
                  longest);
    ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    if (strcmp(policy(), "none") != 0 && sender) ck_assert_uint_gt(stats.deferred_sends, 0);
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
}
END_TEST

/* Counts /dev/shm entries that are MailRail node segments. */
static int count_segments(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)) != NULL) {
        n += strncmp(e->d_name, MR_NODE_SEGMENT_PREFIX, strlen(MR_NODE_SEGMENT_PREFIX)) == 0;
    }
    closedir(d);
    return n;
}

/* Writes a segment with a valid header that claims `pid` as its creator. */
static void plant_segment(const char *name, pid_t pid)
{
    mr_node_segment_t head = {.magic = MR_NODE_SEGMENT_MAGIC,
                              .version = MR_NODE_SEGMENT_VERSION,
                              .creator_pid = (int32_t)pid};
    int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, &head, sizeof(head)), (ssize_t)sizeof(head));
    close(fd);
}

/*
 * The node segment exists only while the ranks map it: its name is gone
 * after init and after finalize (test_unit.c checks that it is owner-only),
 * and a segment left by a killed run (creator dead) is removed by the next
 * run while a live one is left alone.
 */
START_TEST(segments_cleaned_up)
{
    const char *stale = "/mailrail-mr-stale0000test-n0", *live = "/mailrail-mr-live00000test-n0";
    pid_t dead;
    struct stat st;
    int fd;

    setenv("MAILRAIL_FLOWCTL", "node", 1);
    tiny_pools(2, NULL);
    if (world_rank == 0) {
        /* A process that has exited stands for the creator of a killed run. */
        dead = fork();
        if (dead == 0) _exit(0);
        waitpid(dead, NULL, 0);
        plant_segment(stale, dead);
        plant_segment(live, getpid());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    init_on_world();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank == 0) {
        ck_assert_int_lt(shm_open(stale, O_RDONLY, 0), 0);
        fd = shm_open(live, O_RDONLY, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fstat(fd, &st), 0);
        close(fd);
        shm_unlink(live);
        /* No node segment name is left while the job runs. */
        ck_assert_int_eq(count_segments(), 0);
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank == 0) ck_assert_int_eq(count_segments(), 0);
    setenv("MAILRAIL_FLOWCTL", initial_policy, 1);
}
END_TEST

/* Credit settings that the pool cannot back fail init with MR_ERR_CONFIG. */
START_TEST(impossible_credit_settings)
{
    static const struct {
        const char *flowctl, *name, *value;
    } cases[] = {
        {"rank", "MAILRAIL_RANK_CREDITS", "9"},   /* 9 x 8 ranks > 64 slots */
        {"node", "MAILRAIL_NODE_CREDITS", "33"},  /* 33 x 2 nodes > 64 slots */
        {"rank", "MAILRAIL_RECV_SLOTS", "7"},     /* 7 / 8 ranks = 0 per pair */
        {"node", "MAILRAIL_RECV_SLOTS", "1"},     /* 1 / 2 nodes = 0 per node */
        {"rank", "MAILRAIL_CREDIT_RETURN_THRESHOLD", "0"},
        {"rank", "MAILRAIL_RANK_CREDITS", "x"},
        {"node", "MAILRAIL_NODE_CREDITS", "-1"},
    };
    MPI_Comm comm = MPI_COMM_WORLD;

    ck_assert_int_eq(world_size, 8);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tiny_pools(8, NULL);
        setenv("MAILRAIL_FLOWCTL", cases[i].flowctl, 1);
        setenv(cases[i].name, cases[i].value, 1);
        ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_ERR_CONFIG);
        unsetenv(cases[i].name);
        ck_assert_int_eq(count_segments(), 0);
    }
    /* The exact fit works. */
    setenv("MAILRAIL_FLOWCTL", "rank", 1);
    setenv("MAILRAIL_RANK_CREDITS", "8", 1);
    init_on_world();
    ck_assert_int_eq(finalize_checked(), MR_OK);
    unsetenv("MAILRAIL_RANK_CREDITS");
    setenv("MAILRAIL_FLOWCTL", initial_policy, 1);
}
END_TEST

/*
 * With MAILRAIL_RECV_SLOTS unset, `rank` grows the receive pool to the credits
 * it grants: 200 per pair x 8 ranks = 1,600 slots, more than the default
 * 1,024. The victim holds every message of its 7 senders (1,400) at once,
 * which a pool of 1,024 could not.
 */
START_TEST(rank_pool_grows_to_its_credits)
{
    const uint32_t per_sender = 200, expected = per_sender * (uint32_t)(world_size - 1);
    int victim = 0;
    tally_t t;
    mr_stats_t stats = {.size = sizeof(stats)};

    setup_env("8", NULL, "256");
    setenv("MAILRAIL_FLOWCTL", "rank", 1);
    setenv("MAILRAIL_RANK_CREDITS", "200", 1);
    /* MPI delivers in staging buffers, twice MAILRAIL_MAX_RECVS of them (512 here by default). */
    const char *substrate = getenv("MAILRAIL_SUBSTRATE");
    if (substrate != NULL && strcmp(substrate, "mpi") == 0) setenv("MAILRAIL_MAX_RECVS", "1024", 1);
    init_on_world();
    tally_init(&t, per_sender);
    if (world_rank != victim) {
        exchange(&victim, 1, per_sender, &t);
    } else {
        void **held = calloc(expected, sizeof(*held));
        uint32_t got = 0;
        double start = now_s();
        mr_message_t m;

        ck_assert_ptr_nonnull(held);
        while (got < expected) {
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%u of %u messages arrived", got,
                          expected);
            if (mr_receive(&m) != MR_OK) continue;
            uint32_t seq = check_message(&m);
            ck_assert_uint_lt(seq, per_sender);
            ck_assert_uint_eq(t.seen[(size_t)m.source * per_sender + seq], 0);
            t.seen[(size_t)m.source * per_sender + seq] = 1;
            t.count++;
            held[got++] = m.data;
        }
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
        ck_assert_uint_eq(stats.recv_slots_in_use, expected);
        for (uint32_t i = 0; i < got; i++) ck_assert_int_eq(mr_release(held[i]), MR_OK);
        free(held);
    }
    quiesce(&t);
    if (world_rank == victim) {
        int senders[MR_TEST_MAX_RANKS], nsend = 0;
        for (int r = 1; r < world_size; r++) senders[nsend++] = r;
        expect_all_from(&t, senders, nsend, per_sender);
    }
    ck_assert_int_eq(finalize_checked(), MR_OK);
    free(t.seen);
    unsetenv("MAILRAIL_RANK_CREDITS");
    unsetenv("MAILRAIL_MAX_RECVS");
    setenv("MAILRAIL_FLOWCTL", initial_policy, 1);
}
END_TEST

static Suite *flowctl_suite(void)
{
    Suite *s = suite_create("flowctl");
    TCase *tc = tcase_create("credits");

    snprintf(initial_policy, sizeof(initial_policy), "%s", policy());
    tcase_add_test(tc, incast_exactly_once);
    tcase_add_test(tc, sleepers_are_woken_for_credit);
    tcase_add_test(tc, pool_bound_from_the_wire);
    tcase_add_test(tc, held_frames_count_as_messages);
    if (!credit_policy()) tcase_add_test(tc, held_batch_counts_its_frames);
    tcase_add_test(tc, all_to_all_exactly_once);
    tcase_add_test(tc, no_deadlock_when_receiving_only_under_backpressure);
    tcase_add_test(tc, fifo_per_destination);
    /* These switch policies themselves: run them once, with the node run. */
    if (strcmp(initial_policy, "node") == 0) {
        tcase_add_test(tc, node_returns_fewer_credits_than_rank);
        tcase_add_test(tc, segments_cleaned_up);
        tcase_add_test(tc, impossible_credit_settings);
        tcase_add_test(tc, rank_pool_grows_to_its_credits);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return run_suite_on_all_ranks(argc, argv, flowctl_suite);
}
