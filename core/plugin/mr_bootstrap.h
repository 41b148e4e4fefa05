/*
 * The bootstrap plugin ABI. Internal.
 *
 * The bootstrap gives the core its rank, the job size, collectives for the
 * address exchange, and the non-blocking reductions behind quiescence and
 * finalize. It lives in a plugin of its own (mailrail_bootstrap_mpi.so) so
 * that libmailrail.so does not link MPI, and through MPICH, UCX.
 */
#ifndef MR_BOOTSTRAP_H
#define MR_BOOTSTRAP_H

#include "mailrail.h"
#include "mr_log_level.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MR_BOOTSTRAP_ABI_VERSION 3
#define MR_BOOTSTRAP_ENTRY "mr_bootstrap_get_ops"
#define MR_BOOTSTRAP_PREFIX "mailrail_bootstrap_"

typedef struct mr_bootstrap mr_bootstrap_t;

/* How the bootstrap ends. */
typedef enum mr_bootstrap_end {
    /* mr_finalize(): free the communicator, finalize MPI if MailRail started it. */
    MR_BOOTSTRAP_END_FINAL,
    /* A failed mr_init(): free the communicator, keep MPI up so that it can be retried. */
    MR_BOOTSTRAP_END_RETRY,
    /* A peer died or a collective was abandoned: touch nothing, since MPI_Comm_free and
       MPI_Finalize would wait for the missing rank forever. */
    MR_BOOTSTRAP_END_ABANDON,
} mr_bootstrap_end_t;

typedef struct mr_bootstrap_ops {
    uint32_t abi_version;
    uint32_t ops_size;
    const char *name;
    const char *description;

    /*
     * Joins the job. `user_comm` is the application's communicator (a pointer
     * to an MPI_Comm of `user_comm_size` bytes) or NULL for MPI_COMM_WORLD,
     * in which case MPI is initialized if the application has not done it.
     * Sets *out, *rank and *size only on MR_OK.
     */
    mr_status_t (*init)(const void *user_comm, size_t user_comm_size,
                        void (*log)(mr_log_level_t, const char *, ...), mr_bootstrap_t **out,
                        int *rank, int *size);

    /*
     * The operations below start a collective and return; test() drives it.
     * At most one is pending at a time, and its buffers must stay valid until
     * test() says it is done. The core waits between tests, so that a wait
     * can time out and ranks that share CPUs can sleep.
     */

    /*
     * Starts gathering every rank's `len` bytes, in rank order, into `recv`,
     * in ceil(log2(size)) rounds whatever `len` (Bruck's algorithm).
     */
    mr_status_t (*iallgather)(mr_bootstrap_t *b, const void *send, void *recv, size_t len);

    /* Starts sending `len` bytes from rank `root` to all. */
    mr_status_t (*ibcast)(mr_bootstrap_t *b, void *buf, size_t len, int root);

    /* Starts a sum of `count` uint64_t over all ranks into `out`. */
    mr_status_t (*iallreduce_sum)(mr_bootstrap_t *b, const uint64_t *in, uint64_t *out,
                                  int count);

    /* Starts a non-blocking barrier. */
    mr_status_t (*ibarrier)(mr_bootstrap_t *b);

    /* Tests and advances the pending operation: MR_OK done, MR_AGAIN not yet, or an error. */
    mr_status_t (*test)(mr_bootstrap_t *b);

    /* The duplicated MPI_Comm the bootstrap uses, for the MPI substrate. */
    const void *(*comm)(mr_bootstrap_t *b);

    /* Ends the bootstrap; `end` says what becomes of MPI (mr_bootstrap_end_t). */
    void (*finalize)(mr_bootstrap_t *b, mr_bootstrap_end_t end);
} mr_bootstrap_ops_t;

typedef const mr_bootstrap_ops_t *(*mr_bootstrap_entry_fn)(void);

#endif /* MR_BOOTSTRAP_H */
