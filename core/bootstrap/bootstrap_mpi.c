/*
 * The MPI bootstrap (MPICH): ranks, address exchange and the non-blocking
 * collectives behind quiescence and finalize. Loaded as a plugin so that
 * libmailrail.so does not depend on MPI.
 */
#include "mr_bootstrap.h"
#include "mr_time.h"

#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/*
 * Set once MailRail has called MPI_Init, until it calls MPI_Finalize: a
 * session after a failed init reuses that MPI and still finalizes it at the
 * end. The plugin is never unloaded, so this outlives mr_finalize().
 */
static bool bootstrap_started_mpi;

/*
 * An allgather in rounds (Bruck): in the round of distance k, each rank sends
 * the min(k, size - k) blocks it holds to rank - k and receives as many from
 * rank + k, so that after ceil(log2(size)) rounds it holds all blocks, its own
 * first. MPICH's MPI_Iallgather goes around a ring, one round per rank, once
 * the gathered bytes pass 80 KiB: at 1,025 ranks the node map's 104 bytes a
 * rank took 1,024 rounds, each waiting for a rank to be scheduled.
 */
typedef struct bootstrap_gather {
    uint8_t *blocks; /* size * len: block i is rank (rank + i) % size's. */
    uint8_t *recv;
    size_t len;
    int distance; /* The round under way; 0 when no gather is. */
    MPI_Request reqs[2];
} bootstrap_gather_t;

/* The tag of the gather's messages: collectives never match point-to-point ones. */
#define BOOTSTRAP_GATHER_TAG 0x4d52

struct mr_bootstrap {
    MPI_Comm comm;
    MPI_Request pending;
    bootstrap_gather_t gather;
    int rank, size;
    int initialized_mpi;
    uint64_t nap_ns; /* mr__backoff()'s, from the launcher's count of local ranks. */
    void (*log)(mr_log_level_t, const char *, ...);
};

static mr_status_t bootstrap_check(mr_bootstrap_t *b, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;

    if (rc == MPI_SUCCESS) return MR_OK;
    MPI_Error_string(rc, text, &len);
    b->log(MR_LOG_ERROR, "%s failed: %s", what, text);
    return MR_ERR_BOOTSTRAP;
}

/*
 * Waits for a non-blocking collective, giving the core away between tests.
 * MPICH's blocking collectives spin: with hundreds of ranks on a few cores,
 * a spinning rank holds its core for a whole time slice while the ranks it
 * waits for cannot run, and every collective of init then takes seconds.
 */
static mr_status_t bootstrap_wait(mr_bootstrap_t *b, MPI_Request *req, const char *what)
{
    int done = 0;
    unsigned polls = 0;

    for (;;) {
        mr_status_t status = bootstrap_check(b, MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
        if (status != MR_OK || done) return status;
        mr__backoff(&polls, b->nap_ns);
    }
}

/*
 * A task that srun started without a PMI for MPI (`srun --mpi=none`, the
 * default without MpiDefault): MPICH then initializes as a singleton and every
 * task is a one-rank job. Returns the step's task count in that case, else 0.
 * Hydra (mpiexec, also inside an allocation, where it starts its proxies with
 * srun) sets PMI_PORT or PMI_FD; Slurm's pmi2 plugin sets PMI_FD; PMIx sets
 * PMIX_RANK. Only reads the environment: MailRail needs nothing else from the
 * launcher than what MPI_Init gets from it.
 */
static int bootstrap_unconnected_tasks(void)
{
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    int world = 0;

    if (tasks == NULL || getenv("PMI_FD") != NULL || getenv("PMI_PORT") != NULL ||
        getenv("PMIX_RANK") != NULL)
        return 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 1) return 0;
    long n = strtol(tasks, NULL, 10);
    return n > 1 && n < 1L << 30 ? (int)n : 0;
}

