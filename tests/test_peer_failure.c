/*
 * A peer that dies turns into an error, not a hang. Run under
 * `mpiexec -disable-auto-cleanup -n 3`: rank 1 sends five messages to rank 0,
 * stops receiving while ranks 0 and 2 send to it until their send pools are
 * full (sends in flight to it, or waiting for its credits), and is then
 * killed with SIGKILL, without finalizing. Ranks 0 and 2 must get
 * MR_ERR_PEER_FAILED from mr_receive() within a few seconds, keep every
 * message that arrived before the failure, get their send buffers back and
 * exchange several send pools' worth of messages with each other, and get
 * MR_ERR_PEER_FAILED (not a hang) from mr_quiesce() and mr_finalize(). Each
 * survivor prints "survivor <rank>: ok", and the victim's launcher prints
 * "victim 1: killed by SIGKILL", for tests/run_peer_failure.sh to check.
 *
 * MPICH's hydra kills the whole job when a process it started dies of a
 * signal, even with -disable-auto-cleanup, while it lets the others run on
 * after an exit. So every process that mpiexec starts forks at once, before
 * MPI_Init: the child is the rank (it inherits the PMI environment and
 * socket), and the parent only waits for it and then exits normally, with
 * status 0 when the child finished well or, on the victim only, died of the
 * expected SIGKILL. Hydra sees a normal exit; the peers see what a crash
 * looks like: the kernel closes the dead process's sockets with nothing
 * flushed or shut down.
 */
#include "mailrail.h"

#include <check.h>
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DETECT_LIMIT_S 5.0
#define VICTIM 1
/* In the `gap` mode ranks 1, 2 and 3 die; in the others rank VICTIM only. */
static bool pf_gap;

static bool pf_is_victim(int rank)
{
    return pf_gap ? rank >= 1 && rank <= 3 : rank == VICTIM;
}
/* A small send pool, so that the flood fills it and the exchange needs it back. */
#define SEND_SLOTS "32"
#define EXCHANGE 128

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void send_byte(int dest, uint8_t value, size_t length)
{
    void *buf;
    double start = now_s();

    while (mr_reserve(&buf) != MR_OK) {
        mr_message_t m;
        if (mr_receive(&m) == MR_OK) mr_release(m.data);
        ck_assert(now_s() - start < DETECT_LIMIT_S);
    }
    memset(buf, value, length);
    ck_assert_int_eq(mr_send(buf, length, dest), MR_OK);
}

/*
 * Checks and releases one message at a survivor: one of the victim's five
 * (rank 0 only, in order), or the next of the other survivor's EXCHANGE
 * messages (each 16 bytes of its sequence number, mod 256).
 */
static void take_message(mr_message_t *m, int rank, int other, int *got, int *got_other)
{
    if (m->source == VICTIM) {
        ck_assert_int_eq(rank, 0);
        ck_assert_uint_eq(m->length, 32);
        ck_assert_uint_eq(((uint8_t *)m->data)[31], 100 + *got);
        (*got)++;
    } else {
        ck_assert_int_eq(m->source, other);
        ck_assert_int_lt(*got_other, EXCHANGE);
        ck_assert_uint_eq(m->length, 16);
        for (int i = 0; i < 16; i++) ck_assert_uint_eq(((uint8_t *)m->data)[i], *got_other % 256);
        (*got_other)++;
    }
    ck_assert_int_eq(mr_release(m->data), MR_OK);
}

/*
 * Sends to the victim, which no longer receives, until the send pool stays
 * empty for 0.3 s: every send buffer is then in flight to it or waits for its
 * credits. Messages that arrive meanwhile go to take_message(). Returns how
 * many were sent.
 */
static int flood_victim(int rank, int other, int *got, int *got_other)
{
    double idle_since = now_s();
    int sent = 0;
    void *buf;

    while (now_s() - idle_since < 0.3) {
        mr_message_t m;
        if (mr_receive(&m) == MR_OK) take_message(&m, rank, other, got, got_other);
        if (mr_reserve(&buf) != MR_OK) continue;
        memset(buf, 0x5a, 64);
        ck_assert_int_eq(mr_send(buf, 64, VICTIM), MR_OK);
        sent++;
        idle_since = now_s();
    }
    return sent;
}

