/*
 * mailrail_demo: a small all-to-all job. Every rank sends `count` messages to
 * every rank (itself included), each stamped with its source and sequence
 * number and filled with bytes derived from them; every receiver checks each
 * message, counts what it got from whom, and rank 0 prints the totals and
 * the message rate.
 *
 *   mpiexec -n 4 mailrail_demo [messages-per-destination] [message-bytes]
 */
#include "mailrail.h"
#include "tool_common.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct demo_header {
    int32_t source;
    uint32_t seq;
} demo_header_t;

static uint8_t demo_byte(int source, uint32_t seq, size_t i)
{
    return (uint8_t)(source + seq * 3 + i);
}

typedef struct demo_state {
    uint64_t *from;    /* Messages received per source. */
    uint64_t corrupt;
    uint64_t received, bytes;
} demo_state_t;

static void demo_receive_all(demo_state_t *st)
{
    mr_message_t m;

    while (mr_receive(&m) == MR_OK) {
        demo_header_t h;
        const uint8_t *p = m.data;
        bool ok = m.length >= sizeof(h);

        if (ok) {
            memcpy(&h, p, sizeof(h));
            ok = h.source == m.source;
            for (size_t i = sizeof(h); ok && i < m.length; i++) {
                ok = p[i] == demo_byte(h.source, h.seq, i);
            }
        }
        st->corrupt += !ok;
        st->from[m.source]++;
        st->received++;
        st->bytes += m.length;
        mr_release(m.data);
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
    st.from = calloc((size_t)size, sizeof(*st.from));
    if (rank == 0) {
        printf("mailrail_demo: %d ranks on %d node(s), substrate %s, flow control %s: each "
               "rank sends %lu messages of %zu bytes to every rank.\n",
               size, mr_node_count(), mr_substrate_name(), mr_flowctl_name(), count, bytes);
    }

    start = tool_now();
    for (uint32_t seq = 0; seq < count; seq++) {
        for (int k = 0; k < size; k++) {
            int dest = (rank + k) % size;
            void *buf;
            while ((status = mr_reserve(&buf)) == MR_AGAIN) demo_receive_all(&st);
            if (status != MR_OK) goto fail;
            demo_header_t h = {rank, seq};
            memcpy(buf, &h, sizeof(h));
            for (size_t i = sizeof(h); i < bytes; i++) ((uint8_t *)buf)[i] = demo_byte(rank, seq, i);
            status = mr_send(buf, bytes, dest);
            if (status != MR_OK) goto fail;
        }
        demo_receive_all(&st);
    }
    do {
        demo_receive_all(&st);
    } while ((status = mr_quiesce()) == MR_AGAIN);
    if (status != MR_OK) goto fail;
    elapsed = tool_now() - start;

    mr_get_stats(&stats);
    bool complete = st.corrupt == 0;
    for (int s = 0; s < size; s++) complete &= st.from[s] == count;
    printf("rank %d: sent %llu messages (%llu bytes), received %llu (%llu bytes) from %d "
           "ranks, %llu corrupt, %s; %llu deferred, peak %llu receive slots in use\n",
           rank, (unsigned long long)stats.messages_sent, (unsigned long long)stats.bytes_sent,
           (unsigned long long)st.received, (unsigned long long)st.bytes, size,
           (unsigned long long)st.corrupt, complete ? "all delivered exactly once" : "INCOMPLETE",
           (unsigned long long)stats.deferred_sends,
           (unsigned long long)stats.peak_recv_slots_in_use);
    fflush(stdout);
    if (rank == 0) {
        double total = (double)count * size * size;
        printf("mailrail_demo: %.0f messages in %.3f s: %.2f million messages/s, %.1f MB/s "
               "over all ranks\n",
               total, elapsed, total / elapsed / 1e6, total * (double)bytes / elapsed / 1e6);
    }
    free(st.from);
    status = mr_finalize();
    return complete && status == MR_OK ? 0 : 1;

fail:
    fprintf(stderr, "mailrail_demo: rank %d: %s\n", rank, mr_status_string(status));
    free(st.from);
    mr_finalize();
    return 1;
}
