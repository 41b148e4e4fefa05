/*
 * Helpers shared by the multi-rank tests: messages whose bytes derive from
 * (source, sequence number) so that every receive checks payload and source,
 * exactly-once bookkeeping, and the receive/reserve/quiesce loops, each bounded
 * in time so that a stall fails the test instead of hanging it.
 */
#ifndef MR_TEST_H
#define MR_TEST_H

#include "mailrail.h"

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#define WAIT_LIMIT_S 30.0

/* The most ranks a test job may have: arrays indexed by rank are this long. */
#define MR_TEST_MAX_RANKS 16384

/*
 * A failed assertion ends the whole job at once: the tests are collective and
 * run without fork, so a rank that left a test early would otherwise leave the
 * others waiting in its collectives until the outer timeout. Every Check
 * assertion macro expands to _ck_assert_failed(); this sends it here, where
 * the failure is printed with the rank and MPI_Abort ends every rank.
 */
void mr_test_assert_failed(const char *file, int line, const char *expr, const char *msg, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
#define _ck_assert_failed mr_test_assert_failed

extern int world_rank, world_size;

typedef struct msg_header {
    int32_t source, dest;
    uint32_t seq, length;
} msg_header_t;

/* Exactly-once bookkeeping: seen[source * per_source + seq]. */
typedef struct tally {
    uint8_t *seen;
    uint32_t per_source;
    uint64_t count;
} tally_t;

double now_s(void);

/*
 * A test's message or item count `n`, divided by MR_TEST_SHRINK (a whole
 * number from 1, default 1; at least 1 is returned). The valgrind runs set it:
 * their ranks are ten times slower, and fewer messages take the same paths.
 */
uint32_t test_count(uint32_t n);

/* Fills a message of `length` bytes (>= sizeof header; shorter ones are left as they are). */
void fill_message(void *buf, size_t length, int source, int dest, uint32_t seq);

/*
 * Returns the index of the first payload byte of `m` that differs from the
 * pattern of header `h`, or m->length when the payload is intact. Asserts
 * nothing, so that hot loops can call it.
 */
size_t first_corrupt_byte(const mr_message_t *m, const msg_header_t *h);

/* Checks a received message against its header and the sender. Returns its seq. */
uint32_t check_message(const mr_message_t *m);

/* Sets or clears the pool settings for the next mr_init(). */
void setup_env(const char *send_slots, const char *recv_slots, const char *dgram);

/* mr_init_mpi() on MPI_COMM_WORLD, checking rank and size. */
void init_on_world(void);

void tally_init(tally_t *t, uint32_t per_source);
/* Records message `seq` from `source`, failing on a second delivery or a seq out of range. */
void tally_mark(tally_t *t, int source, uint32_t seq);

/* Receives whatever is there, checking each message; returns how many arrived. */
int drain(tally_t *t);

/* Reserves a buffer, receiving while backpressured. */
void *reserve_or_progress(tally_t *t);

/* Receives until mr_quiesce() returns MR_OK. */
void quiesce(tally_t *t);

/* The same with another receive loop: `receive(arg)` between mr_quiesce() calls. */
void quiesce_with(void (*receive)(void *arg), void *arg);

/* Sends `per_dest` messages of varying lengths to each of `dests`. */
void exchange(const int *dests, int ndest, uint32_t per_dest, tally_t *t);
/* The same, receiving only after every `burst` messages (and when backpressured). */
void exchange_bursts(const int *dests, int ndest, uint32_t per_dest, unsigned burst, tally_t *t);

/* Checks that exactly the messages 0..per_src-1 of each source arrived. */
void expect_all_from(const tally_t *t, const int *sources, int nsrc, uint32_t per_src);

/* Asserts that this rank's counters break no credit invariant (tool_invariant_breach()). */
void check_invariants(void);

/*
 * mr_finalize(), after check_invariants() while MailRail is initialized: the
 * tests end every job through it, so that every test checks the invariants.
 */
mr_status_t finalize_checked(void);

/*
 * Initializes MPI, runs the suite with every test collective (no fork),
 * combines every rank's verdict, finalizes MPI and returns the exit status.
 */
int run_suite_on_all_ranks(int argc, char **argv, Suite *(*make_suite)(void));

#endif /* MR_TEST_H */
