/*
 * mailrail_incast: the adversarial incast benchmark of the MailRail paper.
 *
 *   mpiexec -n 8 mailrail_incast [options]
 *     -v VICTIMS    number of victim ranks, chosen at random (default 1)
 *     -V RANKS      the victim ranks themselves, comma-separated (instead of -v), e.g.
 *                   the first rank of each victim host of tools/fabric/fabric.sh
 *     -b BYTES      message size, at most MAILRAIL_DATAGRAM_SIZE (default: the datagram size)
 *     -m MESSAGES   messages sent by every rank (default 20000)
 *     -t TRIALS     trials per policy (default 3)
 *     -p POLICIES   comma-separated flow-control policies to compare (default: MAILRAIL_FLOWCTL)
 *     -s SEED       seed for the victims and the send orders (default: a fresh one, printed)
 *     -c FILE       append one CSV row per trial and policy to FILE
 *     -i PERIOD_MS  sub-second statistics every PERIOD_MS milliseconds, written per rank
 *                   to STATS_PREFIX.<policy>.<trial>.<rank>.csv at the end of each trial
 *     -o PREFIX     STATS_PREFIX (default incast_stats)
 *     -w            wait (mr_wait, 1 ms at most) instead of spinning when there is nothing
 *                   to do: for ranks that outnumber cores, as on tools/fabric/
 *     -W MS         -w, sleeping at most MS milliseconds at a time (default 1)
 *     -P COMMAND    rank 0 runs COMMAND (with sh) before and after each trial; it prints
 *                   cumulative "bytes packets drops" of the bottleneck (tools/fabric's
 *                   $FABRIC_PORT_COUNTERS), and each trial's differences go to the CSV
 *     -d            dial inside the timed run: leave out the mr_connect() to the victims
 *                   that every trial makes before its clock starts (measures dialing)
 *     -S            start each rank's clock as it leaves a barrier, as before 2026-12-07,
 *                   instead of at one instant of the wall clock for all (incast_start()):
 *                   for machines whose clocks are not synchronized
 *     -q            quiet: only the summary lines
 *
 * CPU cost: every rank measures the CPU seconds it spent in each trial
 * (getrusage(RUSAGE_SELF), user + system, so that MPI's and UCX's threads
 * count too), from the start of the clock until global quiescence:
 * the same span on every rank, waiting included. (A sender that handed its
 * messages to the kernel early, as under `none`, would otherwise stop its
 * count while it still woke every millisecond.) Their sum over all ranks is
 * reported as cpu_s, and per MiB delivered to the victims as cpu_s_per_mib,
 * in the summary lines and the CSV. What a trial costs outside its clock
 * follows them in the CSV, the slowest rank's wall seconds in each phase:
 * init_s (mr_init_mpi), connect_s (mr_connect), around_s (drawing the
 * sends, agreeing when the clock starts, and quiescence after it stops),
 * checks_s (the checks and reductions after quiescence) and finalize_s
 * (mr_finalize). Then start_skew_s, how long after the first rank the last
 * started its clock, and span_s, the first start to the last end (wall
 * clock): with -S, ranks leave the barrier apart when hundreds share a core.
 *
 * The policies are interleaved: trial 0 of every policy, then trial 1, and so
 * on, so that a slow phase of a shared machine does not fall on one policy.
 * With -i a victim's samples also hold its receive slots in use and the
 * credits it has granted and not yet seen arrive, per sending node.
 * Every rank sends MESSAGES messages, each to a victim drawn at random (never
 * itself), and receives aggressively: before its first send, while waiting for
 * a send buffer and after each send. There is no compute. Only the
 * communication is timed: from an instant agreed by all ranks (or with -S a
 * barrier) to the moment the last message arrived (every victim learns before
 * the clock starts how many messages it will receive) and every sender's
 * deferred sends were handed over. Global quiescence (mr_quiesce) follows,
 * untimed, before the checks. Ranks wait in the reductions before the clock
 * and in quiescence with -w without spinning. Each trial initializes MailRail
 * afresh with the policy under test, so that counters and peaks are per trial.
 * Every message carries its source and its sequence number among those its
 * source sends to that victim, and bytes derived from them; every victim
 * checks each message as it arrives (source, sequence number due next from
 * that source, length, every byte) and the first fault ends the job with an
 * error that names the source and the sequence number ("message 42 from rank 3
 * arrived twice"). Each victim knows before the clock starts how many messages
 * each rank will send it: when some are still due and nothing has arrived or
 * left for MAILRAIL_TIMEOUT seconds, it names the first missing one. After
 * quiescence, the totals (count, bytes and a checksum) are compared with what
 * was sent, and MailRail's credit invariants are checked
 * (tool_invariants_hold()).
 */
#include "mailrail.h"
#include "tool_common.h"
#include "tool_mpi.h"

#include <errno.h>
#include <inttypes.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INCAST_MAX_POLICIES 3
#define INCAST_MAX_TRIALS 64

typedef struct incast_options {
    int victims;
    const char *victim_list; /* -V, or NULL to draw them. */
    size_t bytes;
    long messages;
    int trials;
    const char *policies[INCAST_MAX_POLICIES];
    int npolicies;
    unsigned seed;
    bool seed_given;         /* -s; else rank 0 draws a fresh seed. */
    const char *csv;
    double period_s;
    const char *stats_prefix;
    bool quiet;
    bool dial_in_run;        /* -d: no mr_connect() before the clock. */
    bool barrier_start;      /* -S: each rank's clock starts as it leaves a barrier. */
    bool wait;               /* -w: mr_wait() when idle, */
    int wait_ms;             /* for at most this long (-W). */
    const char *port_command; /* -P, or NULL. */
} incast_options_t;

/* One sample of the sub-second statistics. */
typedef struct incast_sample {
    double t;
    uint64_t sent, sent_bytes, received, received_bytes;
    double max_send_gap, max_recv_gap;
    double epoch;            /* Wall clock (s since 1970), to align with outside samplers. */
    uint64_t slots_in_use;   /* Victims: receive slots held. */
} incast_sample_t;

