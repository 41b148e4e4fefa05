/*
 * The credit-invariant checks can fail: on 2 ranks over the faulty substrate
 * double (tests/doubles/substrate_faulty.c), each broken promise makes its
 * count in mr_stats_t rise and tool_invariant_breach(), the check every other
 * test ends with, report it; over the same double without a fault nothing
 * rises. Rank 1 sends, rank 0 receives; every test runs under rank and node.
 */
#include "mr_test.h"
#include "tool_common.h"

#include <fnmatch.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SENDS 8
#define SLOTS "8"

static const char *const policies[] = {"rank", "node"};

/*
 * What a case's log must say: on `rank`, lines matching `pattern` (fnmatch(3),
 * the whole line) between `min` and `max` times. Every other line MailRail
 * logs during the case fails it.
 */
typedef struct {
    int rank;
    const char *pattern;
    int min, max;
} expected_line_t;

#define NONE_LOGGED NULL, 0 /* finish()'s arguments when nothing may be logged. */

/* The case's stderr goes to a file from init to finalize, so that its log can be checked. */
static struct {
    int saved_fd; /* The real stderr, or -1 when not capturing. */
    FILE *file;
    char what[64];
} capture = {.saved_fd = -1};

/* Puts stderr back; what was captured stays in capture.file. */
static void capture_stop(void)
{
    if (capture.saved_fd < 0) return;
    fflush(stderr);
    (void)dup2(capture.saved_fd, STDERR_FILENO);
    close(capture.saved_fd);
    capture.saved_fd = -1;
}

static void capture_start(const char *policy, const char *fault)
{
    /* A case that failed midway left its capture open: end it first. */
    capture_stop();
    if (capture.file != NULL) fclose(capture.file);
    snprintf(capture.what, sizeof(capture.what), "%s, fault \"%s\"", policy, fault);
    fflush(stderr);
    capture.file = tmpfile();
    ck_assert_ptr_nonnull(capture.file);
    capture.saved_fd = dup(STDERR_FILENO);
    ck_assert_int_ge(capture.saved_fd, 0);
    ck_assert_int_ge(dup2(fileno(capture.file), STDERR_FILENO), 0);
}

/*
 * Ends the capture and checks this rank's MailRail log lines against `want`:
 * each line matches one expectation for this rank, and each expectation's
 * count is within its bounds. One line on stderr says what was seen.
 */
static void capture_check(const expected_line_t *want, size_t nwant)
{
    char line[1024], prefix[32];
    int seen[8] = {0}, total = 0;

    capture_stop();
    ck_assert_uint_le(nwant, sizeof(seen) / sizeof(seen[0]));
    snprintf(prefix, sizeof(prefix), "mailrail[%d] ", world_rank);
    rewind(capture.file);
    while (fgets(line, sizeof(line), capture.file) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "mailrail", 8) != 0) continue; /* MPICH's or Check's, not MailRail's. */
        size_t i = 0;
        while (i < nwant && !(want[i].rank == world_rank && fnmatch(want[i].pattern, line, 0) == 0)) i++;
        ck_assert_msg(i < nwant && strncmp(line, prefix, strlen(prefix)) == 0,
                      "%s: rank %d logged a line no expectation allows: %s", capture.what, world_rank,
                      line);
        seen[i]++;
        total++;
    }
    for (size_t i = 0; i < nwant; i++) {
        if (want[i].rank != world_rank) continue;
        ck_assert_msg(seen[i] >= want[i].min && seen[i] <= want[i].max,
                      "%s: rank %d logged \"%s\" %d times, expected %d to %d", capture.what,
                      world_rank, want[i].pattern, seen[i], want[i].min, want[i].max);
    }
    fprintf(stderr, "breaches: %s: rank %d logged %d error line%s, each one expected\n", capture.what,
            world_rank, total, total == 1 ? "" : "s");
    fclose(capture.file);
    capture.file = NULL;
}