/* Whether mr_failed_ranks() lists `victim`; *n is how many it lists. */
static bool failed_includes(int *failed, int max, int *n, int victim)
{
    ck_assert_int_eq(mr_failed_ranks(failed, max, n), MR_OK);
    for (int i = 0; i < *n && i < max; i++) {
        if (failed[i] == victim) return true;
    }
    return false;
}

/* mr_failed_ranks() names exactly `victim`. */
static void expect_failed_ranks(int victim)
{
    int failed[4] = {-1, -1, -1, -1}, n = -1;

    ck_assert_int_eq(mr_failed_ranks(failed, 4, &n), MR_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(failed[0], victim);
    ck_assert_int_eq(failed[1], -1);
}

START_TEST(survivors_see_the_failure)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int rank, got = 0, other, got_other = 0;
    mr_message_t m;
    mr_status_t st;
    double start, detected;

    setenv("MAILRAIL_SEND_SLOTS", SEND_SLOTS, 1);
    ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_OK);
    rank = mr_rank();
    ck_assert_int_eq(mr_size(), 3);
    if (rank == VICTIM) {
        for (int i = 0; i < 5; i++) send_byte(0, (uint8_t)(100 + i), 32);
        /* Let the messages leave, then stop receiving while the others flood us. */
        start = now_s();
        while (now_s() - start < 0.2) {
            if (mr_receive(&m) == MR_OK) mr_release(m.data);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        /* Die without a word, as a crash would. */
        kill(getpid(), SIGKILL);
        _exit(7); /* Not reached: the launcher fails the test if the child exits. */
    }
    other = rank == 0 ? 2 : 0;
    printf("rank %d: %d messages sent to rank %d before it died\n", rank,
           flood_victim(rank, other, &got, &got_other), VICTIM);
    MPI_Barrier(MPI_COMM_WORLD);
    start = now_s();
    while ((st = mr_receive(&m)) != MR_ERR_PEER_FAILED) {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "no error %.1f s after the peer died",
                      now_s() - start);
        if (st == MR_OK) {
            /* The other survivor may have seen the failure first and greeted us already. */
            take_message(&m, rank, other, &got, &got_other);
        } else {
            ck_assert_int_eq(st, MR_AGAIN);
        }
    }
    detected = now_s() - start;
    printf("rank %d: peer failure reported after %.3f s\n", rank, detected);
    expect_failed_ranks(VICTIM);
    /*
     * Sending to the dead rank is refused, every time, without a log line
     * each time (run_peer_failure.sh counts them); the buffer stays the caller's.
     */
    void *buf;
    start = now_s();
    while (mr_reserve(&buf) != MR_OK) {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "no send buffer came back");
        if (mr_receive(&m) == MR_OK) take_message(&m, rank, other, &got, &got_other);
    }
    for (int i = 0; i < 1000; i++) ck_assert_int_eq(mr_send(buf, 8, VICTIM), MR_ERR_PEER_FAILED);
    ck_assert_int_eq(mr_release(buf), MR_OK);

    /*
     * The survivors still talk to each other, with more messages than a send
     * pool holds (the buffers stuck on the dead rank came back), and messages
     * from the dead rank that arrived before the failure are all kept.
     */
    bool other_left = false;
    int sent = 0;
    start = now_s();
    while (got_other < EXCHANGE || sent < EXCHANGE) {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "sent %d, received %d of %d", sent,
                      got_other, EXCHANGE);
        if (sent < EXCHANGE && mr_reserve(&buf) == MR_OK) {
            memset(buf, sent % 256, 16);
            ck_assert_int_eq(mr_send(buf, 16, other), MR_OK);
            sent++;
        }
        st = mr_receive(&m);
        if (st == MR_AGAIN) continue;
        /* The other survivor may already have finalized and left: that is reported too. */
        if (st == MR_ERR_PEER_FAILED && !other_left) {
            other_left = true;
            continue;
        }
        ck_assert_int_eq(st, MR_OK);
        take_message(&m, rank, other, &got, &got_other);
    }
    ck_assert_int_eq(got, rank == 0 ? 5 : 0);

    ck_assert_int_eq(mr_quiesce(), MR_ERR_PEER_FAILED);
    start = now_s();
    ck_assert_int_eq(mr_finalize(), MR_ERR_PEER_FAILED);
    ck_assert(now_s() - start < DETECT_LIMIT_S);
    ck_assert_int_eq(mr_rank(), -1);
}
END_TEST