static mr_status_t bootstrap_init(const void *user_comm, size_t user_comm_size,
                                  void (*log)(mr_log_level_t, const char *, ...),
                                  mr_bootstrap_t **out, int *rank, int *size)
{
    MPI_Comm base = MPI_COMM_WORLD;
    int initialized = 0, finalized = 0, initialized_here = 0;
    mr_bootstrap_t *b;

    if (user_comm != NULL && user_comm_size != sizeof(MPI_Comm)) {
        log(MR_LOG_ERROR, "mr_init_mpi: the communicator has %zu bytes, an MPI_Comm has %zu.",
            user_comm_size, sizeof(MPI_Comm));
        return MR_ERR_INVALID_PARAM;
    }
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
        log(MR_LOG_ERROR, "MPI was already finalized; MailRail cannot bootstrap.");
        return MR_ERR_BOOTSTRAP;
    }
    if (user_comm != NULL) {
        if (!initialized) {
            log(MR_LOG_ERROR, "mr_init_mpi: MPI is not initialized; call MPI_Init first.");
            return MR_ERR_BOOTSTRAP;
        }
        memcpy(&base, user_comm, sizeof(base));
        if (base == MPI_COMM_NULL) {
            log(MR_LOG_ERROR, "mr_init_mpi: the communicator is MPI_COMM_NULL.");
            return MR_ERR_INVALID_PARAM;
        }
    } else if (!initialized) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
            log(MR_LOG_ERROR, "MPI_Init failed.");
            return MR_ERR_BOOTSTRAP;
        }
        bootstrap_started_mpi = true;
    }
    /*
     * MailRail calls MPI from the thread it runs on: that must be MPI's main
     * thread unless MPI was initialized for calls from any thread (mailrail.h).
     */
    int provided = MPI_THREAD_SINGLE, is_main = 1;
    MPI_Query_thread(&provided);
    MPI_Is_thread_main(&is_main);
    if (!is_main && provided < MPI_THREAD_SERIALIZED) {
        log(MR_LOG_ERROR, "MailRail is initialized on a thread other than the one that "
            "initialized MPI, at thread level %s: MPI then takes calls from that thread "
            "only. Call mr_init() there, or initialize MPI with MPI_Init_thread() at "
            "MPI_THREAD_SERIALIZED or above.",
            provided == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED");
        return MR_ERR_UNSUPPORTED;
    }
    /* MailRail owns MPI when it started it, in this session or a failed earlier one. */
    initialized_here = user_comm == NULL && bootstrap_started_mpi;
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        /* MPI stays up, as after any failed init: mr_init() may be retried. */
        log(MR_LOG_ERROR, "Cannot allocate the bootstrap state.");
        return MR_ERR_NO_MEMORY;
    }
    b->log = log;
    b->pending = MPI_REQUEST_NULL;
    b->gather.reqs[0] = b->gather.reqs[1] = MPI_REQUEST_NULL;
    b->nap_ns = mr__backoff_nap_ns(mr__launcher_local_ranks());
    b->initialized_mpi = initialized_here;
    /* Errors come back as codes so that MailRail can report them. */
    MPI_Request req;
    if (bootstrap_check(b, MPI_Comm_idup(base, &b->comm, &req), "MPI_Comm_idup") != MR_OK ||
        bootstrap_wait(b, &req, "MPI_Comm_idup") != MR_OK) {
        free(b);
        return MR_ERR_BOOTSTRAP;
    }
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &b->rank);
    MPI_Comm_size(b->comm, &b->size);
    /* mr_init_mpi() with the application's own communicator is not second-guessed. */
    int tasks = user_comm == NULL ? bootstrap_unconnected_tasks() : 0;
    if (tasks > 1) {
        log(MR_LOG_ERROR, "srun started %d tasks, but MPI sees one rank in each: no process "
            "manager reached MPI, and each task would run as a job of its own. With "
            "MPICH, launch with `srun --mpi=pmi2` (or MpiDefault=pmi2 in slurm.conf), or "
            "with mpiexec inside the allocation (docs/launch.md).", tasks);
        MPI_Comm_free(&b->comm);
        free(b);
        return MR_ERR_BOOTSTRAP;
    }
    *out = b;
    *rank = b->rank;
    *size = b->size;
    return MR_OK;
}

/* Starts the gather's round of distance g->distance. */
static mr_status_t bootstrap_gather_round(mr_bootstrap_t *b)
{
    bootstrap_gather_t *g = &b->gather;
    int k = g->distance, n = k < b->size - k ? k : b->size - k;
    int count = (int)((size_t)n * g->len);
    int to = (b->rank - k + b->size) % b->size, from = (b->rank + k) % b->size;
    mr_status_t status;

    status = bootstrap_check(b, MPI_Irecv(g->blocks + (size_t)k * g->len, count, MPI_BYTE, from,
                                          BOOTSTRAP_GATHER_TAG, b->comm, &g->reqs[0]),
                             "MPI_Irecv");
    if (status != MR_OK) return status;
    return bootstrap_check(b, MPI_Isend(g->blocks, count, MPI_BYTE, to, BOOTSTRAP_GATHER_TAG,
                                        b->comm, &g->reqs[1]),
                           "MPI_Isend");
}

/* Puts the gathered blocks in rank order and ends the gather. */
static void bootstrap_gather_end(mr_bootstrap_t *b)
{
    bootstrap_gather_t *g = &b->gather;

    for (int i = 0; i < b->size; i++) {
        memcpy(g->recv + (size_t)((b->rank + i) % b->size) * g->len,
               g->blocks + (size_t)i * g->len, g->len);
    }
    free(g->blocks);
    g->blocks = NULL;
    g->distance = 0;
}