/* The receiver's line for a message that used no credit it granted. */
#define UNCREDITED "mailrail\\[0\\] error: A message from rank 1 came without a credit this rank granted; *"
/* The sender's lines for credits returned beyond those outstanding, per policy. */
#define OVER_RETURNED_RANK "mailrail\\[1\\] error: Rank 0 returned * credits but only * were outstanding; ignoring the excess."
/* mr_quiesce()'s line on rank R when the job received more than it sent. */
#define QUIESCE_DUPLICATES(R) "mailrail\\[" R "\\] error: mr_quiesce(): the job received 16 messages but sent 8: 8 arrived more than once (a substrate delivered duplicates); quiescence cannot be reached."
#define OVER_RETURNED_NODE "mailrail\\[1\\] error: Rank 0's credits for this node reached *, more than the 4 it grants; a peer returned credits it was not owed."

/* mr_init() over the double with `fault` on every `every`-th message, 4 static credits per
   pair (8 per node), and `slots` receive slots of `dgram` bytes. */
static void init_faulty_pool(const char *policy, const char *fault, const char *copies,
                             const char *every, const char *slots, const char *dgram)
{
    setup_env("8", slots, dgram);
    setenv("MAILRAIL_FLOWCTL", policy, 1);
    setenv("MAILRAIL_RANK_CREDITS", "4", 1);
    setenv("MAILRAIL_NODE_CREDITS", "4", 1);
    setenv("MAILRAIL_FAULTY_FAULT", fault, 1);
    setenv("MAILRAIL_FAULTY_EVERY", every, 1);
    setenv("MAILRAIL_FAULTY_COPIES", copies, 1);
    /* Two nodes of one rank: node credits cross nodes as rank credits do. */
    setenv("MAILRAIL_RANKS_PER_NODE", "1", 1);
    /* The log's errors from here on are the fault's, on purpose: finish() checks them. */
    capture_start(policy, fault);
    init_on_world();
}

static void init_faulty_every(const char *policy, const char *fault, const char *copies,
                              const char *every)
{
    init_faulty_pool(policy, fault, copies, every, SLOTS, "256");
}

static void init_faulty(const char *policy, const char *fault, const char *copies)
{
    init_faulty_every(policy, fault, copies, "1");
}

/* Rank 1 sends `n` checked messages to rank 0 and waits until they all left. */
static void send_to_zero(int n)
{
    for (int seq = 0; seq < n; seq++) {
        void *buf = NULL;
        double start = now_s();
        while (mr_reserve(&buf) == MR_AGAIN) {
            (void)mr_wait(1);
            ck_assert(now_s() - start < WAIT_LIMIT_S);
        }
        fill_message(buf, 64, 1, 0, (uint32_t)seq);
        ck_assert_int_eq(mr_send(buf, 64, 0), MR_OK);
    }
    /* Until every message left (not mr_quiesce(): duplicates break its count). */
    mr_stats_t st = {.size = sizeof(st)};
    double start = now_s();
    for (;;) {
        ck_assert_int_eq(mr_get_stats(&st), MR_OK);
        if (st.deferred_now == 0) break;
        (void)mr_wait(1);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%llu sends never left",
                      (unsigned long long)st.deferred_now);
    }
}

/*
 * Rank 0 receives for `hold_s` seconds without releasing (when `hold`), then
 * releasing, until `expect` messages came, checking each. Returns its stats.
 */
static mr_stats_t receive_on_zero(int expect, bool hold)
{
    void *held[64];
    int nheld = 0, got = 0;
    double start = now_s();
    mr_message_t m;
    mr_stats_t st = {.size = sizeof(st)};

    while (got < expect) {
        bool holding = hold && now_s() - start < 0.3;
        if (!holding) {
            while (nheld > 0) ck_assert_int_eq(mr_release(held[--nheld]), MR_OK);
        }
        if (mr_receive(&m) == MR_OK) {
            ck_assert_uint_lt(check_message(&m), SENDS * 4); /* The most any test sends. */
            got++;
            if (holding && nheld < 64) held[nheld++] = m.data;
            else ck_assert_int_eq(mr_release(m.data), MR_OK);
            continue;
        }
        (void)mr_wait(1);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "%d of %d messages came", got, expect);
    }
    while (nheld > 0) ck_assert_int_eq(mr_release(held[--nheld]), MR_OK);
    ck_assert_int_eq(mr_get_stats(&st), MR_OK);
    return st;
}

