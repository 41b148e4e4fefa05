/*
 * Helpers shared by the multi-rank tests (see mr_test.h).
 */
#include "mr_test.h"
#include "tool_common.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int world_rank, world_size;

void mr_test_assert_failed(const char *file, int line, const char *expr, const char *msg, ...)
{
    int mpi_up = 0, mpi_down = 0;
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "rank %d: %s:%d: %s", world_rank, file, line, expr);
    if (msg != NULL) {
        fputs(": ", stderr);
        va_start(ap, msg);
        vfprintf(stderr, msg, ap);
        va_end(ap);
    }
    fputs("\n", stderr);
    fflush(stderr);
    MPI_Initialized(&mpi_up);
    MPI_Finalized(&mpi_down);
    if (mpi_up && !mpi_down) MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}


static uint8_t pattern_byte(int source, uint32_t seq, size_t i)
{
    return (uint8_t)(source * 31 + seq * 7 + i * 13 + 1);
}

/* Fills a message of `length` bytes (>= sizeof header, or 0 for an empty one). */
void fill_message(void *buf, size_t length, int source, int dest, uint32_t seq)
{
    msg_header_t h = {source, dest, seq, (uint32_t)length};
    uint8_t *p = buf;

    if (length < sizeof(h)) return;
    memcpy(p, &h, sizeof(h));
    for (size_t i = sizeof(h); i < length; i++) p[i] = pattern_byte(source, seq, i);
}

size_t first_corrupt_byte(const mr_message_t *m, const msg_header_t *h)
{
    const uint8_t *p = m->data;

    for (size_t i = sizeof(*h); i < m->length; i++) {
        if (p[i] != pattern_byte(h->source, h->seq, i)) return i;
    }
    return m->length;
}

/* Checks a received message against its header and the sender. Returns its seq. */
uint32_t check_message(const mr_message_t *m)
{
    msg_header_t h;
    size_t bad;

    ck_assert_uint_ge(m->length, sizeof(h));
    memcpy(&h, m->data, sizeof(h));
    ck_assert_int_eq(h.source, m->source);
    ck_assert_int_eq(h.dest, mr_rank());
    ck_assert_int_lt(h.source, world_size);
    ck_assert_uint_eq(h.length, m->length);
    /* One assertion per message, not per byte: Check records every assertion it passes. */
    bad = first_corrupt_byte(m, &h);
    ck_assert_msg(bad == m->length, "byte %zu of message %u from %d is corrupt", bad, h.seq,
                  h.source);
    return h.seq;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint32_t test_count(uint32_t n)
{
    static uint32_t shrink;

    if (shrink == 0) {
        const char *v = getenv("MR_TEST_SHRINK");
        char *end = NULL;
        unsigned long d = v ? strtoul(v, &end, 10) : 1;

        if (v && (end == v || *end != '\0' || d < 1 || d > 1000000)) {
            fprintf(stderr, "MR_TEST_SHRINK='%s': expected a whole number from 1\n", v);
            abort();
        }
        shrink = (uint32_t)d;
    }
    return n / shrink > 0 ? n / shrink : 1;
}

void setup_env(const char *send_slots, const char *recv_slots, const char *dgram)
{
    if (send_slots) setenv("MAILRAIL_SEND_SLOTS", send_slots, 1);
    else unsetenv("MAILRAIL_SEND_SLOTS");
    if (recv_slots) setenv("MAILRAIL_RECV_SLOTS", recv_slots, 1);
    else unsetenv("MAILRAIL_RECV_SLOTS");
    if (dgram) setenv("MAILRAIL_DATAGRAM_SIZE", dgram, 1);
    else unsetenv("MAILRAIL_DATAGRAM_SIZE");
}

void init_on_world(void)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    ck_assert_int_eq(mr_init_mpi(&comm, sizeof(comm)), MR_OK);
    ck_assert_int_eq(mr_rank(), world_rank);
    ck_assert_int_eq(mr_size(), world_size);
}


void tally_init(tally_t *t, uint32_t per_source)
{
    t->seen = calloc((size_t)world_size * per_source, 1);
    t->per_source = per_source;
    t->count = 0;
    ck_assert_ptr_nonnull(t->seen);
}

void tally_mark(tally_t *t, int source, uint32_t seq)
{
    ck_assert_uint_lt(seq, t->per_source);
    uint8_t *slot = &t->seen[(size_t)source * t->per_source + seq];
    ck_assert_msg(*slot == 0, "message %u from %d delivered twice", seq, source);
    *slot = 1;
    t->count++;
}

/* Receives whatever is there, checking each message; returns how many arrived. */
int drain(tally_t *t)
{
    mr_message_t m;
    int n = 0;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        tally_mark(t, m.source, check_message(&m));
        n++;
        ck_assert_int_eq(mr_release(m.data), MR_OK);
    }
    ck_assert_int_eq(st, MR_AGAIN);
    return n;
}