/*
 * The untimed phases of a trial, each rank's wall seconds in it: what a trial
 * costs besides its clock (a 1,024-rank trial takes minutes for a few seconds
 * of traffic).
 */
typedef enum {
    INCAST_INIT,     /* mr_init_mpi(). */
    INCAST_CONNECT,  /* mr_connect() to the victims (0 with -d). */
    INCAST_AROUND,   /* Around the clock: drawing the sends, its start, quiescence. */
    INCAST_CHECKS,   /* From the end of quiescence to mr_finalize(): checks, reductions. */
    INCAST_FINALIZE, /* mr_finalize(). */
    INCAST_PHASES
} incast_phase_t;

/* What one rank measured in one trial. */
typedef struct incast_trial {
    double seconds;          /* Max over ranks. */
    uint64_t bits_received;  /* Sum over victims. */
    uint64_t peak_slots;     /* Max over victims. */
    uint64_t peak_rss_kb;    /* Max over victims. */
    uint64_t credit_returns; /* Sum over ranks. */
    uint64_t deferred;       /* Sum over ranks. */
    double cpu_s;            /* CPU seconds in the timed part, sum over ranks. */
    int nodes;               /* As MailRail sees them. */
    bool verified;
    long long port[3];       /* -P: bytes, packets, drops during the trial; -1 without. */
    double phase_s[INCAST_PHASES]; /* Untimed phases, max over ranks (incast_phase_t). */
    double start_skew_s; /* The last rank's clock start after the first's (wall clock). */
    double span_s;       /* The first rank's clock start to the last rank's end (wall clock). */
} incast_trial_t;

/* What every message starts with; bytes derived from it follow. */
typedef struct incast_header {
    uint64_t seq;            /* Among the messages its source sends to this victim. */
    int64_t source;
} incast_header_t;

typedef struct incast_rank {
    int rank, size;
    bool is_victim;
    int *victims;            /* opts.victims ranks. */
    int *order;              /* Per message: the index of its victim, drawn before the clock. */
    uint64_t expect;         /* Victims: messages that will come in this trial. */
    /* Sent per victim (index into victims): messages, bytes, checksum. */
    uint64_t *sent_count, *sent_bytes, *sent_sum;
    uint64_t recv_count, recv_bytes, recv_sum;
    /* Sub-second statistics. */
    incast_sample_t *samples;
    size_t nsamples, max_samples;
    uint32_t *granted;       /* Victims: max_samples x nodes credits outstanding per node. */
    uint32_t *holders;       /* Scratch for mr_get_credit_grants(): one per rank. */
    int nodes;               /* Nodes as MailRail sees them (per trial). */
    bool have_grants;        /* The policy grants credits. */
    double start, next_sample, last_send, last_recv, max_send_gap, max_recv_gap;
    double wall_start, wall_end; /* The clock's start and end on the wall clock. */
    uint64_t sent_total, sent_total_bytes;
    /* Victims, per source: the sequence number due next, and how many will come. */
    uint64_t *next, *due;
    uint64_t missing;        /* Messages still due to this victim. */
    double last_progress;    /* When a message last arrived or left. */
    unsigned timeout_s;      /* MAILRAIL_TIMEOUT. */
    const char *policy;      /* The trial under way, for the error messages. */
    int trial;
    unsigned seed;
} incast_rank_t;

/* The checksum of message `seq` from `source`, and the base of its payload words. */
static uint64_t incast_tag(int source, uint64_t seq)
{
    uint64_t state = ((uint64_t)source << 40) ^ (seq + 0x9E3779B97F4A7C15ull);
    return tool_random(&state);
}

/* The payload word `k` (k >= 2) of a message whose tag is `tag`. */
static inline uint64_t incast_word(uint64_t tag, size_t k)
{
    return tag + (uint64_t)k * 0x9E3779B97F4A7C15ull;
}

/* Writes message `seq` of `source` to its victim into buf[0..bytes): header, then words. */
static void incast_fill(uint8_t *buf, size_t bytes, int source, uint64_t seq)
{
    incast_header_t h = {.seq = seq, .source = source};
    uint64_t tag = incast_tag(source, seq);
    size_t k = sizeof(h) / 8;

    memcpy(buf, &h, sizeof(h));
    for (; (k + 1) * 8 <= bytes; k++) {
        uint64_t w = incast_word(tag, k);
        memcpy(buf + k * 8, &w, 8);
    }
    if (k * 8 < bytes) {
        uint64_t w = incast_word(tag, k);
        memcpy(buf + k * 8, &w, bytes - k * 8);
    }
}

/*
 * Names what broke exactly-once delivery, with the trial and the seed that
 * reproduce it, and stops the job: the other ranks may wait for messages or
 * a quiescence that cannot come.
 */
static void incast_fail(const incast_rank_t *r, const char *format, ...)
{
    char what[512];
    va_list ap;

    va_start(ap, format);
    vsnprintf(what, sizeof(what), format, ap);
    va_end(ap);
    /* One write, so that the launcher does not interleave it with other ranks' lines. */
    fprintf(stderr, "mailrail_incast: rank %d: %s (%s, trial %d, seed %u: rerun with -s %u)\n",
            r->rank, what, r->policy, r->trial, r->seed, r->seed);
    tool_abort();
}

/*
 * Checks one message as it arrives: to a victim, from the source it claims,
 * the sequence number due next from that source (each once, in order per
 * source, as MailRail promises), the length and every byte.
 */