/* Finalize (the breach is the point), then check what each rank logged against `want`. */
static void finish(const expected_line_t *want, size_t nwant)
{
    MPI_Barrier(MPI_COMM_WORLD);
    ck_assert_int_eq(mr_finalize(), MR_OK);
    capture_check(want, nwant);
    unsetenv("MAILRAIL_FAULTY_FAULT");
    unsetenv("MAILRAIL_RANK_CREDITS");
    unsetenv("MAILRAIL_NODE_CREDITS");
    unsetenv("MAILRAIL_RANKS_PER_NODE");
}

/* The check the other tests end with must fail on `st`: shown, with its reason. */
static void expect_breach(const mr_stats_t *st, const char *policy)
{
    char why[512];

    ck_assert_ptr_nonnull(tool_invariant_breach(st, policy, why, sizeof(why)));
    fprintf(stderr, "%s: %s\n", policy, why);
}

/*
 * Under `fault`, which breaks no promise: 32 messages sent, each received
 * once (some held, released in any order), and no count rises.
 */
static void expect_nothing_broken(const char *fault)
{
    char why[512];

    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty(policies[p], fault, "1");
        if (world_rank == 1) send_to_zero(SENDS * 4);
        mr_stats_t st = world_rank == 0 ? receive_on_zero(SENDS * 4, true) : (mr_stats_t){0};
        if (world_rank == 0) {
            ck_assert_uint_eq(st.messages_received, SENDS * 4);
            ck_assert_msg(tool_invariant_breach(&st, policies[p], why, sizeof(why)) == NULL, "%s", why);
            ck_assert_uint_le(st.peak_recv_inflight, st.recv_granted);
        }
        finish(NONE_LOGGED);
    }
}

START_TEST(an_honest_double_breaks_nothing)
{
    expect_nothing_broken("none");
}
END_TEST

/* Three extra copies of every message: uncredited, and beyond the grant while held. */
START_TEST(duplicates_are_uncredited_and_beyond_the_grant)
{
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty(policies[p], "duplicate", "3");
        if (world_rank == 1) send_to_zero(SENDS);
        mr_stats_t st = world_rank == 0 ? receive_on_zero(SENDS * 4, true) : (mr_stats_t){0};
        if (world_rank == 0) {
            ck_assert_uint_gt(st.breach_uncredited, 0);
            ck_assert_uint_le(st.breach_uncredited, SENDS * 3);
            ck_assert_uint_gt(st.breach_beyond_grant, 0);
            ck_assert_uint_gt(st.peak_recv_inflight, st.recv_granted);
            expect_breach(&st, policies[p]);
        }
        /* Every copy is uncredited; the receiver returns credit for each, more than was sent. */
        const expected_line_t want[] = {
            {0, UNCREDITED, 1, SENDS * 3},
            {1, p == 0 ? OVER_RETURNED_RANK : OVER_RETURNED_NODE, 0, SENDS * 3},
        };
        finish(want, 2);
    }
}
END_TEST

/*
 * Duplicates make the job receive more than it sent, so quiescence can never
 * be reached: mr_quiesce() says so on every rank, in the same round, instead
 * of returning MR_AGAIN forever.
 */
