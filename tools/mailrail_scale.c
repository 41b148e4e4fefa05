/*
 * mailrail_scale: what starting, using and ending MailRail costs per rank at
 * a given job size, beside MPICH's own start.
 *
 *   mpiexec -n P mailrail_scale [-d PEERS] [-m MESSAGES] [-s BYTES] [-c CSV] [-x]
 *   mpiexec -n P mailrail_scale -b [-c CSV]
 *
 * Each rank times MPI_Init (MPICH alone), then mr_init(), sends MESSAGES
 * messages of BYTES bytes to each of PEERS peers spread over the job (rank
 * r sends to r + k * (P / (PEERS + 1)), k = 1..PEERS), receives and checks
 * what the mirror-image peers sent it (source and every byte, exactly once),
 * waits for quiescence and times mr_finalize(). It reads its resident memory
 * (VmRSS), its open descriptors and mr_stats_t (peers connected, bootstrap
 * collectives and bytes) after MPI_Init, after mr_init() and after the
 * traffic, and its resident high-water mark at the end. Rank 0 prints one line per measure (the maximum and the mean over
 * ranks) and, with -c, appends one CSV row. -x (for the tests) also fails
 * the job when a message is missing, doubled or corrupt, or when a rank holds
 * connections to more peers than it talked to (2 x PEERS) plus its two ring
 * neighbours, or more descriptors or memory than those connections and a
 * constant allowance: untouched peers must cost nothing. -b runs MPICH alone: MPI_Init, one MPI_Allreduce, MPI_Finalize.
 * Idle ranks sleep in mr_wait(), so that hundreds of ranks share two cores.
 */
#include "mailrail.h"
#include "tool_common.h"

#include <dirent.h>
#include <mpi.h>
#include <unistd.h>

/* The measures, in the order of the CSV columns after substrate, policy and ranks. */
enum {
    M_MPI_INIT_S,        /* MPI_Init (MPICH's own start). */
    M_MR_INIT_S,         /* mr_init() after MPI_Init. */
    M_MPI_INIT_CPU_S,    /* CPU time (user and system) of this rank in MPI_Init ... */
    M_MR_INIT_CPU_S,     /* ... and in mr_init(): its own work, whatever the others' wait. */
    M_TRAFFIC_S,         /* The sparse exchange and quiescence. */
    M_MR_FINALIZE_S,     /* mr_finalize(). */
    M_RSS_MPI_MB,        /* Resident memory after MPI_Init. */
    M_RSS_INIT_MB,       /* ... after mr_init(). */
    M_RSS_END_MB,        /* ... after the traffic. */
    M_RSS_PEAK_MB,       /* The resident high-water mark (MPICH's start sets it). */
    M_FDS_MPI,           /* Open descriptors after MPI_Init. */
    M_FDS_INIT,          /* ... after mr_init(). */
    M_FDS_END,           /* ... after the traffic. */
    M_PEERS_INIT,        /* Peers connected after mr_init() (the ring: at most 2). */
    M_PEERS_END,         /* ... after the traffic. */
    M_INIT_COLLECTIVES,  /* Bootstrap collectives of mr_init(). */
    M_INIT_KB,           /* KiB this rank put into them. */
    M_COUNT
};

static const char *const measure_names[M_COUNT] = {
    "mpi_init_s", "mr_init_s", "mpi_init_cpu_s", "mr_init_cpu_s", "traffic_s", "mr_finalize_s", "rss_mpi_mb", "rss_init_mb",
    "rss_end_mb", "rss_peak_mb", "fds_mpi", "fds_init", "fds_end", "peers_init", "peers_end",
    "init_collectives", "init_kb"};

/*
 * -x: what MailRail may hold besides one connection (and 64 KiB) per peer it
 * talked to, whatever the job's size: its listener, epoll and UCX's own
 * descriptors (13 with UCX 1.13), and the pools and UCX's worker (about 6 MiB).
 */
#define STRICT_OWN_FDS 32
#define STRICT_OWN_MB 12.0

typedef struct header {
    int32_t source;
    uint32_t seq;
} header_t;

static int rank, size;

static uint8_t pattern(int source, uint32_t seq, size_t i)
{
    return (uint8_t)(source * 131 + seq * 7 + i * 29 + 3);
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (d == NULL) return -1;
    while (readdir(d) != NULL) n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor. */
}