static void incast_check(incast_rank_t *r, const mr_message_t *m, size_t bytes)
{
    const uint8_t *p = m->data;
    incast_header_t h;

    if (!r->is_victim) {
        incast_fail(r, "a message of %zu bytes from rank %d came to a rank that is no victim",
                    m->length, m->source);
    }
    if (m->source < 0 || m->source >= r->size || m->length < sizeof(h)) {
        incast_fail(r, "a message of %zu bytes from rank %d has no header", m->length, m->source);
    }
    memcpy(&h, p, sizeof(h));
    if (h.source != m->source) {
        incast_fail(r, "message %" PRIu64 " from rank %d says it comes from rank %" PRId64, h.seq,
                    m->source, h.source);
    }
    uint64_t due = r->next[m->source];
    if (h.seq < due) {
        incast_fail(r, "message %" PRIu64 " from rank %d arrived twice", h.seq, m->source);
    }
    if (h.seq >= r->due[m->source]) {
        incast_fail(r, "message %" PRIu64 " from rank %d is beyond the %" PRIu64 " it sends here",
                    h.seq, m->source, r->due[m->source]);
    }
    if (h.seq > due) {
        incast_fail(r, "message %" PRIu64 " from rank %d is missing: message %" PRIu64
                    " arrived before it", due, m->source, h.seq);
    }
    if (m->length != bytes) {
        incast_fail(r, "message %" PRIu64 " from rank %d has %zu bytes, not %zu", h.seq, m->source,
                    m->length, bytes);
    }
    uint64_t tag = incast_tag(m->source, h.seq);
    for (size_t k = sizeof(h) / 8; k * 8 < bytes; k++) {
        uint64_t w = incast_word(tag, k), got = 0;
        size_t n = bytes - k * 8 < 8 ? bytes - k * 8 : 8;
        memcpy(&got, p + k * 8, n);
        if (n < 8) w &= (1ull << (8 * n)) - 1;
        if (got != w) {
            incast_fail(r, "message %" PRIu64 " from rank %d: bytes %zu to %zu differ from what "
                        "was sent", h.seq, m->source, k * 8, k * 8 + n - 1);
        }
    }
    r->next[m->source]++;
    r->missing--;
}

/*
 * Bounds every wait of a trial: with messages still due to this victim and
 * nothing arriving or leaving for MAILRAIL_TIMEOUT seconds, the first one
 * missing is named (lost); with none due, nothing happening for three times
 * as long means the job is stuck elsewhere. `what` is what this rank waits for.
 */
static void incast_watch(const incast_rank_t *r, const char *what)
{
    double idle = tool_now() - r->last_progress;

    if (r->missing > 0 && idle > r->timeout_s) {
        for (int s = 0; s < r->size; s++) {
            if (r->next[s] == r->due[s]) continue;
            incast_fail(r, "message %" PRIu64 " from rank %d never arrived: nothing came for %u s "
                        "(MAILRAIL_TIMEOUT) while waiting for %s, with %" PRIu64
                        " message(s) missing", r->next[s], s, r->timeout_s, what, r->missing);
        }
    }
    if (idle > 3.0 * r->timeout_s) {
        incast_fail(r, "nothing arrived or left for %u s (3 x MAILRAIL_TIMEOUT) while waiting "
                    "for %s, with nothing due here: another rank is stuck or misses messages",
                    3 * r->timeout_s, what);
    }
}

/* The credits this victim has outstanding, summed per sending node, into row[nodes]. */
static void incast_sample_grants(incast_rank_t *r, uint32_t *row)
{
    int holders = 0;

    memset(row, 0, (size_t)r->nodes * sizeof(*row));
    if (!r->have_grants ||
        mr_get_credit_grants(r->holders, r->size, &holders) != MR_OK) return;
    bool per_rank = holders == r->size && strcmp(mr_flowctl_name(), "rank") == 0;
    int own = mr_node_of(r->rank);
    for (int h = 0; h < holders && h < r->size; h++) {
        int node = per_rank ? mr_node_of(h) : h;
        /* The victim's own node holds its static share: no network in between. */
        if (node >= 0 && node < r->nodes && node != own) row[node] += r->holders[h];
    }
}

static void incast_sample(incast_rank_t *r, double now)
{
    incast_sample_t *s;

    if (r->samples == NULL || now < r->next_sample || r->nsamples == r->max_samples) return;
    s = &r->samples[r->nsamples++];
    s->t = now - r->start;
    s->sent = r->sent_total;
    s->sent_bytes = r->sent_total_bytes;
    s->received = r->recv_count;
    s->received_bytes = r->recv_bytes;
    s->max_send_gap = r->max_send_gap;
    s->max_recv_gap = r->max_recv_gap;
    s->epoch = tool_wall_now();
    if (r->is_victim) {
        mr_stats_t st = {.size = sizeof(st)};
        if (mr_get_stats(&st) == MR_OK) s->slots_in_use = st.recv_slots_in_use;
        incast_sample_grants(r, r->granted + (r->nsamples - 1) * (size_t)r->nodes);
    }
    r->max_send_gap = r->max_recv_gap = 0;
    while (r->next_sample <= now) r->next_sample += 1.0; /* Replaced by the period below. */
}

/* Receives everything that is there; checks and counts it. */
static mr_status_t incast_receive_all(incast_rank_t *r, size_t bytes)
{
    mr_message_t m;
    mr_status_t st;
    double now = tool_now();

    if (now - r->last_recv > r->max_recv_gap) r->max_recv_gap = now - r->last_recv;
    r->last_recv = now;
    while ((st = mr_receive(&m)) == MR_OK) {
        incast_header_t h;
        incast_check(r, &m, bytes);
        memcpy(&h, m.data, sizeof(h));
        r->recv_count++;
        r->recv_bytes += m.length;
        r->recv_sum += incast_tag(m.source, h.seq);
        r->last_progress = now;
        mr_release(m.data);
    }
    return st == MR_AGAIN ? MR_OK : st;
}

/* Nothing to do but wait: receive, and with -w sleep until news if nothing came. */
static mr_status_t incast_idle(const incast_options_t *o, incast_rank_t *r, size_t bytes,
                               const char *what)
{
    uint64_t before = r->recv_count;
    mr_status_t st = incast_receive_all(r, bytes);

    incast_watch(r, what);
    if (st != MR_OK || !o->wait || r->recv_count != before) return st;
    st = mr_wait(o->wait_ms);
    return st == MR_AGAIN ? MR_OK : st;
}

