/*
 * mailrail_perf: message rate, bandwidth and latency between two ranks, per
 * message size, for the substrate and flow-control policy in the
 * environment, or for a plain MPI loop as the baseline to compare with.
 *
 *   mpiexec -n 2 mailrail_perf [options]
 *     -s SIZES    comma-separated message sizes in bytes (default 8,64,512,4096;
 *                 larger ones need MAILRAIL_DATAGRAM_SIZE raised)
 *     -n COUNT    messages per size and repetition for the rate test (default 100000)
 *     -r REPS     repetitions per size; the best is reported (default 3)
 *     -w WINDOW   raw MPI only: sends per MPI_Waitall with -m, requests in flight
 *                 on each side with -a (default 64)
 *     -l          also measure ping-pong latency
 *     -m          raw MPI baseline: MPI_Isend/MPI_Irecv windows, no MailRail
 *     -a          raw MPI, driven asynchronously as a runtime must: WINDOW sends in
 *                 flight and WINDOW receives posted at all times, the oldest tested
 *                 with MPI_Testsome and re-posted as they complete (latency as -m)
 *     -H          through active-message handlers (mr_send_handler, mr_poll): the
 *                 receiver's handler takes each message; in the ping-pong the
 *                 answer leaves from inside the handler (sizes up to
 *                 MAILRAIL_DATAGRAM_SIZE - 1)
 *     -C          with -H: every message sent with mr_send_handler_copy() from a
 *                 buffer of the tool's, without mr_reserve()
 *     -i          the item layer instead (mailrail_items.h): SIZES are item sizes
 *                 (default 8,16,64) and COUNT items (default 1000000) give the cost
 *                 per item of push and pull, to oneself and to a peer, in ns
 *     -I          instructions: one stream per size under callgrind, each dumped
 *                 on its own ("stream SIZE"), then IDLE polls with nothing to
 *                 receive ("idle SIZE"); prints the messages and the empty
 *                 polls of each rank (tools/perf_instructions.sh reads them);
 *                 with -a, the raw asynchronous MPI stream instead
 *     -c FILE     append results as CSV to FILE
 *
 * Rank 0 streams COUNT messages to rank 1 as fast as it can (through
 * mr_reserve/mr_send, receiving while backpressured); rank 1 receives and
 * releases them and answers with one message; the time from the first send
 * to that answer gives the rate. Other ranks only take part in init and
 * finalize. Prints one line per size and a summary line. With MR_PERF_STATS
 * set in the environment, ranks 0 and 1 also print some of their mr_stats_t
 * counters (deferred sends, credits, coalesced messages, failed reserves).
 */
#include "mailrail.h"
#include "mailrail_items.h"
#include "tool_common.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef MR_HAVE_CALLGRIND
#include <valgrind/callgrind.h>
#endif

#define PERF_MAX_SIZES 32
#define PERF_ACK_TAG 77

typedef struct perf_options {
    size_t sizes[PERF_MAX_SIZES];
    int nsizes;
    long count;
    int reps;
    int window;
    bool latency;
    bool raw_mpi;
    bool raw_async; /* With raw_mpi: the continuous loop instead of windows. */
    bool items;
    bool handlers;  /* Through mr_send_handler() and mr_poll(). */
    bool copy;      /* With handlers: mr_send_handler_copy() instead. */
    bool instructions; /* Phases dumped for callgrind (-I). */
    const char *csv;
} perf_options_t;

typedef struct perf_result {
    double seconds;      /* Best of the repetitions. */
    double latency_us;   /* One-way, half a round trip; 0 when not measured. */
} perf_result_t;

static void perf_usage(void)
{
    fprintf(stderr, "usage: mpiexec -n 2 mailrail_perf [-s sizes] [-n count] [-r reps] "
                    "[-w window] [-l] [-m | -a | -H [-C] | -i] [-I] [-c file.csv]\n");
}

