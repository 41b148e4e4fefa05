/*
 * mailrail_chaos: an incast that must survive faults (tools/fabric/chaos.sh
 * injects them: loss, a link down, duplication, reordering, ranks killed).
 *
 *   mpiexec -n N mailrail_chaos -v VICTIM -m MESSAGES [-b BYTES] [-k RANKS] [-T SECONDS]
 *                               [-s SPREAD]
 *
 * Every rank but VICTIM sends MESSAGES checked messages of BYTES bytes
 * (default 4096) to VICTIM, whose contents derive from (source, sequence);
 * the victim checks every byte and that each arrives once. RANKS
 * (comma-separated) are the ranks the fault may kill: a survivor must then
 * get one MR_ERR_PEER_FAILED per killed rank, within SECONDS (default 60),
 * and go on; the victim waits for every message of every other sender.
 * SPREAD (seconds, default 0) paces the senders: message i leaves no sooner
 * than SPREAD * i / MESSAGES after the start, so that a fault struck in
 * mid-run finds every sender still sending.
 * At the end the victim tells each surviving sender it is done (a message
 * of its own), so that no rank leaves while others still need its credits.
 *
 * Each process forks before MPI_Init and the child is the rank: MPICH's
 * hydra ends the whole job when a process it started dies of a signal, so
 * the parent waits and exits normally (0 when its rank was killed by
 * SIGKILL, the fault that chaos.sh injects; the rank's own status else).
 *
 * Each rank prints one line: "chaos rank R: sent S received X duplicated D
 * corrupt C lost L failures F first_failure_epoch T last_failure_epoch T2 seconds S status ST
 * verdict ok|FAIL"
 * (ST: the mr_status_t of the run, 0 when it ended well).
 */
#include "mailrail.h"
#include "tool_common.h"

#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHAOS_MAX_RANKS 4096
/*
 * The end, in three messages of their own, so that no survivor leaves (which
 * the others would see as a failure) before every survivor has counted:
 * the victim's DONE (every message arrived), each sender's READY (it counted),
 * the victim's GO (everyone counted: finalize).
 */
#define CHAOS_DONE_SEQ UINT32_MAX
#define CHAOS_READY_SEQ (UINT32_MAX - 1)
#define CHAOS_GO_SEQ (UINT32_MAX - 2)

typedef struct chaos_head {
    uint32_t source, seq, length, sum;
} chaos_head_t;

typedef struct chaos_opts {
    int victim;
    uint32_t messages;
    uint32_t bytes;
    double limit_s;
    double spread_s; /* Senders pace their messages over at least this. */
    bool may_die[CHAOS_MAX_RANKS];
    int killable;
} chaos_opts_t;

typedef struct chaos_tally {
    uint64_t sent, received, duplicated, corrupt, failures;
    double first_failure;   /* Wall clock, or 0. */
    double last_failure;    /* Wall clock, or 0. */
    uint8_t *seen;          /* Victim: per (source, seq). */
    uint32_t *count;        /* Victim: per source. */
    bool done, go;          /* Sender: the victim's DONE and GO came. */
    int ready;              /* Victim: the senders' READY that came. */
    char first_fault[160];  /* Victim: the first duplicate or corrupt message, named, ... */
    char first_missing[96]; /* ... and the first from a surviving sender that never came. */
} chaos_tally_t;

/* Names the first message that broke exactly-once delivery (the report prints it). */
static void chaos_fault(chaos_tally_t *t, const char *what, int source, uint32_t seq)
{
    if (t->first_fault[0] != '\0') return;
    snprintf(t->first_fault, sizeof(t->first_fault), "message %u from rank %d %s", seq, source,
             what);
}

static uint8_t chaos_byte(uint32_t source, uint32_t seq, size_t k)
{
    return (uint8_t)(source * 131u + seq * 7u + k * 13u + 1u);
}

static void chaos_fill(uint8_t *buf, uint32_t length, uint32_t source, uint32_t seq)
{
    chaos_head_t h = {source, seq, length, 0};
    for (size_t k = sizeof(h); k < length; k++) buf[k] = chaos_byte(source, seq, k);
    memcpy(buf, &h, sizeof(h));
}

/* Notes a failure reported by MailRail: the first and the last one's time. */
static void chaos_failed(chaos_tally_t *t)
{
    t->last_failure = tool_wall_now();
    if (t->failures++ == 0) t->first_failure = t->last_failure;
}