typedef struct incast_run {
    const incast_options_t *o;
    incast_rank_t *r;
    double period_s;
} incast_run_t;

/* -w: collectives wait without spinning (see incast_wait). */
static bool incast_sleepy;
static long incast_crowd_nap_ns;

/*
 * Completes `req`; with -w without spinning: napping up to 5 ms between tests,
 * or, with more ranks than CPUs, the crowd's nap from the first test (at 513
 * ranks on two cores, MPICH's collectives waited for with 5 ms naps took up
 * to 5.6 s, with 20 ms naps 0.3-0.9 s: docs/scale.md).
 */
static void incast_wait(MPI_Request *req)
{
    if (incast_sleepy && incast_crowd_nap_ns > 0) {
        tool_mpi_nap_wait(req, incast_crowd_nap_ns);
    } else {
        tool_mpi_wait(req, incast_sleepy ? 5000000 : 0);
    }
}

static void incast_allreduce(const void *in, void *out, int n, MPI_Datatype type, MPI_Op op)
{
    MPI_Request req;

    MPI_Iallreduce(in, out, n, type, op, MPI_COMM_WORLD, &req);
    incast_wait(&req);
}

/*
 * Draws every message's victim (never oneself) and tells each victim how many
 * will come from each rank, before the clock starts.
 */
static void incast_draw(const incast_options_t *o, incast_rank_t *r, uint64_t *rng)
{
    int others = o->victims - (r->is_victim ? 1 : 0);
    uint64_t *mine = calloc((size_t)o->victims, sizeof(uint64_t));
    uint64_t *all = calloc((size_t)o->victims * (size_t)r->size, sizeof(uint64_t));
    MPI_Request req;

    if (mine == NULL || all == NULL) {
        fprintf(stderr, "mailrail_incast: rank %d: out of memory\n", r->rank);
        tool_abort();
    }
    for (long i = 0; others > 0 && i < o->messages; i++) {
        int k = (int)(tool_random(rng) % (uint64_t)others), v = 0;
        for (;; v++) {
            if (r->victims[v] == r->rank) continue;
            if (k-- == 0) break;
        }
        r->order[i] = v;
        mine[v]++;
    }
    MPI_Iallgather(mine, o->victims, MPI_UINT64_T, all, o->victims, MPI_UINT64_T, MPI_COMM_WORLD,
                   &req);
    incast_wait(&req);
    r->expect = 0;
    for (int s = 0; s < r->size; s++) {
        r->next[s] = r->due[s] = 0;
        for (int v = 0; v < o->victims; v++) {
            if (r->victims[v] == r->rank) r->due[s] = all[(size_t)s * (size_t)o->victims + v];
        }
        r->expect += r->due[s];
    }
    r->missing = r->expect;
    free(mine);
    free(all);
}

/*
 * The barrier that starts the clock with -S. With -w it sleeps between tests,
 * so that hundreds of ranks per core leave the early ones the cores
 * (MPI_Barrier spins).
 */
static void incast_barrier(void)
{
    MPI_Request req;

    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    incast_wait(&req);
}

/*
 * Where the clock starts: without -S, at one instant of the wall clock for
 * every rank. Ranks leave a barrier seconds apart when hundreds share a core
 * (2-4 s at 1,025 ranks on two cores), as long as the line needs for all the
 * data, so a clock started by each rank as it leaves one times mostly the
 * scheduler. Two reductions agree on the instant: the first says when the
 * last rank came (E1), the second how long after it the last rank left the
 * first (D) and when the last came to the second (E2); every rank has left
 * the second by about E2 + D, and the clock starts at E2 + 2 D + 2 ms. A rank
 * that learns the instant after it passed starts at once, and start_skew_s
 * shows it. Exact on one machine; across machines as good as their clocks'
 * synchronization (-S where they are not synchronized).
 */