/* Advances the gather as far as its messages allow: MR_OK once it is done. */
static mr_status_t bootstrap_gather_test(mr_bootstrap_t *b)
{
    bootstrap_gather_t *g = &b->gather;

    for (;;) {
        int done = 0;
        MPI_Status statuses[2]; /* Not MPI_STATUSES_IGNORE, which GCC 12 takes for an array. */
        mr_status_t status =
            bootstrap_check(b, MPI_Testall(2, g->reqs, &done, statuses), "MPI_Testall");
        if (status != MR_OK) return status;
        if (!done) return MR_AGAIN;
        if (g->distance >= b->size - g->distance) break;
        g->distance *= 2;
        status = bootstrap_gather_round(b);
        if (status != MR_OK) return status;
    }
    bootstrap_gather_end(b);
    return MR_OK;
}

static mr_status_t bootstrap_iallgather(mr_bootstrap_t *b, const void *send, void *recv,
                                        size_t len)
{
    bootstrap_gather_t *g = &b->gather;

    if ((size_t)b->size * len > INT32_MAX) {
        b->log(MR_LOG_ERROR, "An allgather of %zu bytes from %d ranks is more than MPI counts.",
               len, b->size);
        return MR_ERR_BOOTSTRAP;
    }
    g->blocks = malloc((size_t)b->size * len + 1);
    if (g->blocks == NULL) {
        b->log(MR_LOG_ERROR, "Cannot allocate an allgather of %d x %zu bytes.", b->size, len);
        return MR_ERR_NO_MEMORY;
    }
    memcpy(g->blocks, send, len);
    g->recv = recv;
    g->len = len;
    g->distance = 1;
    if (b->size == 1) {
        bootstrap_gather_end(b);
        return MR_OK;
    }
    return bootstrap_gather_round(b);
}

static mr_status_t bootstrap_ibcast(mr_bootstrap_t *b, void *buf, size_t len, int root)
{
    return bootstrap_check(b, MPI_Ibcast(buf, (int)len, MPI_BYTE, root, b->comm, &b->pending),
                           "MPI_Ibcast");
}

static mr_status_t bootstrap_iallreduce_sum(mr_bootstrap_t *b, const uint64_t *in,
                                            uint64_t *out, int count)
{
    return bootstrap_check(
        b, MPI_Iallreduce(in, out, count, MPI_UINT64_T, MPI_SUM, b->comm, &b->pending),
        "MPI_Iallreduce");
}

static mr_status_t bootstrap_ibarrier(mr_bootstrap_t *b)
{
    return bootstrap_check(b, MPI_Ibarrier(b->comm, &b->pending), "MPI_Ibarrier");
}

static mr_status_t bootstrap_test(mr_bootstrap_t *b)
{
    int done = 0;
    mr_status_t status;

    if (b->gather.distance > 0) return bootstrap_gather_test(b);
    if (b->pending == MPI_REQUEST_NULL) return MR_OK;
    status = bootstrap_check(b, MPI_Test(&b->pending, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (status != MR_OK) return status;
    return done ? MR_OK : MR_AGAIN;
}

static const void *bootstrap_comm(mr_bootstrap_t *b)
{
    return &b->comm;
}

static void bootstrap_finalize(mr_bootstrap_t *b, mr_bootstrap_end_t end)
{
    /*
     * A collective still pending here means a peer failed during it; MPI does
     * not allow freeing or cancelling it, so it is left behind.
     */
    if (end != MR_BOOTSTRAP_END_ABANDON) {
        MPI_Comm_free(&b->comm);
        if (end == MR_BOOTSTRAP_END_FINAL && b->initialized_mpi) {
            MPI_Finalize();
            bootstrap_started_mpi = false;
        }
    } else if (b->initialized_mpi) {
        b->log(MR_LOG_WARN, "MPI is left unfinalized: a peer failed or a collective could "
                            "not complete.");
    }
    /* An abandoned gather's receives may still land in its blocks: they stay. */
    if (end != MR_BOOTSTRAP_END_ABANDON || b->gather.distance == 0) free(b->gather.blocks);
    free(b);
}

static const mr_bootstrap_ops_t bootstrap_mpi_ops = {
    .abi_version = MR_BOOTSTRAP_ABI_VERSION,
    .ops_size = sizeof(mr_bootstrap_ops_t),
    .name = "mpi",
    .description = "MPI (MPICH) bootstrap: ranks, address exchange, non-blocking collectives.",
    .init = bootstrap_init,
    .iallgather = bootstrap_iallgather,
    .ibcast = bootstrap_ibcast,
    .iallreduce_sum = bootstrap_iallreduce_sum,
    .ibarrier = bootstrap_ibarrier,
    .test = bootstrap_test,
    .comm = bootstrap_comm,
    .finalize = bootstrap_finalize,
};

__attribute__((visibility("default"))) const mr_bootstrap_ops_t *mr_bootstrap_get_ops(void)
{
    return &bootstrap_mpi_ops;
}