/* Takes one arrived message apart: counted, a duplicate, corrupt, or the victim's done. */
static void chaos_take(const chaos_opts_t *o, chaos_tally_t *t, const mr_message_t *m, int size)
{
    chaos_head_t h;

    if (m->length < sizeof(h)) {
        chaos_fault(t, "is too short for its header", m->source, 0);
        t->corrupt++;
        return;
    }
    memcpy(&h, m->data, sizeof(h));
    if (h.seq >= CHAOS_GO_SEQ) {
        if (h.seq == CHAOS_READY_SEQ && mr_rank() == o->victim) t->ready++;
        else if (h.seq == CHAOS_DONE_SEQ && m->source == o->victim) t->done = true;
        else if (h.seq == CHAOS_GO_SEQ && m->source == o->victim) t->go = true;
        else t->corrupt++;
        return;
    }
    if ((int)h.source != m->source || h.length != m->length || h.seq >= o->messages ||
        m->source >= size) {
        chaos_fault(t, "has a header that does not match its source or length", m->source, h.seq);
        t->corrupt++;
        return;
    }
    const uint8_t *b = m->data;
    for (size_t k = sizeof(h); k < m->length; k++) {
        if (b[k] != chaos_byte(h.source, h.seq, k)) {
            chaos_fault(t, "has a corrupt byte", m->source, h.seq);
            t->corrupt++;
            return;
        }
    }
    uint8_t *slot = &t->seen[(size_t)h.source * o->messages + h.seq];
    if (*slot) {
        chaos_fault(t, "arrived twice", m->source, h.seq);
        t->duplicated++;
        return;
    }
    *slot = 1;
    t->count[h.source]++;
    t->received++;
}

/* Receives what is there; the status of the first call that failed for good. */
static mr_status_t chaos_progress(const chaos_opts_t *o, chaos_tally_t *t, int size, int wait_ms)
{
    mr_message_t m;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        chaos_take(o, t, &m, size);
        mr_release(m.data);
    }
    if (st == MR_ERR_PEER_FAILED) {
        chaos_failed(t);
        return MR_OK;
    }
    if (st != MR_AGAIN) return st;
    st = mr_wait(wait_ms);
    if (st == MR_ERR_PEER_FAILED) chaos_failed(t);
    return st == MR_OK || st == MR_AGAIN || st == MR_ERR_PEER_FAILED ? MR_OK : st;
}

/* Sends one message; MR_ERR_PEER_FAILED counts as a failure seen. */
static mr_status_t chaos_send(const chaos_opts_t *o, chaos_tally_t *t, int dest, uint32_t seq,
                              uint32_t length, int size, double start)
{
    void *buf;
    mr_status_t st;

    while ((st = mr_reserve(&buf)) == MR_AGAIN) {
        if ((st = chaos_progress(o, t, size, 10)) != MR_OK) return st;
        if (tool_now() - start > o->limit_s) return MR_ERR_TIMEOUT;
    }
    if (st != MR_OK) return st;
    chaos_fill(buf, length, (uint32_t)mr_rank(), seq);
    st = mr_send(buf, length, dest);
    if (st == MR_ERR_PEER_FAILED) {
        mr_release(buf);
        chaos_failed(t);
    }
    return st;
}

/* The victim's end: every message of every sender that may not die. */
static bool chaos_victim_done(const chaos_opts_t *o, const chaos_tally_t *t, int size)
{
    for (int r = 0; r < size; r++) {
        if (r == o->victim || o->may_die[r]) continue;
        if (t->count[r] < o->messages) return false;
    }
    /* The killed ranks' failures must have been reported too. */
    return t->failures >= (uint64_t)o->killable;
}

static pid_t chaos_child;

/* Passes a signal meant for the rank on to it. */
static void chaos_forward(int sig)
{
    kill(chaos_child, sig);
}

/* Progress until `*flag` is set (or `*count` reaches `want`), within the time limit. */
static mr_status_t chaos_until(const chaos_opts_t *o, chaos_tally_t *t, int size, double start,
                               const bool *flag, const int *count, int want)
{
    mr_status_t st = MR_OK;

    while (st == MR_OK && (flag != NULL ? !*flag : *count < want)) {
        if (tool_now() - start > o->limit_s) return MR_ERR_TIMEOUT;
        st = chaos_progress(o, t, size, 10);
    }
    return st;
}