START_TEST(duplicates_fail_quiescence)
{
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty(policies[p], "duplicate", "1");
        if (world_rank == 1) send_to_zero(SENDS);
        if (world_rank == 0) (void)receive_on_zero(SENDS * 2, false);
        mr_status_t st;
        mr_message_t m;
        double start = now_s();
        while ((st = mr_quiesce()) == MR_AGAIN) {
            while (mr_receive(&m) == MR_OK) ck_assert_int_eq(mr_release(m.data), MR_OK);
            ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "mr_quiesce() waited for %.0f s",
                          now_s() - start);
        }
        ck_assert_int_eq(st, MR_ERR_TRANSPORT);
        /*
         * Both ranks say why quiescence failed, with the sums, 8 sent and 16
         * received. Whether a copy finds the sender's credits all spent, and so
         * is logged as uncredited, depends on timing here (one copy each).
         */
        const expected_line_t want[] = {
            {0, UNCREDITED, 0, SENDS},
            {1, p == 0 ? OVER_RETURNED_RANK : OVER_RETURNED_NODE, 0, SENDS},
            {0, QUIESCE_DUPLICATES("0"), 1, 1},
            {1, QUIESCE_DUPLICATES("1"), 1, 1},
        };
        finish(want, 4);
    }
}
END_TEST

/* A thousand credits too many on every return: the sender counts them. */
START_TEST(over_returns_are_counted)
{
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty(policies[p], "over_return", "1");
        if (world_rank == 1) send_to_zero(SENDS * 4);
        else (void)receive_on_zero(SENDS * 4, false);
        /* The last returns may still be on their way: wait for them. */
        mr_stats_t st = {.size = sizeof(st)};
        double start = now_s();
        do {
            (void)mr_wait(1);
            ck_assert_int_eq(mr_get_stats(&st), MR_OK);
        } while (world_rank == 1 && st.breach_over_returned == 0 && now_s() - start < 5.0);
        if (world_rank == 1) {
            /* Each return: 1,000 more than sent, the sender holding at most 4 (or 8) less. */
            ck_assert_uint_ge(st.breach_over_returned, 1000 - 8);
            expect_breach(&st, policies[p]);
        }
        /* The sender detects the excess; what it then sends beyond the grant, the receiver does. */
        const expected_line_t want[] = {
            {1, p == 0 ? OVER_RETURNED_RANK : OVER_RETURNED_NODE, 1, SENDS * 4},
            {0, UNCREDITED, 0, SENDS * 4},
        };
        finish(want, 2);
    }
}
END_TEST

/* Every message delivered a second time into its filled slot: refused and counted. */
START_TEST(unacquired_slots_are_counted)
{
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty(policies[p], "unacquired", "1");
        if (world_rank == 1) send_to_zero(SENDS);
        mr_stats_t st = world_rank == 0 ? receive_on_zero(SENDS, false) : (mr_stats_t){0};
        if (world_rank == 0) {
            /* Each message once, as sent (receive_on_zero checked them), and each refusal counted. */
            ck_assert_uint_eq(st.messages_received, SENDS);
            ck_assert_uint_eq(st.breach_unacquired, SENDS);
            ck_assert_uint_eq(st.breach_uncredited, 0);
            expect_breach(&st, policies[p]);
        }
        const expected_line_t want[] = {
            {0, "mailrail\\[0\\] error: internal: substrate faulty delivered a buffer it did not acquire.",
             SENDS, SENDS},
        };
        finish(want, 1);
    }
}
END_TEST

/*
 * Every message arrives as a batch of one frame, held in part and released
 * in any order: each once, as sent, and nothing broken under either policy.
 */
START_TEST(batches_break_nothing)
{
    expect_nothing_broken("batch");
}
END_TEST

/*
 * Every second message arrives as a malformed batch: the receiver drops it
 * (and logs it) and gets the others, each once; the dropped ones' credits
 * come back, or the sender, with 4 credits for 32 messages, would stall.
 */