/* Until this rank holds the two connections to its ring neighbours; returns its peers. */
static uint64_t wait_for_the_ring(void)
{
    mr_stats_t stats = {.size = sizeof(stats)};
    double start = now_s();

    do {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "the ring did not connect");
        ck_assert_int_eq(mr_wait(10) >= 0, 1);
        ck_assert_int_eq(mr_get_stats(&stats), MR_OK);
    } while (stats.peers_connected < 2);
    return stats.peers_connected;
}

/*
 * The silent death (`test_peer_failure silent`, 5 ranks): nobody ever sends
 * to the victim, so only its two neighbours on the ring that watches for
 * failures (ranks 0 and 2) hold a connection to it. Ranks 3 and 4 must still
 * learn of its death, from the failure notices passed around that ring, and
 * get MR_ERR_PEER_FAILED from mr_receive(), mr_quiesce() and mr_finalize()
 * instead of waiting for it in the quiescence wave.
 */
START_TEST(survivors_learn_of_a_silent_death)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    mr_message_t m;
    mr_status_t st;
    double start;

    ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_OK);
    ck_assert_int_eq(mr_size(), 5);
    /* The ring is up: each rank holds its two neighbours, and no one else. */
    ck_assert_uint_eq(wait_for_the_ring(), 2);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mr_rank() == VICTIM) {
        kill(getpid(), SIGKILL);
        _exit(7);
    }
    start = now_s();
    while ((st = mr_receive(&m)) != MR_ERR_PEER_FAILED) {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "no error %.1f s after the peer died",
                      now_s() - start);
        ck_assert_int_eq(st, MR_AGAIN);
        mr_wait(10);
    }
    printf("rank %d: a failure reported after %.3f s\n", mr_rank(), now_s() - start);
    /*
     * That failure may be another survivor's leaving (it finalized first):
     * ranks 3 and 4 must learn of the victim all the same, from notices only.
     */
    for (int failed[5], n; !failed_includes(failed, 5, &n, VICTIM);) {
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "rank %d: %d failures, none of rank %d",
                      mr_rank(), n, VICTIM);
        st = mr_receive(&m);
        ck_assert(st == MR_AGAIN || st == MR_ERR_PEER_FAILED);
        mr_wait(10);
    }
    printf("rank %d: the silent death known after %.3f s\n", mr_rank(), now_s() - start);
    ck_assert_int_eq(mr_quiesce(), MR_ERR_PEER_FAILED);
    start = now_s();
    ck_assert_int_eq(mr_finalize(), MR_ERR_PEER_FAILED);
    ck_assert(now_s() - start < DETECT_LIMIT_S);
}
END_TEST

/*
 * Three deaths in a row on the ring (`test_peer_failure gap`, 6 ranks): ranks
 * 1, 2 and 3 die at once, and nobody ever sends to them. Rank 0 watches rank
 * 1 and rank 4 watches rank 3, so they see those deaths; rank 2 was watched
 * by the dead only. Rank 0 learns of it when its notice for rank 1 goes to
 * the next rank on the ring, rank 2, and the connection is refused: no
 * listener there. Every survivor must name all three within a few seconds,
 * far below MAILRAIL_TIMEOUT (60 s), after which an unanswered dial gives up.
 */
START_TEST(survivors_learn_of_a_gap_in_the_ring)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int failed[6], n;
    mr_message_t m;
    double start;

    ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_OK);
    ck_assert_int_eq(mr_size(), 6);
    wait_for_the_ring();
    MPI_Barrier(MPI_COMM_WORLD);
    if (pf_is_victim(mr_rank())) {
        kill(getpid(), SIGKILL);
        _exit(7);
    }
    start = now_s();
    for (;;) {
        mr_status_t st = mr_receive(&m);
        bool all = true;

        ck_assert(st == MR_AGAIN || st == MR_ERR_PEER_FAILED);
        for (int v = 1; v <= 3; v++) all = all && failed_includes(failed, 6, &n, v);
        if (all) break;
        ck_assert_msg(now_s() - start < DETECT_LIMIT_S, "rank %d: %d failures after %.1f s, "
                      "not all of ranks 1, 2 and 3", mr_rank(), n, now_s() - start);
        mr_wait(10);
    }
    /* More may be named: a survivor that finalized first has left the job. */
    printf("rank %d: the three deaths known after %.3f s\n", mr_rank(), now_s() - start);
    ck_assert_int_eq(mr_quiesce(), MR_ERR_PEER_FAILED);
    ck_assert_int_eq(mr_finalize(), MR_ERR_PEER_FAILED);
}
END_TEST