static int perf_parse(int argc, char **argv, perf_options_t *o)
{
    const char *sizes = NULL;
    long count = 0;
    bool ok = true;
    int c;

    o->reps = 3;
    o->window = 64;
    while ((c = getopt(argc, argv, "s:n:r:w:lmaHCiIc:h")) != -1) {
        switch (c) {
        case 's': sizes = optarg; break;
        case 'n': ok &= tool_parse_long(optarg, 1, LONG_MAX, &count); break;
        case 'r': ok &= tool_parse_int(optarg, 1, 1000, &o->reps); break;
        case 'w': ok &= tool_parse_int(optarg, 1, 1 << 20, &o->window); break;
        case 'l': o->latency = true; break;
        case 'm': o->raw_mpi = true; break;
        case 'a': o->raw_mpi = o->raw_async = true; break;
        case 'i': o->items = true; break;
        case 'H': o->handlers = true; break;
        case 'C': o->copy = true; break;
        case 'I': o->instructions = true; break;
        case 'c': o->csv = optarg; break;
        default: return -1;
        }
    }
    if (sizes == NULL) sizes = o->items ? "8,16,64" : "8,64,512,4096";
    o->count = count > 0 ? count : o->items ? 1000000 : 100000;
    if ((o->items || o->handlers) && o->raw_mpi) return -1;
    if (o->items && o->handlers) return -1;
    if (o->copy && !o->handlers) return -1;
    for (const char *p = sizes; *p != '\0' && o->nsizes < PERF_MAX_SIZES;) {
        char *end;
        o->sizes[o->nsizes++] = strtoul(p, &end, 10);
        if (end == p) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return ok && o->nsizes > 0 ? 0 : -1;
}

/* ---- Through MailRail ------------------------------------------------------------------ */

/* Polls that found nothing (a receive or a poll that returned MR_AGAIN), for -I. */
static long perf_empty;

/*
 * Nanoseconds to sleep after a poll that found nothing, outside MailRail: -I
 * sets it, so that a side that outruns the other makes a few empty polls per
 * message, not dozens, and MailRail's own count depends little on the price
 * of an empty poll that tools/perf_instructions.sh takes off.
 */
static long perf_nap_ns;

static void perf_found_nothing(void)
{
    perf_empty++;
    if (perf_nap_ns > 0) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = perf_nap_ns};
        nanosleep(&ts, NULL);
    }
}

/* Receives and releases one message, waiting for it. */
static void mr_wait_one(void)
{
    mr_message_t m;
    while (mr_receive(&m) != MR_OK) {
    }
    mr_release(m.data);
}

/* Sends one message of `size` bytes to `dest`, receiving while backpressured. */
static void mr_send_one(int dest, size_t size)
{
    void *buf;
    mr_message_t m;

    while (mr_reserve(&buf) != MR_OK) {
        if (mr_receive(&m) == MR_OK) mr_release(m.data);
    }
    memset(buf, 0x5a, size < 64 ? size : 64);
    mr_send(buf, size, dest);
}

__attribute__((noinline)) static double mr_stream(int rank, size_t size, long count)
{
    double start = tool_now();
    mr_message_t m;

    if (rank == 0) {
        for (long i = 0; i < count; i++) {
            void *buf;
            while (mr_reserve(&buf) != MR_OK) {
                if (mr_receive(&m) == MR_OK) mr_release(m.data);
                else perf_found_nothing();
            }
            mr_send(buf, size, 1);
        }
        mr_wait_one(); /* The receiver's answer: everything arrived. */
    } else if (rank == 1) {
        for (long got = 0; got < count;) {
            if (mr_receive(&m) == MR_OK) {
                mr_release(m.data);
                got++;
            } else {
                perf_found_nothing();
            }
        }
        mr_send_one(0, 1);
    }
    return tool_now() - start;
}

/* Not inlined, so that a profiler can count it alone (callgrind --toggle-collect). */
__attribute__((noinline)) static double mr_pingpong(int rank, size_t size, long rounds)
{
    double start = tool_now();

    for (long i = 0; i < rounds; i++) {
        if (rank == 0) {
            mr_send_one(1, size);
            mr_wait_one();
        } else if (rank == 1) {
            mr_wait_one();
            mr_send_one(0, size);
        }
    }
    return (tool_now() - start) / (double)rounds / 2.0;
}

