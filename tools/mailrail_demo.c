/*
 * mailrail_demo: a small all-to-all job. Every rank sends `count` messages to
 * every rank (itself included), each stamped with its source and sequence
 * number and filled with bytes derived from them. Every receiver checks each
 * message as it arrives: its source, that its sequence number is the next one
 * due from that source (each exactly once, in order per source), its length
 * and every byte; the first fault ends the run with an error that names the
 * source and the sequence number ("message 42 from rank 0 arrived twice").
 * A message lost is named too: when messages are still due and nothing has
 * arrived or left for MAILRAIL_TIMEOUT seconds, the first one missing. The
 * run ends with MailRail's credit invariants (tool_invariants_hold()), and
 * rank 0 prints the totals and the message rate.
 *
 *   mpiexec -n 4 mailrail_demo [messages-per-destination] [message-bytes]
 */
#include "mailrail.h"
#include "tool_common.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct demo_header {
    int32_t source;
    uint32_t seq;
} demo_header_t;

static uint8_t demo_byte(int source, uint32_t seq, size_t i)
{
    return (uint8_t)(source + seq * 3 + i);
}

typedef struct demo_state {
    int rank, size;
    uint32_t count;          /* Messages every rank sends to every rank. */
    size_t bytes;            /* The length of each. */
    unsigned timeout_s;      /* MAILRAIL_TIMEOUT: how long nothing may happen. */
    uint32_t *next;          /* Per source: the sequence number due next (FIFO per source). */
    uint64_t missing;        /* Messages still due to this rank. */
    uint64_t received, bytes_received;
    double last_progress;    /* When a message last arrived or left. */
} demo_state_t;

/*
 * Names what broke exactly-once delivery and ends this process at once, as
 * an abort would (_exit: no exit handlers run in a job left half way, and MPI
 * is not finalized): the other ranks may wait for a quiescence that cannot
 * come, and the launcher stops them when a rank exits with an error (their
 * own waits are bounded too).
 */
static void demo_die(const demo_state_t *st, const char *format, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, format);
    vsnprintf(what, sizeof(what), format, ap);
    va_end(ap);
    /* One write, so that the launcher does not interleave it with other ranks' lines. */
    fflush(stdout);
    fprintf(stderr, "mailrail_demo: rank %d: %s\n", st->rank, what);
    fflush(stderr);
    _exit(1);
}

/*
 * Checks one message against what must come: the source it claims, its
 * sequence number (each exactly once, in order per source, as MailRail
 * promises), its length and every byte. The first fault ends the run.
 */
static void demo_check(demo_state_t *st, const mr_message_t *m)
{
    const uint8_t *p = m->data;
    demo_header_t h;

    if (m->source < 0 || m->source >= st->size) {
        demo_die(st, "a message of %zu bytes came from rank %d, which is not in the job",
                 m->length, m->source);
    }
    if (m->length < sizeof(h)) {
        demo_die(st, "a message of %zu bytes from rank %d is shorter than its header",
                 m->length, m->source);
    }
    memcpy(&h, p, sizeof(h));
    if (h.source != m->source) {
        demo_die(st, "message %" PRIu32 " from rank %d says it comes from rank %" PRId32, h.seq,
                 m->source, h.source);
    }
    uint32_t due = st->next[m->source];
    if (h.seq < due) {
        demo_die(st, "message %" PRIu32 " from rank %d arrived twice", h.seq, m->source);
    }
    if (h.seq >= st->count) {
        demo_die(st, "message %" PRIu32 " from rank %d is beyond the %" PRIu32 " it sends", h.seq,
                 m->source, st->count);
    }
    if (h.seq > due) {
        demo_die(st, "message %" PRIu32 " from rank %d is missing: message %" PRIu32
                 " arrived before it", due, m->source, h.seq);
    }
    if (m->length != st->bytes) {
        demo_die(st, "message %" PRIu32 " from rank %d has %zu bytes, not %zu", h.seq, m->source,
                 m->length, st->bytes);
    }
    for (size_t i = sizeof(h); i < m->length; i++) {
        if (p[i] != demo_byte(h.source, h.seq, i)) {
            demo_die(st, "message %" PRIu32 " from rank %d: byte %zu is 0x%02x, not 0x%02x",
                     h.seq, m->source, i, p[i], demo_byte(h.source, h.seq, i));
        }
    }
    st->next[m->source]++;
    st->missing--;
}

static void demo_receive_all(demo_state_t *st)
{
    mr_message_t m;

    while (mr_receive(&m) == MR_OK) {
        demo_check(st, &m);
        st->received++;
        st->bytes_received += m.length;
        st->last_progress = tool_now();
        mr_release(m.data);
    }
}

/*
 * Bounds every wait: with messages still due and nothing arriving or leaving
 * for MAILRAIL_TIMEOUT seconds, the first one missing is named (lost); with
 * none due, a job that has not quiesced after three times as long is stuck
 * elsewhere (another rank names what it misses). `what` is what this rank waits for.
 */