static void incast_start(const incast_options_t *o)
{
    double in[2], out[2];

    if (o->barrier_start) {
        incast_barrier();
        return;
    }
    in[0] = tool_wall_now();
    incast_allreduce(in, out, 1, MPI_DOUBLE, MPI_MAX);
    double e1 = out[0];
    in[1] = tool_wall_now();
    in[0] = in[1] - e1;
    incast_allreduce(in, out, 2, MPI_DOUBLE, MPI_MAX);
    double at = out[1] + 2 * out[0] + 0.002;
    struct timespec ts = {.tv_sec = (time_t)at};
    ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/*
 * One trial's communication: sends, receives, quiescence. Returns this rank's
 * seconds and the CPU seconds it spent in them (the untimed quiescence excluded).
 */
static mr_status_t incast_communicate(incast_run_t *run, uint64_t *rng, double *seconds,
                                      double *cpu)
{
    const incast_options_t *o = run->o;
    incast_rank_t *r = run->r;
    size_t bytes = o->bytes;
    mr_status_t st;
    int others = o->victims - (r->is_victim ? 1 : 0);

    incast_draw(o, r, rng);
    incast_start(o);
    double cpu0 = tool_cpu_s();
    r->start = r->last_send = r->last_recv = r->last_progress = tool_now();
    r->wall_start = tool_wall_now();
    r->next_sample = r->start;
    st = incast_receive_all(r, bytes);
    for (long i = 0; st == MR_OK && others > 0 && i < o->messages; i++) {
        int v = r->order[i];
        void *buf;
        while ((st = mr_reserve(&buf)) == MR_AGAIN) {
            st = incast_idle(o, r, bytes, "a send buffer");
            if (st != MR_OK) break;
        }
        if (st != MR_OK) break;
        uint64_t seq = r->sent_count[v], tag = incast_tag(r->rank, seq);
        incast_fill(buf, bytes, r->rank, seq);
        st = mr_send(buf, bytes, r->victims[v]);
        if (st != MR_OK) break;
        r->sent_count[v]++;
        r->sent_bytes[v] += bytes;
        r->sent_sum[v] += tag;
        r->sent_total++;
        r->sent_total_bytes += bytes;
        double now = tool_now();
        if (now - r->last_send > r->max_send_gap) r->max_send_gap = now - r->last_send;
        r->last_send = r->last_progress = now;
        st = incast_receive_all(r, bytes);
        if (run->period_s > 0 && now >= r->next_sample) {
            incast_sample(r, now);
            r->next_sample = r->start + run->period_s * (double)r->nsamples;
        }
    }
    /* Until everything expected arrived and every deferred send was handed over. */
    while (st == MR_OK) {
        st = incast_receive_all(r, bytes);
        if (st != MR_OK) break;
        double now = tool_now();
        if (run->period_s > 0 && now >= r->next_sample) {
            incast_sample(r, now);
            r->next_sample = r->start + run->period_s * (double)r->nsamples;
        }
        mr_stats_t stats = {.size = sizeof(stats)};
        st = mr_get_stats(&stats);
        if (st != MR_OK || (r->recv_count >= r->expect && stats.deferred_now == 0)) break;
        st = incast_idle(o, r, bytes, "the messages due");
    }
    *seconds = tool_now() - r->start;
    r->wall_end = tool_wall_now();
    if (run->period_s > 0) {
        r->next_sample = 0;
        incast_sample(r, tool_now());
    }
    /* Global quiescence, untimed: nothing may be left in flight for the checks. */
    while (st == MR_OK) {
        st = incast_receive_all(r, bytes);
        if (st != MR_OK) break;
        st = mr_quiesce();
        if (st == MR_OK) break;
        st = st == MR_AGAIN ? incast_idle(o, r, bytes, "quiescence") : st;
    }
    *cpu = tool_cpu_s() - cpu0;
    return st;
}

/* Checks that every victim received exactly what all ranks sent to it. */
static bool incast_verify(const incast_options_t *o, incast_rank_t *r)
{
    uint64_t *mine = calloc(3 * (size_t)o->victims, sizeof(uint64_t));
    uint64_t *total = calloc(3 * (size_t)o->victims, sizeof(uint64_t));
    int ok = 1, all_ok = 0;

    for (int v = 0; v < o->victims; v++) {
        mine[3 * v] = r->sent_count[v];
        mine[3 * v + 1] = r->sent_bytes[v];
        mine[3 * v + 2] = r->sent_sum[v];
    }
    incast_allreduce(mine, total, 3 * o->victims, MPI_UINT64_T, MPI_SUM);
    if (r->is_victim) {
        int v = 0;
        while (r->victims[v] != r->rank) v++;
        ok = total[3 * v] == r->recv_count && total[3 * v + 1] == r->recv_bytes &&
             total[3 * v + 2] == r->recv_sum;
        if (!ok) {
            fprintf(stderr, "mailrail_incast: victim %d received %llu messages / %llu bytes, "
                    "%llu / %llu were sent to it, checksums %s\n", r->rank,
                    (unsigned long long)r->recv_count, (unsigned long long)r->recv_bytes,
                    (unsigned long long)total[3 * v], (unsigned long long)total[3 * v + 1],
                    total[3 * v + 2] == r->recv_sum ? "match" : "differ");
        }
    } else {
        ok = r->recv_count == 0;
    }
    incast_allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN);
    free(mine);
    free(total);
    return all_ok;
}

static void incast_write_samples(const incast_options_t *o, incast_rank_t *r, const char *policy,
                                 int trial)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s.%s.%d.%d.csv", o->stats_prefix, policy, trial, r->rank);
    f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return;
    }
    fprintf(f, "rank,elapsed_s,sent,sent_bytes,received,received_bytes,send_complete_pct,"
               "recv_complete_pct,max_send_gap_s,max_recv_gap_s,epoch_s,recv_slots_in_use");
    for (int n = 0; n < r->nodes; n++) fprintf(f, ",granted_node%d", n);
    fprintf(f, "\n");
    uint64_t expect_recv = 0;
    if (r->is_victim) expect_recv = r->recv_count; /* Known once the trial is over. */
    for (size_t i = 0; i < r->nsamples; i++) {
        incast_sample_t *s = &r->samples[i];
        long sends = o->victims - (r->is_victim ? 1 : 0) > 0 ? o->messages : 0;
        fprintf(f, "%d,%.6f,%llu,%llu,%llu,%llu,%.2f,%.2f,%.6f,%.6f", r->rank, s->t,
                (unsigned long long)s->sent, (unsigned long long)s->sent_bytes,
                (unsigned long long)s->received, (unsigned long long)s->received_bytes,
                sends ? 100.0 * (double)s->sent / (double)sends : 100.0,
                expect_recv ? 100.0 * (double)s->received / (double)expect_recv : 100.0,
                s->max_send_gap, s->max_recv_gap);
        fprintf(f, ",%.6f,%llu", s->epoch, (unsigned long long)s->slots_in_use);
        for (int n = 0; n < r->nodes; n++) {
            fprintf(f, ",%u", r->is_victim && r->granted ? r->granted[i * (size_t)r->nodes + n] : 0);
        }
        fprintf(f, "\n");
    }
    fclose(f);
}