START_TEST(malformed_batches_are_dropped_and_their_credits_return)
{
    char why[512];

    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        init_faulty_every(policies[p], "bad_batch", "1", "2");
        if (world_rank == 1) send_to_zero(SENDS * 4);
        mr_stats_t st = world_rank == 0 ? receive_on_zero(SENDS * 2, false) : (mr_stats_t){0};
        if (world_rank == 0) {
            /* Nothing more comes: the malformed half is gone, not late. */
            mr_message_t m;
            double start = now_s();
            while (now_s() - start < 0.2) {
                ck_assert_int_eq(mr_receive(&m) == MR_OK, 0);
                (void)mr_wait(1);
            }
            ck_assert_int_eq(mr_get_stats(&st), MR_OK);
            ck_assert_uint_eq(st.messages_received, SENDS * 2);
            ck_assert_msg(tool_invariant_breach(&st, policies[p], why, sizeof(why)) == NULL, "%s", why);
        }
        const expected_line_t want[] = {
            {0, "mailrail\\[0\\] error: Rank 1 sent a malformed batch of 72 bytes; it is dropped.",
             SENDS * 2, SENDS * 2},
        };
        finish(want, 1);
    }
}
END_TEST

/*
 * A pool larger than the grant (32 slots, 8 credits granted), and a substrate
 * that delivers every message as a batch of 4 copies in one slot: the slots
 * in use never exceed the grant, but the messages in them do, since each
 * frame of a batch counts as one message; the pool bound reports it.
 */
START_TEST(batches_beyond_the_grant_count_per_frame)
{
    for (size_t p = 0; p < sizeof(policies) / sizeof(policies[0]); p++) {
        /* 512 bytes: room for the 4 frames of 72 bytes of a message of 64. */
        init_faulty_pool(policies[p], "fat_batch", "3", "1", "32", "512");
        if (world_rank == 1) send_to_zero(SENDS);
        mr_stats_t st = world_rank == 0 ? receive_on_zero(SENDS * 4, true) : (mr_stats_t){0};
        if (world_rank == 0) {
            fprintf(stderr, "%s: %llu messages in flight at most in %llu slots, %llu granted, "
                    "%llu arrivals beyond the grant\n", policies[p],
                    (unsigned long long)st.peak_recv_inflight,
                    (unsigned long long)st.peak_recv_slots_in_use,
                    (unsigned long long)st.recv_granted,
                    (unsigned long long)st.breach_beyond_grant);
            ck_assert_uint_eq(st.messages_received, SENDS * 4);
            /* The pool could hold what was sent beyond the grant: the bound is not the pool's. */
            ck_assert_uint_lt(st.recv_granted, 32);
            ck_assert_uint_le(st.peak_recv_slots_in_use, st.recv_granted);
            ck_assert_uint_gt(st.peak_recv_inflight, st.recv_granted);
            ck_assert_uint_gt(st.breach_beyond_grant, 0);
            expect_breach(&st, policies[p]);
        }
        /* Each frame spends a credit: the copies are uncredited, and their returns too many. */
        const expected_line_t want[] = {
            {0, UNCREDITED, 1, SENDS * 3},
            {1, p == 0 ? OVER_RETURNED_RANK : OVER_RETURNED_NODE, 0, SENDS * 3},
        };
        finish(want, 2);
    }
}
END_TEST

static Suite *breaches_suite(void)
{
    Suite *s = suite_create("breaches");
    TCase *tc = tcase_create("faulty");

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, an_honest_double_breaks_nothing);
    tcase_add_test(tc, duplicates_are_uncredited_and_beyond_the_grant);
    tcase_add_test(tc, duplicates_fail_quiescence);
    tcase_add_test(tc, over_returns_are_counted);
    tcase_add_test(tc, unacquired_slots_are_counted);
    tcase_add_test(tc, batches_break_nothing);
    tcase_add_test(tc, malformed_batches_are_dropped_and_their_credits_return);
    tcase_add_test(tc, batches_beyond_the_grant_count_per_frame);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return run_suite_on_all_ranks(argc, argv, breaches_suite);
}