/* The victim sends `seq` to every sender that may not die. */
static mr_status_t chaos_tell_all(const chaos_opts_t *o, chaos_tally_t *t, uint32_t seq, int size,
                                  double start)
{
    mr_status_t st = MR_OK;

    for (int r = 0; r < size && st == MR_OK; r++) {
        if (r == o->victim || o->may_die[r]) continue;
        st = chaos_send(o, t, r, seq, sizeof(chaos_head_t), size, start);
        if (st == MR_ERR_PEER_FAILED) st = MR_OK; /* Counted: the verdict will say. */
    }
    return st;
}

/* Prints this rank's line; true when it is a pass. */
static bool chaos_report(const chaos_opts_t *o, const chaos_tally_t *t, int rank, uint64_t lost,
                         mr_status_t st, double start)
{
    bool invariants = tool_invariants_hold("mailrail_chaos");
    bool ok = st == MR_OK && t->duplicated == 0 && t->corrupt == 0 && lost == 0 && invariants &&
              t->failures == (uint64_t)o->killable;

    printf("chaos rank %d: sent %llu received %llu duplicated %llu corrupt %llu lost %llu "
           "failures %llu first_failure_epoch %.3f last_failure_epoch %.3f seconds %.3f status %d "
           "verdict %s\n",
           rank, (unsigned long long)t->sent, (unsigned long long)t->received,
           (unsigned long long)t->duplicated, (unsigned long long)t->corrupt,
           (unsigned long long)lost, (unsigned long long)t->failures, t->first_failure, t->last_failure,
           tool_now() - start, (int)st, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (t->first_fault[0] != '\0') {
        fprintf(stderr, "mailrail_chaos: rank %d: %s\n", rank, t->first_fault);
    }
    if (t->first_missing[0] != '\0') {
        fprintf(stderr, "mailrail_chaos: rank %d: %s (%llu lost in all)\n", rank, t->first_missing,
                (unsigned long long)lost);
    }
    return ok;
}

static int chaos_rank(const chaos_opts_t *o, int rank, int size)
{
    chaos_tally_t t = {0};
    mr_status_t st = MR_OK;
    double start = tool_now();
    uint64_t lost = 0;
    bool ok;

    t.seen = calloc((size_t)size * o->messages, 1);
    t.count = calloc((size_t)size, sizeof(*t.count));
    if (t.seen == NULL || t.count == NULL) return 1;
    if (rank != o->victim) {
        for (uint32_t seq = 0; seq < o->messages && st == MR_OK; seq++) {
            /* Paced: progress (receives and returns go on) until this message is due. */
            while (st == MR_OK && tool_now() - start < o->spread_s * seq / o->messages) {
                st = chaos_progress(o, &t, size, 1);
            }
            if (st == MR_OK) st = chaos_send(o, &t, o->victim, seq, o->bytes, size, start);
            if (st == MR_OK) t.sent++;
        }
        /* DONE (the victim may need this rank's credits until then), every killed rank's
           failure reported here too; then READY, and GO. */
        if (st == MR_OK) st = chaos_until(o, &t, size, start, &t.done, NULL, 0);
        while (st == MR_OK && t.failures < (uint64_t)o->killable) {
            st = tool_now() - start > o->limit_s ? MR_ERR_TIMEOUT
                                                  : chaos_progress(o, &t, size, 10);
        }
        ok = chaos_report(o, &t, rank, 0, st, start);
        if (st == MR_OK) st = chaos_send(o, &t, o->victim, CHAOS_READY_SEQ, sizeof(chaos_head_t),
                                         size, start);
        if (st == MR_OK) st = chaos_until(o, &t, size, start, &t.go, NULL, 0);
    } else {
        while (st == MR_OK && !chaos_victim_done(o, &t, size)) {
            st = chaos_progress(o, &t, size, 10);
            if (tool_now() - start > o->limit_s) st = MR_ERR_TIMEOUT;
        }
        for (int r = 0; r < size; r++) {
            if (r == o->victim || o->may_die[r]) continue;
            lost += o->messages - t.count[r];
            for (uint32_t q = 0; q < o->messages && t.first_missing[0] == '\0'; q++) {
                if (t.seen[(size_t)r * o->messages + q]) continue;
                snprintf(t.first_missing, sizeof(t.first_missing),
                         "message %u from rank %d never arrived", q, r);
            }
        }
        if (st == MR_OK) st = chaos_tell_all(o, &t, CHAOS_DONE_SEQ, size, start);
        if (st == MR_OK) st = chaos_until(o, &t, size, start, NULL, &t.ready,
                                          size - 1 - o->killable);
        ok = chaos_report(o, &t, rank, lost, st, start);
        if (st == MR_OK) st = chaos_tell_all(o, &t, CHAOS_GO_SEQ, size, start);
        /* Until the GO messages left. */
        mr_stats_t stats = {.size = sizeof(stats)};
        while (st == MR_OK && mr_get_stats(&stats) == MR_OK && stats.deferred_now > 0 &&
               tool_now() - start < o->limit_s) {
            st = chaos_progress(o, &t, size, 10);
        }
    }
    st = mr_finalize();
    free(t.seen);
    free(t.count);
    /* After a failure mr_finalize() says so, and MPI cannot be finalized cleanly. */
    if (o->killable > 0) _exit(ok ? 0 : 1);
    MPI_Finalize();
    return ok && st == MR_OK ? 0 : 1;
}

static bool chaos_parse(int argc, char **argv, chaos_opts_t *o)
{
    int c;
    bool ok = true;

    memset(o, 0, sizeof(*o));
    o->victim = -1;
    o->bytes = 4096;
    o->limit_s = 60;
    while ((c = getopt(argc, argv, "v:m:b:k:T:s:")) != -1) {
        switch (c) {
        case 'v': ok &= tool_parse_int(optarg, 0, CHAOS_MAX_RANKS - 1, &o->victim); break;
        case 'm': ok &= tool_parse_unsigned(optarg, &o->messages); break;
        case 'b': ok &= tool_parse_unsigned(optarg, &o->bytes); break;
        case 'T': {
            int s = 0;
            ok &= tool_parse_int(optarg, 1, 3600, &s);
            o->limit_s = s;
            break;
        }
        case 's': {
            int s = 0;
            ok &= tool_parse_int(optarg, 0, 3600, &s);
            o->spread_s = s;
            break;
        }
        case 'k':
            for (char *save = NULL, *p = strtok_r(optarg, ",", &save); p != NULL;
                 p = strtok_r(NULL, ",", &save)) {
                int r = -1;
                ok &= tool_parse_int(p, 0, CHAOS_MAX_RANKS - 1, &r);
                if (r >= 0 && !o->may_die[r]) {
                    o->may_die[r] = true;
                    o->killable++;
                }
            }
            break;
        default: ok = false;
        }
    }
    return ok && o->victim >= 0 && o->messages > 0 && o->bytes >= sizeof(chaos_head_t);
}

int main(int argc, char **argv)
{
    chaos_opts_t o;
    int rank, size, status;
    pid_t child;

    if (!chaos_parse(argc, argv, &o)) {
        fprintf(stderr, "usage: mpiexec -n N mailrail_chaos -v VICTIM -m MESSAGES [-b BYTES] "
                        "[-k RANKS] [-T SECONDS] [-s SPREAD]\n");
        return 2;
    }
    /*
     * The rank is the child (see the top); the parent only reports how it ended,
     * and passes on the signals hydra sends: SIGUSR1 above all, which hydra
     * (-disable-auto-cleanup) sends every process when one dies, which MPICH
     * handles in the rank, and whose default action would end the parent.
     */
    child = fork();
    if (child < 0) return 1;
    if (child > 0) {
        struct sigaction sa = {.sa_handler = chaos_forward, .sa_flags = SA_RESTART};
        chaos_child = child;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        while (waitpid(child, &status, 0) < 0) {
            if (errno != EINTR) return 1;
        }
        const char *rank = getenv("PMI_RANK");
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && o.killable > 0) return 0;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
        fprintf(stderr, "mailrail_chaos: rank %s %s %d\n", rank ? rank : "?",
                WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(1);
    /* The name chaos.sh kills by. */
    prctl(PR_SET_NAME, "mailrail-chaos");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > CHAOS_MAX_RANKS || o.victim >= size) {
        if (rank == 0) fprintf(stderr, "mailrail_chaos: -v must be a rank of the job\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm comm = MPI_COMM_WORLD;
    if (mr_init_mpi(&comm, sizeof(comm)) != MR_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    return chaos_rank(&o, rank, size);
}