/* Runs one trial of one policy; fills *out identically on every rank. */
static mr_status_t incast_trial(const incast_options_t *o, incast_rank_t *r, const char *policy,
                                int trial, incast_trial_t *out)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    mr_stats_t stats = {.size = sizeof(stats)};
    incast_run_t run = {.o = o, .r = r, .period_s = o->period_s};
    uint64_t rng = 0x853c49e6748fea9bull ^ ((uint64_t)o->seed << 32) ^ (uint64_t)r->rank ^
                   ((uint64_t)trial << 16);
    double seconds, cpu = 0;
    double phase[INCAST_PHASES] = {0}, t0 = tool_now();
    mr_status_t st;

    r->policy = policy;
    r->trial = trial;
    r->seed = o->seed;
    setenv("MAILRAIL_FLOWCTL", policy, 1);
    st = mr_init_mpi(&comm, sizeof(comm));
    if (st != MR_OK) return st;
    phase[INCAST_INIT] = tool_now() - t0;
    if (o->bytes > mr_datagram_size()) {
        if (r->rank == 0) {
            fprintf(stderr, "mailrail_incast: -b %zu exceeds MAILRAIL_DATAGRAM_SIZE=%zu\n",
                    o->bytes, mr_datagram_size());
        }
        mr_finalize();
        return MR_ERR_MESSAGE_TOO_LONG;
    }
    memset(r->sent_count, 0, (size_t)o->victims * sizeof(uint64_t));
    memset(r->sent_bytes, 0, (size_t)o->victims * sizeof(uint64_t));
    memset(r->sent_sum, 0, (size_t)o->victims * sizeof(uint64_t));
    r->recv_count = r->recv_bytes = r->recv_sum = 0;
    r->sent_total = r->sent_total_bytes = 0;
    r->nsamples = 0;
    r->max_send_gap = r->max_recv_gap = 0;
    r->have_grants = strcmp(policy, "none") != 0;
    if (r->samples != NULL && r->is_victim && r->nodes != mr_node_count()) {
        free(r->granted);
        r->nodes = mr_node_count();
        r->granted = calloc(r->max_samples * (size_t)r->nodes, sizeof(*r->granted));
        if (r->granted == NULL) r->nodes = 0;
    }
    if (!r->is_victim || r->samples == NULL) r->nodes = 0;
    tool_reset_peak_rss();
    /* Every connection a trial uses is made before its clock starts: it times flow control. */
    t0 = tool_now();
    if (!o->dial_in_run && (st = mr_connect(r->victims, o->victims)) != MR_OK) {
        fprintf(stderr, "mailrail_incast: rank %d: mr_connect() to the victims: %s\n", r->rank,
                mr_status_string(st));
        mr_finalize();
        return st;
    }
    phase[INCAST_CONNECT] = tool_now() - t0;

    long long before[3] = {-1, -1, -1}, after[3] = {-1, -1, -1};
    bool probed = r->rank == 0 && o->port_command != NULL &&
                  tool_port_probe("mailrail_incast", o->port_command, before);
    t0 = tool_now();
    st = incast_communicate(&run, &rng, &seconds, &cpu);
    phase[INCAST_AROUND] = tool_now() - t0 - seconds;
    t0 = tool_now();
    mr_get_stats(&stats);
    uint64_t rss = tool_peak_rss_kb();
    if (probed && tool_port_probe("mailrail_incast", o->port_command, after)) {
        for (int i = 0; i < 3; i++) out->port[i] = after[i] - before[i];
    } else {
        for (int i = 0; i < 3; i++) out->port[i] = -1;
    }
    if (st != MR_OK) {
        fprintf(stderr, "mailrail_incast: rank %d: %s\n", r->rank, mr_status_string(st));
        mr_finalize();
        return st;
    }
    out->verified = incast_verify(o, r);
    if (o->period_s > 0) incast_write_samples(o, r, policy, trial);

    /* Victims' bits, peaks; everyone's credit returns and deferrals. */
    uint64_t mine[5] = {r->is_victim ? r->recv_bytes * 8 : 0, r->is_victim ? stats.peak_recv_slots_in_use : 0,
                        r->is_victim ? rss : 0, stats.credit_returns_sent, stats.deferred_sends};
    uint64_t sum[5], max[5];
    incast_allreduce(mine, sum, 5, MPI_UINT64_T, MPI_SUM);
    incast_allreduce(mine, max, 5, MPI_UINT64_T, MPI_MAX);
    incast_allreduce(&seconds, &out->seconds, 1, MPI_DOUBLE, MPI_MAX);
    /*
     * How far apart the clocks started (seconds with -S when hundreds of
     * ranks share a core; a rank that learned the agreed instant late without
     * it), and the span from the first start to the last end, on the wall
     * clock.
     */
    double wall[3] = {-r->wall_start, r->wall_start, r->wall_end}, latest[3];
    incast_allreduce(wall, latest, 3, MPI_DOUBLE, MPI_MAX);
    out->start_skew_s = latest[1] + latest[0];
    out->span_s = latest[2] + latest[0];
    incast_allreduce(&cpu, &out->cpu_s, 1, MPI_DOUBLE, MPI_SUM);
    out->nodes = mr_node_count();
    out->bits_received = sum[0];
    out->peak_slots = max[1];
    out->peak_rss_kb = max[2];
    out->credit_returns = sum[3];
    out->deferred = sum[4];
    if (!tool_invariants_hold("mailrail_incast")) {
        fprintf(stderr, "mailrail_incast: %s trial %d, seed %u (rerun with -s %u)\n", policy,
                trial, o->seed, o->seed);
        tool_abort();
    }
    phase[INCAST_CHECKS] = tool_now() - t0;
    t0 = tool_now();
    st = mr_finalize();
    phase[INCAST_FINALIZE] = tool_now() - t0;
    /* MPI outlives MailRail here: the slowest rank's phases, on every rank. */
    incast_allreduce(phase, out->phase_s, INCAST_PHASES, MPI_DOUBLE, MPI_MAX);
    return st;
}

/* Reads -V: `n` distinct ranks below `size`, comma-separated. */
static bool incast_parse_victims(const char *list, int size, int *victims, int n)
{
    char buf[1024], *save = NULL;
    int k = 0;

    if (strlen(list) >= sizeof(buf)) return false;
    strcpy(buf, list);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (k == n || !tool_parse_int(tok, 0, size - 1, &victims[k])) return false;
        for (int i = 0; i < k; i++) {
            if (victims[i] == victims[k]) return false;
        }
        k++;
    }
    return k == n;
}