/* This process's resident memory now (VmRSS) in MiB, or 0. */
static double rss_now_mb(void)
{
    return (double)tool_status_kb("VmRSS: %llu kB") / 1024;
}

static void fail(const char *what)
{
    fprintf(stderr, "mailrail_scale: rank %d: %s\n", rank, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* fail() with the source and the sequence number of the message at fault. */
static void fail_message(uint32_t seq, int source, const char *what)
{
    char text[160];

    snprintf(text, sizeof(text), "message %u from rank %d %s", (unsigned)seq, source, what);
    fail(text);
}

static void check(mr_status_t st, const char *what)
{
    char text[256];

    if (st == MR_OK) return;
    snprintf(text, sizeof(text), "%s: %s", what, mr_status_string(st));
    fail(text);
}

/* Peer k (1..npeers) of `r` that it sends to; its mirror sends to r. */
static int peer_of(int r, int k, int step)
{
    return (int)(((long)r + (long)k * step) % size);
}

static int source_of(int r, int k, int step)
{
    return (int)((((long)r - (long)k * step) % size + size) % size);
}

/* Takes one message: its source must be one of ours, each (source, seq) once, every byte right. */
static void take(const mr_message_t *m, uint8_t *seen, int npeers, int step, uint32_t messages,
                 size_t bytes, uint64_t *got)
{
    header_t h;
    int k;

    if (m->length < sizeof(h)) fail("a message is shorter than its header");
    memcpy(&h, m->data, sizeof(h));
    if (h.source != m->source) fail_message(h.seq, m->source, "names another source");
    for (k = 1; k <= npeers && source_of(rank, k, step) != m->source; k++) {
    }
    if (k > npeers) fail_message(h.seq, m->source, "came from a rank that sends us nothing");
    if (h.seq >= messages) fail_message(h.seq, m->source, "is beyond the messages it sends");
    if (m->length != bytes) fail_message(h.seq, m->source, "has the wrong length");
    for (size_t i = sizeof(h); i < bytes; i++) {
        if (((const uint8_t *)m->data)[i] != pattern(h.source, h.seq, i)) {
            fail_message(h.seq, m->source, "is corrupt");
        }
    }
    /* Two of our sources may be one rank in a small job: one tally per source rank. */
    uint8_t *slot = &seen[(size_t)m->source * messages + h.seq];
    if (*slot) fail_message(h.seq, m->source, "arrived twice");
    *slot = 1;
    (*got)++;
}

static uint64_t receive_all(uint8_t *seen, int npeers, int step, uint32_t messages, size_t bytes)
{
    mr_message_t m;
    mr_status_t st;
    uint64_t got = 0;

    while ((st = mr_receive(&m)) == MR_OK) {
        take(&m, seen, npeers, step, messages, bytes, &got);
        check(mr_release(m.data), "mr_release");
    }
    if (st != MR_AGAIN) check(st, "mr_receive");
    return got;
}

/* Names the first message due to this rank that has not arrived, if any, and fails. */
static void fail_missing(const uint8_t *seen, int npeers, int step, uint32_t messages,
                         const char *what)
{
    for (int k = 1; k <= npeers; k++) {
        int src = source_of(rank, k, step);
        if (src == rank) continue;
        for (uint32_t seq = 0; seq < messages; seq++) {
            if (!seen[(size_t)src * messages + seq]) fail_message(seq, src, "never arrived");
        }
    }
    fail(what);
}

/* The sparse exchange, every message checked; fails the job on a missing or wrong one. */
static void traffic(int npeers, uint32_t messages, size_t bytes, double *v)
{
    int step = size / (npeers + 1) > 0 ? size / (npeers + 1) : 1;
    uint8_t *seen = calloc((size_t)size * messages, 1);
    uint64_t expected = 0, got = 0;
    double start = tool_now(), deadline = start + 600;
    mr_status_t st;

    if (seen == NULL) fail("out of memory");
    /* In a small job two of the k may name one rank, or this one: count distinct sources. */
    for (int k = 1; k <= npeers; k++) {
        int src = source_of(rank, k, step);
        bool dup = src == rank;
        for (int j = 1; j < k && !dup; j++) dup = source_of(rank, j, step) == src;
        if (!dup) expected += messages;
    }
    for (uint32_t seq = 0; seq < messages; seq++) {
        for (int k = 1; k <= npeers; k++) {
            int dest = peer_of(rank, k, step);
            bool dup = dest == rank;
            void *buf;

            for (int j = 1; j < k && !dup; j++) dup = peer_of(rank, j, step) == dest;
            if (dup) continue;
            while ((st = mr_reserve(&buf)) == MR_AGAIN) {
                got += receive_all(seen, npeers, step, messages, bytes);
                if (tool_now() > deadline) {
                    fail_missing(seen, npeers, step, messages, "no send buffer for 600 s");
                }
            }
            check(st, "mr_reserve");
            header_t h = {rank, seq};
            memcpy(buf, &h, sizeof(h));
            for (size_t i = sizeof(h); i < bytes; i++) ((uint8_t *)buf)[i] = pattern(rank, seq, i);
            check(mr_send(buf, bytes, dest), "mr_send");
        }
    }
    /* Messages still due while nothing arrives for MAILRAIL_TIMEOUT: the first missing is named. */
    double last_arrival = tool_now(), quiet_s = tool_timeout_s();
    do {
        uint64_t more = receive_all(seen, npeers, step, messages, bytes);
        got += more;
        if (more > 0) last_arrival = tool_now();
        st = mr_quiesce();
        if (st == MR_AGAIN) mr_wait(1);
        if (got < expected && tool_now() - last_arrival > quiet_s) {
            char why[96];
            snprintf(why, sizeof(why),
                     "nothing arrived for %.0f s (MAILRAIL_TIMEOUT) with messages due", quiet_s);
            fail_missing(seen, npeers, step, messages, why);
        }
        if (tool_now() > deadline) {
            fail_missing(seen, npeers, step, messages, "no quiescence within 600 s");
        }
    } while (st == MR_AGAIN);
    check(st, "mr_quiesce");
    got += receive_all(seen, npeers, step, messages, bytes);
    if (got != expected) fail_missing(seen, npeers, step, messages, "quiesced with messages missing");
    free(seen);
    v[M_TRAFFIC_S] = tool_now() - start;
}

static void usage(void)
{
    fprintf(stderr, "usage: mailrail_scale [-d PEERS] [-m MESSAGES] [-s BYTES] [-c CSV] [-x] | -b "
                    "[-c CSV]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int npeers = 4, opt;
    uint32_t messages = 16;
    size_t bytes = 64;
    const char *csv = NULL;
    bool baseline = false, strict = false;
    double v[M_COUNT] = {0}, vmax[M_COUNT], vsum[M_COUNT], t0;
    mr_stats_t stats = {.size = sizeof(stats)};

    while ((opt = getopt(argc, argv, "d:m:s:c:xb")) != -1) {
        uint64_t n;
        switch (opt) {
        case 'd':
            if (!tool_parse_int(optarg, 0, 1 << 20, &npeers)) usage();
            break;
        case 'm':
            if (!tool_parse_uint(optarg, 1, 1u << 24, &n)) usage();
            messages = (uint32_t)n;
            break;
        case 's':
            if (!tool_parse_uint(optarg, sizeof(header_t), 1u << 20, &n)) usage();
            bytes = (size_t)n;
            break;
        case 'c': csv = optarg; break;
        case 'x': strict = true; break;
        case 'b': baseline = true; break;
        default: usage();
        }
    }
    t0 = tool_now();
    double c0 = tool_cpu_s();
    MPI_Init(&argc, &argv);
    v[M_MPI_INIT_S] = tool_now() - t0;
    v[M_MPI_INIT_CPU_S] = tool_cpu_s() - c0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    v[M_RSS_MPI_MB] = rss_now_mb();
    v[M_FDS_MPI] = open_fds();
    if (!baseline) {
        MPI_Comm comm = MPI_COMM_WORLD;
        t0 = tool_now();
        c0 = tool_cpu_s();
        check(mr_init_mpi(&comm, sizeof(comm)), "mr_init");
        v[M_MR_INIT_S] = tool_now() - t0;
        v[M_MR_INIT_CPU_S] = tool_cpu_s() - c0;
        v[M_RSS_INIT_MB] = rss_now_mb();
        v[M_FDS_INIT] = open_fds();
        check(mr_get_stats(&stats), "mr_get_stats");
        v[M_PEERS_INIT] = (double)stats.peers_connected;
        v[M_INIT_COLLECTIVES] = (double)stats.init_collectives;
        v[M_INIT_KB] = (double)stats.init_bootstrap_bytes / 1024;
        if (npeers > 0) traffic(npeers, messages, bytes, v);
        v[M_RSS_END_MB] = rss_now_mb();
        v[M_FDS_END] = open_fds();
        check(mr_get_stats(&stats), "mr_get_stats");
        v[M_PEERS_END] = (double)stats.peers_connected;
        /* Untouched peers cost nothing: connections, descriptors and memory by peers talked to. */
        double talked = 2.0 * npeers + 2;
        if (strict && (v[M_PEERS_INIT] > 2 || v[M_PEERS_END] > talked)) {
            char text[160];
            snprintf(text, sizeof(text), "holds connections to %.0f peers after init and %.0f "
                     "after talking to %d, more than the ring's 2 plus 2 x %d", v[M_PEERS_INIT],
                     v[M_PEERS_END], npeers, npeers);
            fail(text);
        }
        if (strict && v[M_FDS_END] - v[M_FDS_MPI] > talked + STRICT_OWN_FDS) {
            char text[160];
            snprintf(text, sizeof(text), "MailRail holds %.0f descriptors after talking to %d "
                     "peers, more than %.0f", v[M_FDS_END] - v[M_FDS_MPI], npeers,
                     talked + STRICT_OWN_FDS);
            fail(text);
        }
        if (strict && v[M_RSS_END_MB] - v[M_RSS_MPI_MB] > STRICT_OWN_MB + talked / 16) {
            char text[160];
            snprintf(text, sizeof(text), "MailRail added %.1f MiB of resident memory, more than "
                     "%.1f", v[M_RSS_END_MB] - v[M_RSS_MPI_MB], STRICT_OWN_MB + talked / 16);
            fail(text);
        }
        if (!tool_invariants_hold("mailrail_scale")) fail("credit invariants broken");
        t0 = tool_now();
        check(mr_finalize(), "mr_finalize");
        v[M_MR_FINALIZE_S] = tool_now() - t0;
    } else {
        int one = 1, sum = 0;
        MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (sum != size) fail("MPI_Allreduce gave a wrong sum");
    }
    v[M_RSS_PEAK_MB] = (double)tool_peak_rss_kb() / 1024;
    MPI_Reduce(v, vmax, M_COUNT, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(v, vsum, M_COUNT, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        const char *sub = baseline ? "mpich" : getenv("MAILRAIL_SUBSTRATE");
        const char *pol = baseline ? "-" : getenv("MAILRAIL_FLOWCTL");
        FILE *f = csv != NULL ? fopen(csv, "a") : NULL;

        sub = sub != NULL ? sub : "ucx";
        pol = pol != NULL ? pol : "none";
        printf("%s, %s, %d ranks%s\n", sub, pol, size,
               baseline ? " (MPI_Init, one MPI_Allreduce, MPI_Finalize)" : "");
        for (int i = 0; i < M_COUNT; i++) {
            printf("  %-17s max %10.3f  mean %10.3f\n", measure_names[i], vmax[i],
                   vsum[i] / size);
        }
        if (csv != NULL && f == NULL) fail("cannot open the CSV file");
        if (f != NULL) {
            fseek(f, 0, SEEK_END);
            if (ftell(f) == 0) {
                fprintf(f, "substrate,policy,ranks,peers,messages");
                for (int i = 0; i < M_COUNT; i++) {
                    fprintf(f, ",%s_max,%s_mean", measure_names[i], measure_names[i]);
                }
                fputc('\n', f);
            }
            fprintf(f, "%s,%s,%d,%d,%u", sub, pol, size, baseline ? 0 : npeers, messages);
            for (int i = 0; i < M_COUNT; i++) fprintf(f, ",%.6g,%.6g", vmax[i], vsum[i] / size);
            fputc('\n', f);
            fclose(f);
        }
    }
    MPI_Finalize();
    return 0;
}