/* Reserves a buffer, receiving while backpressured. */
void *reserve_or_progress(tally_t *t)
{
    void *buf = NULL;
    double start = now_s();
    mr_status_t st;

    while ((st = mr_reserve(&buf)) == MR_AGAIN) {
        drain(t);
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "backpressure never released");
    }
    ck_assert_int_eq(st, MR_OK);
    ck_assert_ptr_nonnull(buf);
    return buf;
}

void quiesce_with(void (*receive)(void *arg), void *arg)
{
    double start = now_s();
    mr_status_t st;

    do {
        receive(arg);
        st = mr_quiesce();
        ck_assert_msg(now_s() - start < WAIT_LIMIT_S, "quiescence never reached");
    } while (st == MR_AGAIN);
    ck_assert_int_eq(st, MR_OK);
}

static void drain_tally(void *t)
{
    drain(t);
}

void quiesce(tally_t *t)
{
    quiesce_with(drain_tally, t);
}

/*
 * Sends `per_dest` messages from this rank to each rank in `dests` with
 * varying lengths, receiving after every `burst` of them (and whenever
 * backpressured).
 */
void exchange_bursts(const int *dests, int ndest, uint32_t per_dest, unsigned burst, tally_t *t)
{
    size_t dgram = mr_datagram_size();
    unsigned sent = 0;

    for (uint32_t seq = 0; seq < per_dest; seq++) {
        for (int k = 0; k < ndest; k++) {
            void *buf = reserve_or_progress(t);
            size_t len = sizeof(msg_header_t) + (seq * 37 + (uint32_t)k) %
                                                    (dgram - sizeof(msg_header_t) + 1);
            fill_message(buf, len, world_rank, dests[k], seq);
            ck_assert_int_eq(mr_send(buf, len, dests[k]), MR_OK);
            if (++sent % burst == 0) drain(t);
        }
    }
}

void exchange(const int *dests, int ndest, uint32_t per_dest, tally_t *t)
{
    exchange_bursts(dests, ndest, per_dest, 1, t);
}

void expect_all_from(const tally_t *t, const int *sources, int nsrc, uint32_t per_src)
{
    for (int k = 0; k < nsrc; k++) {
        for (uint32_t seq = 0; seq < per_src; seq++) {
            ck_assert_msg(t->seen[(size_t)sources[k] * t->per_source + seq] == 1,
                          "message %u from %d never arrived", seq, sources[k]);
        }
    }
    ck_assert_uint_eq(t->count, (uint64_t)nsrc * per_src);
}

int run_suite_on_all_ranks(int argc, char **argv, Suite *(*make_suite)(void))
{
    SRunner *sr;
    int failed, any_failed = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_size > MR_TEST_MAX_RANKS) {
        fprintf(stderr, "These tests run on at most %d ranks.\n", MR_TEST_MAX_RANKS);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    sr = srunner_create(make_suite());
    /* Collective tests cannot run in forked children. */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, world_rank == 0 ? CK_NORMAL : CK_SILENT);
    failed = srunner_ntests_failed(sr);
    /*
     * A filter (CK_RUN_SUITE, CK_RUN_CASE; Check 0.15 has none per test) that
     * matches nothing must not pass.
     */
    if (srunner_ntests_run(sr) == 0) {
        if (world_rank == 0) fprintf(stderr, "No test ran: a run that checks nothing fails.\n");
        failed = 1;
    }
    srunner_free(sr);
    /* Every rank's verdict counts. */
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed && world_rank == 0 && failed == 0) {
        fprintf(stderr, "A test failed on another rank.\n");
    }
    MPI_Finalize();
    return any_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

void check_invariants(void)
{
    mr_stats_t st = {.size = sizeof(st)};
    char why[512];

    ck_assert_int_eq(mr_get_stats(&st), MR_OK);
    const char *breach = tool_invariant_breach(&st, mr_flowctl_name(), why, sizeof(why));
    ck_assert_msg(breach == NULL, "%s", breach);
    /*
     * The messages held now, each frame of a batch counted, against the grant
     * (the peak is tool_invariant_breach()'s): a pool larger than the grant
     * would not catch what a substrate delivers beyond it
     * (test_breaches.c, batches_beyond_the_grant_count_per_frame).
     */
    if (strcmp(mr_flowctl_name(), "none") != 0) {
        ck_assert_msg(st.recv_inflight <= st.recv_granted,
                      "rank %d holds %llu messages, more than the %llu it granted", mr_rank(),
                      (unsigned long long)st.recv_inflight, (unsigned long long)st.recv_granted);
    }
}

mr_status_t finalize_checked(void)
{
    if (mr_substrate_name() != NULL) check_invariants();
    return mr_finalize();
}