/* ---- Through active-message handlers ----------------------------------------------------- */

enum { PERF_H_SINK = 1, PERF_H_ACK = 2, PERF_H_PING = 3, PERF_H_PONG = 4 };

static bool perf_h_copy;     /* -C: mr_send_handler_copy() from perf_h_data. */
static uint8_t *perf_h_data; /* The tool's own buffer for -C (a datagram's worth). */
static long perf_h_got;     /* Messages the sink handler took. */
static bool perf_h_answered; /* The ack or the pong arrived. */
static size_t perf_h_size;   /* The ping-pong's message size. */

static mr_status_t perf_h_sink(const mr_message_t *m, void *arg)
{
    (void)m;
    (void)arg;
    perf_h_got++;
    return MR_OK;
}

static mr_status_t perf_h_answer(const mr_message_t *m, void *arg)
{
    (void)m;
    (void)arg;
    perf_h_answered = true;
    return MR_OK;
}

/* The ping's handler answers from inside, or asks to be called again without a buffer. */
static mr_status_t perf_h_ping(const mr_message_t *m, void *arg)
{
    void *buf;

    (void)arg;
    if (perf_h_copy) {
        return mr_send_handler_copy(perf_h_data, perf_h_size, m->source, PERF_H_PONG) == MR_OK
                   ? MR_OK
                   : MR_AGAIN;
    }
    if (mr_reserve(&buf) != MR_OK) return MR_AGAIN;
    memset(buf, 0x5a, perf_h_size < 64 ? perf_h_size : 64);
    return mr_send_handler(buf, perf_h_size, m->source, PERF_H_PONG) == MR_OK ? MR_OK : MR_AGAIN;
}