static int incast_parse(int argc, char **argv, incast_options_t *o)
{
    static char policy_buf[64];
    const char *policies = getenv("MAILRAIL_FLOWCTL") ? getenv("MAILRAIL_FLOWCTL") : "none";
    long period_ms = 0, bytes = 0;
    bool ok = true;
    int c;

    o->victims = 1;
    o->messages = 20000;
    o->trials = 3;
    o->stats_prefix = "incast_stats";
    o->wait_ms = 1;
    while ((c = getopt(argc, argv, "v:V:b:m:t:p:s:c:i:o:P:W:dqSwh")) != -1) {
        switch (c) {
        case 'v': ok &= tool_parse_int(optarg, 1, INT_MAX, &o->victims); break;
        case 'V': o->victim_list = optarg; break;
        case 'b': ok &= tool_parse_long(optarg, 0, LONG_MAX, &bytes); break;
        case 'm': ok &= tool_parse_long(optarg, 0, LONG_MAX, &o->messages); break;
        case 't': ok &= tool_parse_int(optarg, 1, INCAST_MAX_TRIALS, &o->trials); break;
        case 'p': policies = optarg; break;
        case 's': ok &= tool_parse_unsigned(optarg, &o->seed); o->seed_given = true; break;
        case 'c': o->csv = optarg; break;
        case 'i': ok &= tool_parse_long(optarg, 0, 3600000, &period_ms); break;
        case 'o': o->stats_prefix = optarg; break;
        case 'q': o->quiet = true; break;
        case 'w': o->wait = true; break;
        case 'd': o->dial_in_run = true; break;
        case 'S': o->barrier_start = true; break;
        case 'W': o->wait = true; ok &= tool_parse_int(optarg, 0, 60000, &o->wait_ms); break;
        case 'P': o->port_command = optarg; break;
        default: return -1;
        }
    }
    if (o->victim_list != NULL) {
        o->victims = 1;
        for (const char *c = o->victim_list; *c != '\0'; c++) o->victims += *c == ',';
    }
    o->npolicies = tool_split_policies(policies, policy_buf, sizeof(policy_buf), o->policies,
                                       INCAST_MAX_POLICIES);
    o->bytes = (size_t)bytes;
    o->period_s = (double)period_ms / 1000.0;
    return ok && o->npolicies > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    incast_options_t o = {0};
    incast_rank_t r = {0};
    FILE *csv = NULL;
    int status = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    int parsed = incast_parse(argc, argv, &o);
    incast_sleepy = o.wait;
    incast_crowd_nap_ns = tool_mpi_crowd_nap_ns();
    if (parsed != 0 || o.victims > r.size) {
        if (r.rank == 0) {
            fprintf(stderr, "usage: mpiexec -n N mailrail_incast [-v victims<=N | -V rank,rank...] [-b bytes] "
                            "[-m messages] [-t trials] [-p none,rank,node] [-s seed] "
                            "[-c file.csv] [-i period_ms] [-o stats_prefix] [-P command] [-w | -W ms] [-d] "
                            "[-S] [-q]\n");
        }
        MPI_Finalize();
        return 2;
    }
    if (o.bytes == 0) {
        /* The datagram size, as MailRail will read it. */
        const char *d = getenv("MAILRAIL_DATAGRAM_SIZE");
        char *end;
        o.bytes = d ? strtoul(d, &end, 10) : 4096;
        if (d && (*end == 'K' || *end == 'k')) o.bytes <<= 10;
        if (d && (*end == 'M' || *end == 'm')) o.bytes <<= 20;
    }
    if (o.bytes < sizeof(incast_header_t)) {
        /* Every message carries its source and sequence number. */
        if (r.rank == 0) {
            fprintf(stderr, "mailrail_incast: -b %zu: messages need at least %zu bytes\n", o.bytes,
                    sizeof(incast_header_t));
        }
        MPI_Finalize();
        return 2;
    }
    /* A fresh seed unless -s gave one: rank 0's, so that every rank draws with the same. */
    if (!o.seed_given && r.rank == 0) o.seed = tool_fresh_seed();
    MPI_Bcast(&o.seed, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
    r.timeout_s = tool_timeout_s();

    /* Rank 0 draws the victims with the seed (or reads -V); everybody learns them. */
    r.victims = calloc((size_t)o.victims, sizeof(int));
    if (o.victim_list != NULL && !incast_parse_victims(o.victim_list, r.size, r.victims,
                                                       o.victims)) {
        if (r.rank == 0) {
            fprintf(stderr, "mailrail_incast: -V %s: give distinct ranks below %d, "
                            "comma-separated\n", o.victim_list, r.size);
        }
        free(r.victims);
        MPI_Finalize();
        return 2;
    }
    if (r.rank == 0 && o.victim_list == NULL) {
        uint64_t rng = 0x9E3779B97F4A7C15ull ^ o.seed;
        int *perm = malloc((size_t)r.size * sizeof(int));
        for (int i = 0; i < r.size; i++) perm[i] = i;
        for (int i = r.size - 1; i > 0; i--) {
            int j = (int)(tool_random(&rng) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        memcpy(r.victims, perm, (size_t)o.victims * sizeof(int));
        free(perm);
    }
    MPI_Bcast(r.victims, o.victims, MPI_INT, 0, MPI_COMM_WORLD);
    for (int v = 0; v < o.victims; v++) r.is_victim |= r.victims[v] == r.rank;
    r.sent_count = calloc((size_t)o.victims, sizeof(uint64_t));
    r.sent_bytes = calloc((size_t)o.victims, sizeof(uint64_t));
    r.sent_sum = calloc((size_t)o.victims, sizeof(uint64_t));
    r.order = calloc(o.messages > 0 ? (size_t)o.messages : 1, sizeof(int));
    r.next = calloc((size_t)r.size, sizeof(*r.next));
    r.due = calloc((size_t)r.size, sizeof(*r.due));
    if (r.sent_count == NULL || r.sent_bytes == NULL || r.sent_sum == NULL || r.order == NULL ||
        r.next == NULL || r.due == NULL) {
        fprintf(stderr, "mailrail_incast: rank %d: out of memory\n", r.rank);
        tool_abort();
    }
    if (o.period_s > 0) {
        r.max_samples = 1 << 16;
        r.samples = calloc(r.max_samples, sizeof(*r.samples));
        r.holders = calloc((size_t)r.size, sizeof(*r.holders));
    }
    if (r.rank == 0) {
        printf("# mailrail_incast: %d ranks, %d victim(s) (%s):", r.size, o.victims,
               o.victim_list != NULL ? "named" : "drawn with the seed");
        for (int v = 0; v < o.victims; v++) printf(" %d", r.victims[v]);
        printf("; %ld messages of %zu bytes per rank; %d trial(s) per policy; seed %u\n",
               o.messages, o.bytes, o.trials, o.seed);
        if (o.csv != NULL) {
            csv = fopen(o.csv, "a");
            if (csv != NULL && ftell(csv) == 0) {
                fprintf(csv, "policy,trial,ranks,nodes,victims,bytes,messages_per_rank,seconds,"
                             "goodput_gbps,victim_peak_recv_slots,victim_peak_rss_kb,"
                             "credit_returns,deferred_sends,verified,port_bytes,port_packets,"
                             "port_drops,cpu_s,cpu_s_per_mib,init_s,connect_s,around_s,checks_s,"
                             "finalize_s,start_skew_s,span_s\n");
            }
        }
        if (!o.quiet) {
            printf("# %-6s %5s %10s %12s %10s %12s %10s %10s %s %9s %10s\n", "policy", "trial",
                   "seconds", "goodput Gb/s", "peak slots", "peak RSS MiB", "returns",
                   "deferred", "verified", "CPU s", "CPU s/MiB");
        }
        fflush(stdout);
    }

    /* Trial-major: every policy's trial k runs before any policy's trial k + 1. */
    double secs[INCAST_MAX_POLICIES][INCAST_MAX_TRIALS], gbps[INCAST_MAX_POLICIES][INCAST_MAX_TRIALS];
    double cpu[INCAST_MAX_POLICIES][INCAST_MAX_TRIALS], cpu_mib[INCAST_MAX_POLICIES][INCAST_MAX_TRIALS];
    incast_trial_t last[INCAST_MAX_POLICIES];
    memset(last, 0, sizeof(last));
    for (int k = 0; k < o.trials && status == 0; k++) {
        for (int p = 0; p < o.npolicies && status == 0; p++) {
            incast_trial_t t = {0};
            mr_status_t st = incast_trial(&o, &r, o.policies[p], k, &t);
            if (st != MR_OK || !t.verified) {
                if (r.rank == 0) {
                    fprintf(stderr, "mailrail_incast: %s trial %d failed: %s (seed %u: rerun "
                            "with -s %u)\n", o.policies[p], k,
                            st != MR_OK ? mr_status_string(st) : "verification failed", o.seed,
                            o.seed);
                }
                status = 1;
                break;
            }
            secs[p][k] = t.seconds;
            gbps[p][k] = (double)t.bits_received / t.seconds / 1e9;
            /* CPU seconds per MiB delivered to the victims (0 when nothing was). */
            double mib = (double)t.bits_received / 8.0 / 1048576.0;
            cpu[p][k] = t.cpu_s;
            cpu_mib[p][k] = mib > 0 ? t.cpu_s / mib : 0;
            last[p] = t;
            if (r.rank != 0) continue;
            if (!o.quiet) {
                printf("  %-6s %5d %10.4f %12.3f %10llu %12.1f %10llu %10llu %-8s %9.3f %10.4f\n",
                       o.policies[p], k, t.seconds, gbps[p][k], (unsigned long long)t.peak_slots,
                       (double)t.peak_rss_kb / 1024.0, (unsigned long long)t.credit_returns,
                       (unsigned long long)t.deferred, "yes", t.cpu_s, cpu_mib[p][k]);
                fflush(stdout);
            }
            if (csv != NULL) {
                fprintf(csv, "%s,%d,%d,%d,%d,%zu,%ld,%.6f,%.4f,%llu,%llu,%llu,%llu,1,%lld,%lld,%lld,"
                             "%.4f,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f\n",
                        o.policies[p], k, r.size, t.nodes, o.victims, o.bytes, o.messages,
                        t.seconds, gbps[p][k], (unsigned long long)t.peak_slots,
                        (unsigned long long)t.peak_rss_kb, (unsigned long long)t.credit_returns,
                        (unsigned long long)t.deferred, t.port[0], t.port[1], t.port[2], t.cpu_s,
                        cpu_mib[p][k], t.phase_s[INCAST_INIT], t.phase_s[INCAST_CONNECT],
                        t.phase_s[INCAST_AROUND], t.phase_s[INCAST_CHECKS],
                        t.phase_s[INCAST_FINALIZE], t.start_skew_s, t.span_s);
                fflush(csv);
            }
        }
    }
    for (int p = 0; p < o.npolicies && status == 0 && r.rank == 0; p++) {
        double base = tool_median(secs[0], o.trials), mine = tool_median(secs[p], o.trials);
        printf("mailrail_incast: %s: median %.4f s, %.3f Gb/s goodput, speedup over %s "
               "%.2fx, victim peak %llu receive slots, %llu credit returns, "
               "cpu_s %.3f, cpu_s_per_mib %.4f\n",
               o.policies[p], mine, tool_median(gbps[p], o.trials), o.policies[0], base / mine,
               (unsigned long long)last[p].peak_slots, (unsigned long long)last[p].credit_returns,
               tool_median(cpu[p], o.trials), tool_median(cpu_mib[p], o.trials));
        fflush(stdout);
    }
    if (csv != NULL) fclose(csv);
    free(r.victims);
    free(r.sent_count);
    free(r.sent_bytes);
    free(r.sent_sum);
    free(r.order);
    free(r.next);
    free(r.due);
    free(r.samples);
    free(r.granted);
    free(r.holders);
    MPI_Finalize();
    return status;
}
