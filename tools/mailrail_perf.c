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
 *     -w WINDOW   raw MPI only: sends in flight per MPI_Waitall (default 64)
 *     -l          also measure ping-pong latency
 *     -m          raw MPI baseline: MPI_Isend/MPI_Irecv windows, no MailRail
 *     -c FILE     append results as CSV to FILE
 *
 * Rank 0 streams COUNT messages to rank 1 as fast as it can (through
 * mr_reserve/mr_send, receiving while backpressured); rank 1 receives and
 * releases them and answers with one message; the time from the first send
 * to that answer gives the rate. Other ranks only take part in init and
 * finalize. Prints one line per size and a summary line.
 */
#include "mailrail.h"
#include "tool_common.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    const char *csv;
} perf_options_t;

typedef struct perf_result {
    double seconds;      /* Best of the repetitions. */
    double latency_us;   /* One-way, half a round trip; 0 when not measured. */
} perf_result_t;

static void perf_usage(void)
{
    fprintf(stderr, "usage: mpiexec -n 2 mailrail_perf [-s sizes] [-n count] [-r reps] "
                    "[-w window] [-l] [-m] [-c file.csv]\n");
}

static int perf_parse(int argc, char **argv, perf_options_t *o)
{
    const char *sizes = "8,64,512,4096";
    bool ok = true;
    int c;

    o->count = 100000;
    o->reps = 3;
    o->window = 64;
    while ((c = getopt(argc, argv, "s:n:r:w:lmc:h")) != -1) {
        switch (c) {
        case 's': sizes = optarg; break;
        case 'n': ok &= tool_parse_long(optarg, 1, LONG_MAX, &o->count); break;
        case 'r': ok &= tool_parse_int(optarg, 1, 1000, &o->reps); break;
        case 'w': ok &= tool_parse_int(optarg, 1, 1 << 20, &o->window); break;
        case 'l': o->latency = true; break;
        case 'm': o->raw_mpi = true; break;
        case 'c': o->csv = optarg; break;
        default: return -1;
        }
    }
    for (const char *p = sizes; *p != '\0' && o->nsizes < PERF_MAX_SIZES;) {
        char *end;
        o->sizes[o->nsizes++] = strtoul(p, &end, 10);
        if (end == p) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return ok && o->nsizes > 0 ? 0 : -1;
}

/* ---- Through MailRail ------------------------------------------------------------------ */

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

static double mr_stream(int rank, size_t size, long count)
{
    double start = tool_now();
    mr_message_t m;

    if (rank == 0) {
        for (long i = 0; i < count; i++) {
            void *buf;
            while (mr_reserve(&buf) != MR_OK) {
                if (mr_receive(&m) == MR_OK) mr_release(m.data);
            }
            mr_send(buf, size, 1);
        }
        mr_wait_one(); /* The receiver's answer: everything arrived. */
    } else if (rank == 1) {
        for (long got = 0; got < count;) {
            if (mr_receive(&m) == MR_OK) {
                mr_release(m.data);
                got++;
            }
        }
        mr_send_one(0, 1);
    }
    return tool_now() - start;
}

static double mr_pingpong(int rank, size_t size, long rounds)
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

/* ---- Plain MPI, the baseline ------------------------------------------------------------- */

static double mpi_stream(int rank, size_t size, long count, int window, char *buf)
{
    MPI_Request *req = malloc((size_t)window * sizeof(*req));
    MPI_Status *st = malloc((size_t)window * sizeof(*st));
    double start = tool_now();
    char ack = 0;

    for (long sent = 0; sent < count && rank < 2;) {
        int n = count - sent < window ? (int)(count - sent) : window;
        for (int i = 0; i < n; i++) {
            if (rank == 0) MPI_Isend(buf, (int)size, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &req[i]);
            else MPI_Irecv(buf + (size_t)i * size, (int)size, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Waitall(n, req, st);
        sent += n;
    }
    if (rank == 0) MPI_Recv(&ack, 1, MPI_BYTE, 1, PERF_ACK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rank == 1) MPI_Send(&ack, 1, MPI_BYTE, 0, PERF_ACK_TAG, MPI_COMM_WORLD);
    free(req);
    free(st);
    return tool_now() - start;
}

static double mpi_pingpong(int rank, size_t size, long rounds, char *buf)
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

/* ---- Driver ---------------------------------------------------------------------------- */

static perf_result_t perf_measure(const perf_options_t *o, int rank, size_t size, char *buf)
{
    perf_result_t r = {.seconds = 1e30};
    long warmup = o->count / 10 > 0 ? o->count / 10 : 1;
    long rounds = o->count / 10 > 100 ? o->count / 10 : 100;

    /* A short untimed run first: connections, registration caches, page faults. */
    if (o->raw_mpi) mpi_stream(rank, size, warmup, o->window, buf);
    else mr_stream(rank, size, warmup);
    for (int i = 0; i < o->reps; i++) {
        double t;
        MPI_Barrier(MPI_COMM_WORLD);
        t = o->raw_mpi ? mpi_stream(rank, size, o->count, o->window, buf)
                       : mr_stream(rank, size, o->count);
        if (t < r.seconds) r.seconds = t;
    }
    if (o->latency) {
        MPI_Barrier(MPI_COMM_WORLD);
        r.latency_us = 1e6 * (o->raw_mpi ? mpi_pingpong(rank, size, rounds, buf)
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
    if (!o.raw_mpi) {
        MPI_Comm comm = MPI_COMM_WORLD;
        mr_status_t st = mr_init_mpi(&comm, sizeof(comm));
        if (st != MR_OK) {
            fprintf(stderr, "mailrail_perf: mr_init failed: %s\n", mr_status_string(st));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        substrate = mr_substrate_name();
        flowctl = mr_flowctl_name();
        for (int i = 0; i < o.nsizes; i++) {
            if (o.sizes[i] > mr_datagram_size()) {
                if (rank == 0) {
                    fprintf(stderr, "mailrail_perf: size %zu exceeds MAILRAIL_DATAGRAM_SIZE=%zu\n",
                            o.sizes[i], mr_datagram_size());
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
    if (rank == 0 && o.csv != NULL) {
        csv = fopen(o.csv, "a");
        if (csv != NULL && ftell(csv) == 0) {
            fprintf(csv, "substrate,flowctl,size,messages,seconds,msg_rate,mbytes_per_s,"
                         "latency_us\n");
        }
    }
    if (rank == 0) {
        printf("# mailrail_perf: substrate %s, flow control %s, %ld messages x %d repetitions "
               "(best)\n# %10s %14s %12s %12s\n", substrate, flowctl, o.count, o.reps, "bytes",
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
                "piggybacked %llu, zero-credit %.3f s, peak receive slots %llu\n", rank,
                (unsigned long long)st.deferred_sends, (unsigned long long)st.credit_returns_sent,
                (unsigned long long)st.credit_returns_received,
                (unsigned long long)st.piggybacked_credits, (double)st.zero_credit_ns * 1e-9,
                (unsigned long long)st.peak_recv_slots_in_use);
    }
    if (!o.raw_mpi) mr_finalize();
    MPI_Finalize();
    return 0;
}