static void perf_h_register(void)
{
    if (mr_handler_register(PERF_H_SINK, perf_h_sink, NULL) != MR_OK ||
        mr_handler_register(PERF_H_ACK, perf_h_answer, NULL) != MR_OK ||
        mr_handler_register(PERF_H_PING, perf_h_ping, NULL) != MR_OK ||
        mr_handler_register(PERF_H_PONG, perf_h_answer, NULL) != MR_OK) {
        fprintf(stderr, "mailrail_perf: cannot register the handlers\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* Sends one message to handler `id` at `dest`, polling while backpressured. */
static void mr_h_send_one(int dest, size_t size, int id)
{
    void *buf;

    if (perf_h_copy) {
        while (mr_send_handler_copy(perf_h_data, size, dest, id) == MR_AGAIN) mr_poll();
        return;
    }
    while (mr_reserve(&buf) != MR_OK) mr_poll();
    memset(buf, 0x5a, size < 64 ? size : 64);
    mr_send_handler(buf, size, dest, id);
}

static void mr_h_wait_answer(void)
{
    while (!perf_h_answered) mr_poll();
    perf_h_answered = false;
}

__attribute__((noinline)) static double mr_h_stream(int rank, size_t size, long count)
{
    double start = tool_now();

    if (rank == 0) {
        for (long i = 0; i < count && perf_h_copy; i++) {
            while (mr_send_handler_copy(perf_h_data, size, 1, PERF_H_SINK) == MR_AGAIN) {
                if (mr_poll() != MR_OK) perf_found_nothing();
            }
        }
        for (long i = 0; i < count && !perf_h_copy; i++) {
            void *buf;
            while (mr_reserve(&buf) != MR_OK) {
                if (mr_poll() != MR_OK) perf_found_nothing();
            }
            mr_send_handler(buf, size, 1, PERF_H_SINK);
        }
        mr_h_wait_answer(); /* The receiver's answer: everything arrived. */
    } else if (rank == 1) {
        while (perf_h_got < count) {
            if (mr_poll() != MR_OK) perf_found_nothing();
        }
        perf_h_got = 0;
        mr_h_send_one(0, 1, PERF_H_ACK);
    }
    return tool_now() - start;
}

/* Rank 1's handler answers each ping from inside; rank 0 polls for the pong. */
__attribute__((noinline)) static double mr_h_pingpong(int rank, size_t size, long rounds)
{
    double start = tool_now();

    perf_h_size = size;
    if (rank == 0) {
        for (long i = 0; i < rounds; i++) {
            mr_h_send_one(1, size, PERF_H_PING);
            mr_h_wait_answer();
        }
        mr_h_send_one(1, 1, PERF_H_ACK); /* Done: rank 1 stops polling. */
    } else if (rank == 1) {
        mr_h_wait_answer();
    }
    return (tool_now() - start) / (double)rounds / 2.0;
}

/* ---- Plain MPI, the baseline ------------------------------------------------------------- */

/* The end of a raw stream: the receiver's answer tells the sender everything arrived. */
static void mpi_stream_end(int rank)
{
    char ack = 0;

    if (rank == 0) MPI_Recv(&ack, 1, MPI_BYTE, 1, PERF_ACK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rank == 1) MPI_Send(&ack, 1, MPI_BYTE, 0, PERF_ACK_TAG, MPI_COMM_WORLD);
}

__attribute__((noinline)) static double mpi_stream(int rank, size_t size, long count, int window,
                                                   char *buf)
{
    MPI_Request *req = malloc((size_t)window * sizeof(*req));
    MPI_Status *st = malloc((size_t)window * sizeof(*st));
    double start = tool_now();

    for (long sent = 0; sent < count && rank < 2;) {
        int n = count - sent < window ? (int)(count - sent) : window;
        for (int i = 0; i < n; i++) {
            if (rank == 0) MPI_Isend(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &req[i]);
            else MPI_Irecv(buf + (size_t)i * size, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Waitall(n, req, st);
        sent += n;
    }
    mpi_stream_end(rank);
    free(req);
    free(st);
    return tool_now() - start;
}

/*
 * The same stream, with MPI driven as an asynchronous runtime must drive it:
 * no side ever waits for a whole window. The sender keeps `window` sends in
 * flight and the receiver `window` receives posted; each tests its oldest
 * requests (MPI_Testsome over at most 7, one MPI progress pass) and starts a
 * new one for each that completed. With one sender and one tag they complete
 * about in order; one that completes early waits for those before it.
 */
__attribute__((noinline)) static double mpi_stream_async(int rank, size_t size, long count,
                                                         int window, char *buf)
{
    enum { PERF_TEST_BATCH = 7 };
    MPI_Request *req = malloc((size_t)window * sizeof(*req));
    int idx[PERF_TEST_BATCH], head = 0, active = 0;
    MPI_Status st[PERF_TEST_BATCH];
    long started = 0, done = 0;
    double start = tool_now();

    while (rank < 2 && done < count) {
        while (active < window && started < count) {
            int slot = (head + active) % window;
            char *b = buf + (size_t)slot * size;
            if (rank == 0) MPI_Isend(b, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &req[slot]);
            else MPI_Irecv(b, (int)size, MPI_BYTE, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &req[slot]);
            active++;
            started++;
        }
        int len = active < PERF_TEST_BATCH ? active : PERF_TEST_BATCH, out = 0;
        if (head + len > window) len = window - head; /* MPI_Testsome takes a contiguous run. */
        MPI_Testsome(len, req + head, &out, idx, st);
        while (active > 0 && req[head] == MPI_REQUEST_NULL) {
            head = (head + 1) % window;
            active--;
            done++;
        }
    }
    mpi_stream_end(rank);
    free(req);
    return tool_now() - start;
}

__attribute__((noinline)) static double mpi_pingpong(int rank, size_t size, long rounds, char *buf)
{
    double start = tool_now();

    for (long i = 0; i < rounds; i++) {
        if (rank == 0) {
            MPI_Send(buf, (int)size, MPI_BYTE, 1, 2, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
        }
    }
    return (tool_now() - start) / (double)rounds / 2.0;
}

/* ---- The item layer --------------------------------------------------------------------- */

typedef struct perf_item_costs {
    double push_self, pull_self, block_self; /* ns per item, to and from oneself. */
    double stream_peer;                      /* ns per item, rank 0 to rank 1, end to end. */
} perf_item_costs_t;

static void perf_die(const char *what, mr_status_t st)
{
    fprintf(stderr, "mailrail_perf: %s: %s\n", what, mr_status_string(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/*
 * To oneself: pushes 8 datagrams' worth of items (so that the send slots
 * they fill come back warm, as in a steady exchange), then pulls them back,
 * one call per item or one per block, alternately; the two kinds of
 * interval add up to the push and pull costs.
 */
static void perf_items_self(mr_items_t *a, size_t size, long count, perf_item_costs_t *c)
{
    static uint8_t item[64];
    double push = 0, pull = 0, block = 0;
    long pulled_one = 0, pulled_block = 0, pushed = 0;
    long round_items = 8 * (long)((mr_datagram_size() - 8) / size);

    for (int round = 0; pushed < count; round++) {
        double t0 = tool_now();
        long n = 0, limit = count - pushed < round_items ? count - pushed : round_items;
        mr_status_t st;
        while (n < limit && (st = mr_items_push(a, item, size, mr_rank())) == MR_OK) n++;
        double t1 = tool_now();
        mr_items_flush(a);
        double t2 = tool_now();
        long got = 0;
        if (round % 2 == 0) {
            mr_item_t it;
            while (got < n && (st = mr_items_pull(a, &it)) == MR_OK) got++;
            pulled_one += got;
            pull += tool_now() - t2;
        } else {
            const void *data;
            size_t k;
            int source;
            while (got < n && (st = mr_items_pull_block(a, &data, &k, &source)) == MR_OK) {
                got += (long)k;
            }
            pulled_block += got;
            block += tool_now() - t2;
        }
        if (got != n) perf_die("items to oneself did not come back", MR_ERR_PROTOCOL);
        push += t1 - t0;
        pushed += n;
    }
    c->push_self = 1e9 * push / (double)pushed;
    c->pull_self = pulled_one ? 1e9 * pull / (double)pulled_one : 0;
    c->block_self = pulled_block ? 1e9 * block / (double)pulled_block : 0;
}

/* Rank 0 streams `count` items to rank 1, which pulls them: time per item, first to last. */
static double perf_items_peer(mr_items_t *a, int rank, size_t size, long count)
{
    static uint8_t item[64];
    mr_item_t it;
    mr_status_t st = MR_OK;
    double start = tool_now();

    if (rank == 0) {
        for (long i = 0; i < count; i++) {
            while ((st = mr_items_push(a, item, size, 1)) == MR_AGAIN) {
                if ((st = mr_items_pull(a, &it)) < 0) perf_die("mr_items_pull", st);
            }
            if (st != MR_OK) perf_die("mr_items_push", st);
        }
    } else if (rank == 1) {
        for (long got = 0; got < count;) {
            st = mr_items_pull(a, &it);
            if (st == MR_OK) got++;
            else if (st != MR_AGAIN) perf_die("mr_items_pull", st);
        }
    }
    do {
        while ((st = mr_items_pull(a, &it)) == MR_OK) {
        }
        if (st == MR_AGAIN) st = mr_items_end_phase(a);
    } while (st == MR_AGAIN);
    if (st != MR_OK) perf_die("mr_items_end_phase", st);
    return 1e9 * (tool_now() - start) / (double)count;
}

/* The best of o->reps for each cost, at one item size. */
static perf_item_costs_t perf_items(const perf_options_t *o, int rank, size_t size)
{
    perf_item_costs_t best = {1e30, 1e30, 1e30, 1e30};
    mr_items_t *a;
    mr_status_t st = mr_items_create(size, &a);

    if (st != MR_OK) perf_die("mr_items_create", st);
    perf_items_peer(a, rank, size, o->count / 10 > 0 ? o->count / 10 : 1); /* Warm-up. */
    for (int i = 0; i < o->reps; i++) {
        perf_item_costs_t c;
        perf_items_self(a, size, o->count, &c);
        MPI_Barrier(MPI_COMM_WORLD);
        c.stream_peer = perf_items_peer(a, rank, size, o->count);
        if (c.push_self < best.push_self) best.push_self = c.push_self;
        if (c.pull_self < best.pull_self) best.pull_self = c.pull_self;
        if (c.block_self < best.block_self) best.block_self = c.block_self;
        if (c.stream_peer < best.stream_peer) best.stream_peer = c.stream_peer;
    }
    mr_items_destroy(a);
    return best;
}

static void perf_items_report(const perf_options_t *o, int rank, FILE *csv)
{
    if (rank == 0) {
        printf("# mailrail_perf -i: substrate %s, flow control %s, %ld items x %d repetitions "
               "(best), ns per item\n# %6s %10s %10s %10s %14s\n", mr_substrate_name(),
               mr_flowctl_name(), o->count, o->reps, "bytes", "push self", "pull self",
               "block self", "to a peer");
        if (csv != NULL && ftell(csv) == 0) {
            fprintf(csv, "substrate,flowctl,item_size,items,push_self_ns,pull_self_ns,"
                         "pull_block_self_ns,stream_peer_ns\n");
        }
    }
    for (int i = 0; i < o->nsizes; i++) {
        perf_item_costs_t c = perf_items(o, rank, o->sizes[i]);
        if (rank != 0) continue;
        printf("  %6zu %10.2f %10.2f %10.2f %14.2f\n", o->sizes[i], c.push_self, c.pull_self,
               c.block_self, c.stream_peer);
        if (csv != NULL) {
            fprintf(csv, "%s,%s,%zu,%ld,%.3f,%.3f,%.3f,%.3f\n", mr_substrate_name(),
                    mr_flowctl_name(), o->sizes[i], o->count, c.push_self, c.pull_self,
                    c.block_self, c.stream_peer);
        }
        fflush(stdout);
    }
}

/* ---- Instructions (-I) ------------------------------------------------------------------- */

#define PERF_IDLE_POLLS 2000
/* perf_nap_ns under -I (PERF_NAP_NS in the environment overrides it, 0: no nap). */
#define PERF_NAP_NS 20000

/*
 * One stream of o->count messages and then PERF_IDLE_POLLS polls with nothing
 * to receive, each phase dumped by callgrind on its own; prints what each rank
 * did, for tools/perf_instructions.sh to divide by.
 */
/* The stream -I counts: through MailRail, its handlers, or raw MPI driven asynchronously (-a). */
static void perf_i_stream(const perf_options_t *o, int rank, size_t size, long count, char *buf)
{
    if (o->raw_mpi) mpi_stream_async(rank, size, count, o->window, buf);
    else if (o->handlers) mr_h_stream(rank, size, count);
    else mr_stream(rank, size, count);
}

/*
 * One stream of o->count messages and then PERF_IDLE_POLLS polls with nothing
 * to receive (none for raw MPI), each phase dumped by callgrind on its own;
 * prints what each rank did, for tools/perf_instructions.sh to divide by.
 */
static void perf_instructions(const perf_options_t *o, int rank, size_t size, char *buf)
{
#ifdef MR_HAVE_CALLGRIND
    mr_stats_t before = {.size = sizeof(before)}, after = {.size = sizeof(after)};
    int idle_polls = o->raw_mpi ? 0 : PERF_IDLE_POLLS;
    char name[64];
    mr_message_t m;

    const char *nap = getenv("PERF_NAP_NS");
    perf_nap_ns = PERF_NAP_NS;
    if (nap != NULL && !tool_parse_long(nap, 0, 999999999, &perf_nap_ns)) {
        fprintf(stderr, "mailrail_perf: PERF_NAP_NS=\"%s\": allowed is an integer from 0 to "
                "999999999 (nanoseconds)\n", nap);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    perf_i_stream(o, rank, size, o->count / 10 + 1, buf);
    MPI_Barrier(MPI_COMM_WORLD);
    perf_empty = 0;
    if (!o->raw_mpi) mr_get_stats(&before);
    CALLGRIND_ZERO_STATS;
    perf_i_stream(o, rank, size, o->count, buf);
    snprintf(name, sizeof(name), "stream %zu", size);
    CALLGRIND_DUMP_STATS_AT(name);
    long empty = perf_empty;
    if (!o->raw_mpi) mr_get_stats(&after);
    /* Everything has arrived on both sides: these polls find nothing. */
    MPI_Barrier(MPI_COMM_WORLD);
    CALLGRIND_ZERO_STATS;
    for (int i = 0; i < idle_polls; i++) {
        /* mr_poll() may still see a send complete; no handler may run. */
        if (o->handlers ? (mr_poll(), perf_h_got != 0 || perf_h_answered) : mr_receive(&m) == MR_OK) {
            fprintf(stderr, "mailrail_perf: a message arrived in the idle phase\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    snprintf(name, sizeof(name), "idle %zu", size);
    CALLGRIND_DUMP_STATS_AT(name);
    if (rank < 2) {
        /* Coalesced messages ride in batches: per message they cost less, on both sides. */
        printf("instructions rank=%d size=%zu messages=%ld empty_polls=%ld idle_polls=%d "
               "coalesced=%llu\n", rank, size, o->count, empty, idle_polls,
               (unsigned long long)(after.messages_coalesced - before.messages_coalesced));
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
#else
    (void)o;
    (void)rank;
    (void)size;
    (void)buf;
#endif
}

/* ---- Driver ---------------------------------------------------------------------------- */

static perf_result_t perf_measure(const perf_options_t *o, int rank, size_t size, char *buf)
{
    perf_result_t r = {.seconds = 1e30};
    long warmup = o->count / 10 > 0 ? o->count / 10 : 1;
    long rounds = o->count / 10 > 100 ? o->count / 10 : 100;

    /* A short untimed run first: connections, registration caches, page faults. */
    if (o->raw_async) mpi_stream_async(rank, size, warmup, o->window, buf);
    else if (o->raw_mpi) mpi_stream(rank, size, warmup, o->window, buf);
    else if (o->handlers) mr_h_stream(rank, size, warmup);
    else mr_stream(rank, size, warmup);
    for (int i = 0; i < o->reps; i++) {
        double t;
        MPI_Barrier(MPI_COMM_WORLD);
        t = o->raw_async  ? mpi_stream_async(rank, size, o->count, o->window, buf)
            : o->raw_mpi  ? mpi_stream(rank, size, o->count, o->window, buf)
            : o->handlers ? mr_h_stream(rank, size, o->count)
                          : mr_stream(rank, size, o->count);
        if (t < r.seconds) r.seconds = t;
    }
    if (o->latency) {
        MPI_Barrier(MPI_COMM_WORLD);
        r.latency_us = 1e6 * (o->raw_mpi    ? mpi_pingpong(rank, size, rounds, buf)
                              : o->handlers ? mr_h_pingpong(rank, size, rounds)
                                            : mr_pingpong(rank, size, rounds));
    }
    return r;
}

int main(int argc, char **argv)
{
    perf_options_t o = {0};
    int rank, size;
    const char *substrate = "mpi-raw", *flowctl = "-";
    char *buf = NULL;
    FILE *csv = NULL;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (perf_parse(argc, argv, &o) != 0 || size < 2) {
        if (rank == 0) perf_usage();
        MPI_Finalize();
        return 2;
    }
    if (o.raw_async) substrate = "mpi-raw-async";
    if (!o.raw_mpi) {
        MPI_Comm comm = MPI_COMM_WORLD;
        mr_status_t st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) {
            fprintf(stderr, "mailrail_perf: mr_init failed: %s\n", mr_status_string(st));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        substrate = mr_substrate_name();
        flowctl = mr_flowctl_name();
        if (o.handlers) perf_h_register();
        if (o.copy) {
            perf_h_copy = true;
            perf_h_data = malloc(mr_datagram_size());
            if (perf_h_data == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
            memset(perf_h_data, 0x5a, mr_datagram_size());
        }
        size_t largest = o.handlers ? mr_datagram_size() - 1 : mr_datagram_size();
        for (int i = 0; i < o.nsizes; i++) {
            if (o.items ? o.sizes[i] == 0 || o.sizes[i] > 64 : o.sizes[i] > largest) {
                if (rank == 0 && o.items) {
                    fprintf(stderr, "mailrail_perf: item sizes are 1 to 64 bytes\n");
                } else if (rank == 0) {
                    fprintf(stderr, "mailrail_perf: size %zu exceeds MAILRAIL_DATAGRAM_SIZE=%zu%s\n",
                            o.sizes[i], mr_datagram_size(),
                            o.handlers ? " less the handler's id byte" : "");
                }
                mr_finalize();
                MPI_Finalize();
                return 2;
            }
        }
    } else {
        size_t largest = 0;
        for (int i = 0; i < o.nsizes; i++) largest = o.sizes[i] > largest ? o.sizes[i] : largest;
        buf = calloc((size_t)o.window, largest ? largest : 1);
    }
    if (rank == 0 && o.csv != NULL) csv = fopen(o.csv, "a");
    if (o.instructions) {
#ifndef MR_HAVE_CALLGRIND
        if (rank == 0) fprintf(stderr, "mailrail_perf: -I needs a build with valgrind's headers\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
#endif
        if (o.items || (o.raw_mpi && !o.raw_async)) {
            if (rank == 0) fprintf(stderr, "mailrail_perf: -I measures MailRail's loops, or -a's\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        for (int i = 0; i < o.nsizes; i++) perf_instructions(&o, rank, o.sizes[i], buf);
        if (!o.raw_mpi) mr_finalize();
        free(buf);
        MPI_Finalize();
        return 0;
    }
    if (o.items) {
        perf_items_report(&o, rank, csv);
        if (csv != NULL) fclose(csv);
        mr_finalize();
        MPI_Finalize();
        return 0;
    }
    if (csv != NULL && ftell(csv) == 0) {
        fprintf(csv, "substrate,flowctl,size,messages,seconds,msg_rate,mbytes_per_s,"
                     "latency_us\n");
    }
    if (rank == 0) {
        printf("# mailrail_perf: substrate %s, flow control %s%s, %ld messages x %d repetitions "
               "(best)\n# %10s %14s %12s %12s\n", substrate, flowctl,
               o.handlers ? ", through handlers" : "", o.count, o.reps, "bytes",
               "messages/s", "MB/s", "latency us");
    }
    double rate_sum = 0;
    for (int i = 0; i < o.nsizes; i++) {
        perf_result_t r = perf_measure(&o, rank, o.sizes[i], buf);
        double rate = (double)o.count / r.seconds;
        double mbs = rate * (double)o.sizes[i] / 1e6;
        rate_sum += rate;
        if (rank == 0) {
            printf("  %10zu %14.0f %12.1f %12.2f\n", o.sizes[i], rate, mbs, r.latency_us);
            if (csv != NULL) {
                fprintf(csv, "%s,%s,%zu,%ld,%.6f,%.0f,%.2f,%.3f\n", substrate, flowctl,
                        o.sizes[i], o.count, r.seconds, rate, mbs, r.latency_us);
            }
        }
    }
    if (rank == 0) {
        printf("mailrail_perf: %s/%s, %d sizes, mean message rate %.0f messages/s\n", substrate,
               flowctl, o.nsizes, rate_sum / o.nsizes);
        fflush(stdout);
    }
    if (csv != NULL) fclose(csv);
    free(buf);
    if (!o.raw_mpi && rank < 2 && getenv("MR_PERF_STATS") != NULL) {
        mr_stats_t st = {.size = sizeof(st)};
        mr_get_stats(&st);
        fprintf(stderr, "rank %d: deferred %llu, credit returns sent %llu received %llu, "
                "piggybacked %llu, zero-credit %.3f s, peak receive slots %llu, coalesced %llu, "
                "reserve failures %llu\n", rank,
                (unsigned long long)st.deferred_sends, (unsigned long long)st.credit_returns_sent,
                (unsigned long long)st.credit_returns_received,
                (unsigned long long)st.piggybacked_credits, (double)st.zero_credit_ns * 1e-9,
                (unsigned long long)st.peak_recv_slots_in_use,
                (unsigned long long)st.messages_coalesced, (unsigned long long)st.reserve_failures);
    }
    if (!o.raw_mpi) mr_finalize();
    free(perf_h_data);
    MPI_Finalize();
    return 0;
}
