/*
 * mailrail_mpi_waits: how long MPICH's non-blocking collectives take when
 * every rank waits for them as MailRail's bootstrap does, testing between
 * sleeps, for several ways of waiting in one job. It measures the choice
 * behind mr__backoff() (core/plugin/mr_time.h) on a machine with more ranks
 * than CPUs (docs/scale.md); it does not use MailRail.
 *
 *   mpiexec -n 513 mailrail_mpi_waits [-r REPS] [-w YIELDS:FIRST_NS:LAST_NS]...
 *
 * Each -w is a way to wait: YIELDS sched_yield() calls, then sleeps from
 * FIRST_NS, twice as long every 16 polls, up to LAST_NS (FIRST = LAST: the
 * same nap at every poll). Without -w, the five ways of docs/scale.md. For
 * each way, kind and repetition it prints the time from the first rank's
 * start to the last rank's end, and the polls per rank.
 */
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct way {
    long yields, first_ns, last_ns;
} way_t;

enum { KINDS = 7, MAX_WAYS = 16, MAX_REPS = 16 };
static const char *const kind_names[KINDS] = {"ibarrier",      "iallreduce8",   "ibcast64",
                                              "ibcast1k",      "iallgather8",   "iallgather128",
                                              "iallgather1k"};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits for `req` the way `w` says; returns the polls it took. */
static unsigned long wait_for(MPI_Request *req, const way_t *w)
{
    unsigned long polls = 0;
    int done = 0;

    for (;;) {
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        polls++;
        if (done) return polls;
        if ((long)polls <= w->yields) {
            sched_yield();
            continue;
        }
        unsigned long shift = (polls - (unsigned long)w->yields - 1) / 16;
        long ns = shift >= 30 ? w->last_ns : w->first_ns << shift;
        if (ns > w->last_ns) ns = w->last_ns;
        struct timespec ts = {.tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L};
        nanosleep(&ts, NULL);
    }
}

static void start(int kind, char *send, char *recv, uint64_t *in, uint64_t *out, MPI_Request *r)
{
    MPI_Comm c = MPI_COMM_WORLD;

    switch (kind) {
    case 0: MPI_Ibarrier(c, r); break;
    case 1: MPI_Iallreduce(in, out, 1, MPI_UINT64_T, MPI_SUM, c, r); break;
    case 2: MPI_Ibcast(send, 64, MPI_BYTE, 0, c, r); break;
    case 3: MPI_Ibcast(send, 1024, MPI_BYTE, 0, c, r); break;
    case 4: MPI_Iallgather(send, 8, MPI_BYTE, recv, 8, MPI_BYTE, c, r); break;
    case 5: MPI_Iallgather(send, 128, MPI_BYTE, recv, 128, MPI_BYTE, c, r); break;
    default: MPI_Iallgather(send, 1024, MPI_BYTE, recv, 1024, MPI_BYTE, c, r); break;
    }
}

int main(int argc, char **argv)
{
    way_t ways[MAX_WAYS] = {{64, 50000, 10000000}, {0, 5000000, 5000000}, {0, 1000000, 20000000},
                            {0, 20000000, 20000000}, {0, 50000000, 50000000}};
    int nways = 5, given = 0, reps = 2, rank, size;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc && given < MAX_WAYS) {
            way_t *w = &ways[given];
            if (sscanf(argv[++i], "%ld:%ld:%ld", &w->yields, &w->first_ns, &w->last_ns) != 3 ||
                w->yields < 0 || w->first_ns <= 0 || w->last_ns < w->first_ns) {
                if (rank == 0) fprintf(stderr, "mailrail_mpi_waits: bad -w %s\n", argv[i]);
                MPI_Finalize();
                return 2;
            }
            nways = ++given;
        } else {
            if (rank == 0)
                fprintf(stderr, "usage: %s [-r REPS] [-w YIELDS:FIRST_NS:LAST_NS]...\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        if (rank == 0) fprintf(stderr, "mailrail_mpi_waits: -r takes 1 to %d\n", MAX_REPS);
        MPI_Finalize();
        return 2;
    }
    char *send = calloc(1, 1024), *recv = calloc((size_t)size, 1024);
    uint64_t in = 1, out = 0;
    if (send == NULL || recv == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int w = 0; w < nways; w++) {
        double neg_start[KINDS * MAX_REPS], end[KINDS * MAX_REPS];
        double first[KINDS * MAX_REPS], last[KINDS * MAX_REPS];
        unsigned long polls[KINDS * MAX_REPS], all_polls[KINDS * MAX_REPS];
        for (int k = 0; k < KINDS; k++) {
            for (int r = 0; r < reps; r++) {
                MPI_Request req;
                MPI_Ibarrier(MPI_COMM_WORLD, &req); /* Lines the ranks up, off the clock. */
                wait_for(&req, &ways[w]);
                uint64_t t0 = now_ns();
                start(k, send, recv, &in, &out, &req);
                polls[k * reps + r] = wait_for(&req, &ways[w]);
                neg_start[k * reps + r] = -(double)t0 / 1e9;
                end[k * reps + r] = (double)now_ns() / 1e9;
            }
        }
        int n = KINDS * reps;
        MPI_Reduce(neg_start, first, n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(end, last, n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(polls, all_polls, n, MPI_UNSIGNED_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank != 0) continue;
        printf("mailrail_mpi_waits: %d ranks, %ld yields, then sleeps from %ld to %ld ns\n", size,
               ways[w].yields, ways[w].first_ns, ways[w].last_ns);
        for (int i = 0; i < n; i++) {
            printf("mailrail_mpi_waits: %s rep %d: %.3f s, %.1f polls per rank\n",
                   kind_names[i / reps], i % reps, last[i] + first[i],
                   (double)all_polls[i] / size);
        }
        fflush(stdout);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