/*
 * A death during mr_connect() (`test_peer_failure connect`, 3 ranks): every
 * pair is connected by a first call, then the victim dies as the ranks call
 * it again. The survivors return MR_ERR_PEER_FAILED within seconds, not at
 * MAILRAIL_TIMEOUT: their connections to the victim report its death while
 * they wait for the others, and they stop waiting for a rank that will never
 * join.
 */
START_TEST(survivors_leave_mr_connect)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int all[3] = {0, 1, 2}, failed[4], n;
    double start;

    ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_OK);
    ck_assert_int_eq(mr_size(), 3);
    ck_assert_int_eq(mr_connect(all, 3), MR_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mr_rank() == VICTIM) {
        kill(getpid(), SIGKILL);
        _exit(7);
    }
    start = now_s();
    ck_assert_int_eq(mr_connect(all, 3), MR_ERR_PEER_FAILED);
    printf("rank %d: mr_connect() failed after %.3f s\n", mr_rank(), now_s() - start);
    ck_assert(now_s() - start < DETECT_LIMIT_S);
    ck_assert(failed_includes(failed, 4, &n, VICTIM));
    /* Every later collective fails at once the same way. */
    ck_assert_int_eq(mr_connect(NULL, 0), MR_ERR_PEER_FAILED);
    ck_assert_int_eq(mr_quiesce(), MR_ERR_PEER_FAILED);
    ck_assert_int_eq(mr_finalize(), MR_ERR_PEER_FAILED);
}
END_TEST

static pid_t pf_child;

/* Passes a signal meant for the rank on to it. */
static void pf_forward(int sig)
{
    kill(pf_child, sig);
}

/*
 * Forks the rank off the process that mpiexec started. Returns in the child;
 * the parent waits for it and exits 0 if it exited with 0 or, when this is
 * the victim (PMI_RANK, set by hydra), if it died of SIGKILL. Meanwhile the
 * parent forwards the signals hydra sends to the rank: SIGUSR1 above all,
 * which hydra (with -disable-auto-cleanup) sends to every process when one
 * dies, which MPICH handles in the rank, and whose default action would kill
 * the parent.
 */
static void pf_fork_rank(void)
{
    const char *pmi_rank = getenv("PMI_RANK");
    bool victim = pmi_rank != NULL && pf_is_victim(atoi(pmi_rank));
    struct sigaction sa = {.sa_handler = pf_forward, .sa_flags = SA_RESTART};
    int status;

    pf_child = fork();
    if (pf_child < 0) {
        perror("fork");
        exit(1);
    }
    if (pf_child == 0) {
        /* If the launcher is killed (mpiexec's timeout), the rank must not outlive it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        return;
    }
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    while (waitpid(pf_child, &status, 0) < 0) {
        if (errno != EINTR) {
            perror("waitpid");
            _exit(1);
        }
    }
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        bool expected = victim && sig == SIGKILL;

        printf("%s %s: killed by %s%s\n", victim ? "victim" : "rank", pmi_rank ? pmi_rank : "?",
               sig == SIGKILL ? "SIGKILL" : strsignal(sig), expected ? "" : " (unexpected)");
        _exit(expected ? 0 : 1);
    }
    if (victim) printf("victim %s: exited instead of dying of SIGKILL\n", pmi_rank);
    _exit(!victim && WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

int main(int argc, char **argv)
{
    Suite *s = suite_create("peer-failure");
    TCase *tc = tcase_create("sigkill");
    SRunner *sr;
    int rank, failed;

    setvbuf(stdout, NULL, _IONBF, 0);
    pf_gap = argc > 1 && strcmp(argv[1], "gap") == 0;
    pf_fork_rank();
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc > 1 && strcmp(argv[1], "silent") == 0) {
        tcase_add_test(tc, survivors_learn_of_a_silent_death);
    } else if (pf_gap) {
        tcase_add_test(tc, survivors_learn_of_a_gap_in_the_ring);
    } else if (argc > 1 && strcmp(argv[1], "connect") == 0) {
        tcase_add_test(tc, survivors_leave_mr_connect);
    } else {
        tcase_add_test(tc, survivors_see_the_failure);
    }
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed == 0) printf("survivor %d: ok\n", rank);
    /* MPI cannot finalize with a dead rank in the job: leave without it. */
    _exit(failed ? 1 : 0);
}