static void demo_watch(const demo_state_t *st, const char *what)
{
    double idle = tool_now() - st->last_progress;

    if (st->missing > 0 && idle > st->timeout_s) {
        for (int s = 0; s < st->size; s++) {
            if (st->next[s] == st->count) continue;
            demo_die(st, "message %" PRIu32 " from rank %d never arrived: nothing came for %u s "
                     "(MAILRAIL_TIMEOUT) while waiting for %s, with %" PRIu64 " message(s) missing",
                     st->next[s], s, st->timeout_s, what, st->missing);
        }
    }
    if (idle > 3.0 * st->timeout_s) {
        demo_die(st, "every message to this rank arrived, but nothing happened for %u s while "
                 "waiting for %s (3 x MAILRAIL_TIMEOUT): another rank is stuck or misses messages",
                 3 * st->timeout_s, what);
    }
}

int main(int argc, char **argv)
{
    unsigned long count = 10000;
    size_t bytes = 256;
    demo_state_t st = {0};
    mr_status_t status;
    mr_stats_t stats = {.size = sizeof(stats)};
    double start, elapsed;
    int rank, size;

    uint64_t messages = count, length = bytes;
    if (argc > 3 || (argc > 1 && !tool_parse_uint(argv[1], 1, UINT32_MAX, &messages)) ||
        (argc > 2 && !tool_parse_uint(argv[2], 0, UINT32_MAX, &length))) {
        fprintf(stderr, "usage: mpiexec -n N mailrail_demo [messages-per-destination [bytes]]\n");
        return 2;
    }
    count = (unsigned long)messages;
    bytes = (size_t)length;
    status = mr_init();
    if (status != MR_OK) {
        fprintf(stderr, "mailrail_demo: mr_init failed: %s\n", mr_status_string(status));
        return 1;
    }
    rank = mr_rank();
    size = mr_size();
    if (bytes < sizeof(demo_header_t)) bytes = sizeof(demo_header_t);
    if (bytes > mr_datagram_size()) bytes = mr_datagram_size();
    st.rank = rank;
    st.size = size;
    st.count = (uint32_t)count;
    st.bytes = bytes;
    st.timeout_s = tool_timeout_s();
    st.missing = (uint64_t)count * (uint64_t)size;
    st.next = calloc((size_t)size, sizeof(*st.next));
    if (st.next == NULL) {
        status = MR_ERR_NO_MEMORY;
        goto fail;
    }
    if (rank == 0) {
        printf("mailrail_demo: %d ranks on %d node(s), substrate %s, flow control %s: each "
               "rank sends %lu messages of %zu bytes to every rank.\n",
               size, mr_node_count(), mr_substrate_name(), mr_flowctl_name(), count, bytes);
    }

    start = st.last_progress = tool_now();
    for (uint32_t seq = 0; seq < count; seq++) {
        for (int k = 0; k < size; k++) {
            int dest = (rank + k) % size;
            void *buf;
            while ((status = mr_reserve(&buf)) == MR_AGAIN) {
                demo_receive_all(&st);
                demo_watch(&st, "a send buffer");
            }
            if (status != MR_OK) goto fail;
            demo_header_t h = {rank, seq};
            memcpy(buf, &h, sizeof(h));
            for (size_t i = sizeof(h); i < bytes; i++) ((uint8_t *)buf)[i] = demo_byte(rank, seq, i);
            status = mr_send(buf, bytes, dest);
            if (status != MR_OK) goto fail;
            st.last_progress = tool_now();
        }
        demo_receive_all(&st);
    }
    do {
        demo_receive_all(&st);
        demo_watch(&st, "quiescence");
    } while ((status = mr_quiesce()) == MR_AGAIN);
    if (status != MR_OK) goto fail;
    elapsed = tool_now() - start;

    /* Quiescence means every message sent has been received: none may be missing. */
    bool complete = st.missing == 0;
    mr_get_stats(&stats);
    printf("rank %d: sent %llu messages (%llu bytes), received %llu (%llu bytes) from %d "
           "ranks, %llu corrupt, %s; %llu deferred, peak %llu receive slots in use\n",
           rank, (unsigned long long)stats.messages_sent, (unsigned long long)stats.bytes_sent,
           (unsigned long long)st.received, (unsigned long long)st.bytes_received, size, 0ull,
           complete ? "all delivered exactly once" : "INCOMPLETE",
           (unsigned long long)stats.deferred_sends,
           (unsigned long long)stats.peak_recv_slots_in_use);
    fflush(stdout);
    if (!complete) {
        for (int s = 0; s < size; s++) {
            if (st.next[s] == st.count) continue;
            fprintf(stderr, "mailrail_demo: rank %d: quiesced, but message %" PRIu32 " from rank "
                    "%d never arrived (%" PRIu64 " missing)\n", rank, st.next[s], s, st.missing);
            break;
        }
    }
    if (rank == 0) {
        double total = (double)count * size * size;
        printf("mailrail_demo: %.0f messages in %.3f s: %.2f million messages/s, %.1f MB/s "
               "over all ranks\n",
               total, elapsed, total / elapsed / 1e6, total * (double)bytes / elapsed / 1e6);
    }
    /* Flow control's promises, counted by MailRail (docs/reliability.md). */
    bool invariants = tool_invariants_hold("mailrail_demo");
    free(st.next);
    status = mr_finalize();
    if (status != MR_OK) {
        fprintf(stderr, "mailrail_demo: rank %d: mr_finalize: %s\n", rank,
                mr_status_string(status));
    }
    return complete && invariants && status == MR_OK ? 0 : 1;

fail:
    fprintf(stderr, "mailrail_demo: rank %d: %s\n", rank, mr_status_string(status));
    free(st.next);
    mr_finalize();
    return 1;
}
