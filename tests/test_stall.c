/*
 * A stalled rank: SIGSTOP for longer than MAILRAIL_TIMEOUT, then SIGCONT
 * (docs/reliability.md, "A stalled rank").
 *
 *   MAILRAIL_TIMEOUT=T mpiexec -n 3 test_stall STALL_S [others BYTES]
 *
 * Ranks 0 and 1 send 1 KiB messages to rank 2 without pause. Once rank 2 has
 * received 200, a helper process it forked before MPI_Init stops it with
 * SIGSTOP for STALL_S seconds (longer than T), then lets it go on with
 * SIGCONT. Its kernel still answers: only the process is frozen.
 *
 * With `others` (and MAILRAIL_SEND_BYTES=0, a datagram of at least BYTES),
 * a sender sends rank 2 a message of BYTES every millisecond until rank 2
 * has OTHERS_STALL_AFTER and is stopped; once it sees the stop,
 * OTHERS_EXTRA more at once: more than the transport buffers (TCP's socket
 * buffers, UCX's FIFO), fewer than the send slots. From then on it sends
 * the other sender a message every 10 ms: its other sends complete, nothing
 * waits in MailRail's deferred queue under `none`, and only the sends stuck
 * to rank 2 can tell that rank 2 is lost.
 *
 * The senders must name rank 2 failed (MR_ERR_PEER_FAILED, and
 * mr_failed_ranks() lists 2) within T and a margin of the stop; then each
 * sends the other 10 messages, all of which must arrive (the survivors carry
 * on). Each prints "sender R: rank 2 failed after S s (stopped at E)",
 * "sender R: 10 of 10 from rank P" and "sender R: ok".
 *
 * The stalled rank, once resumed, prints what it sees:
 * "stalled 2: resumed after S s; failed ranks: LIST; received N" once both
 * senders' failures have been reported to it, or its time limit passed
 * ("failed ranks: none"). tests/run_stall.sh checks these lines.
 */
#include "mailrail.h"

#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STALLED 2
#define STALL_AFTER 200 /* Messages rank 2 receives before it is stopped. */
#define BYTES 1024
#define PING_BYTES 48  /* The senders' messages to each other under `others`, ... */
#define OTHERS_EXTRA 192 /* ... and how many to rank 2 after its stop was seen, ... */
#define OTHERS_STALL_AFTER 20 /* ... and before it (what rank 2 receives). */

static unsigned pings; /* PING_BYTES messages received. */

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* Receives what is there; counts messages per source and failures reported. */
static mr_status_t drain(unsigned *from, int *failures)
{
    mr_message_t m;
    mr_status_t st;

    while ((st = mr_receive(&m)) == MR_OK) {
        if (m.length == PING_BYTES) {
            pings++;
        } else if (m.source >= 0 && m.source < 3) {
            from[m.source]++;
        }
        mr_release(m.data);
    }
    if (st == MR_ERR_PEER_FAILED) (*failures)++;
    return st == MR_AGAIN || st == MR_ERR_PEER_FAILED ? MR_OK : st;
}

/* Whether mr_failed_ranks() lists `rank`. */
static bool listed_failed(int rank)
{
    int ranks[3], count = 0;

    if (mr_failed_ranks(ranks, 3, &count) != MR_OK) return false;
    for (int k = 0; k < count && k < 3; k++) {
        if (ranks[k] == rank) return true;
    }
    return false;
}

static int sender(int rank, double limit_s, const char *epoch_file, size_t others)
{
    unsigned from[3] = {0}; /* Only the survivors' messages to each other count here. */
    int failures = 0, peer = 1 - rank;
    double start = wall_now(), failed_at = 0, stopped_at = 0, last = 0;
    bool to_others = false, seen_stop = false;
    unsigned pinged = 0, extra = 0;
    size_t bytes = others ? others : BYTES;
    mr_status_t st = MR_OK;
    FILE *f;

    /* Until rank 2 is named failed: send to it without pause (or, see above, to the peer). */
    while (!listed_failed(STALLED) && wall_now() - start < limit_s) {
        void *buf;
        if ((st = drain(from, &failures)) != MR_OK) break;
        /*
         * Under `others`: a message a millisecond to rank 2 before its stop, the
         * extra ones at once after it, then a ping in 10 ms.
         */
        double pace = to_others ? 0.01 : seen_stop ? 0 : 0.001;
        if (others && wall_now() - last < pace) {
            mr_wait(1);
            continue;
        }
        last = wall_now();
        st = mr_reserve(&buf);
        if (st == MR_AGAIN) {
            st = mr_wait(10);
            if (st == MR_ERR_PEER_FAILED) failures++;
            st = MR_OK;
            continue;
        }
        if (st != MR_OK) break;
        if (to_others) {
            memset(buf, rank, PING_BYTES);
            st = mr_send(buf, PING_BYTES, peer);
            pinged += st == MR_OK;
            if (st == MR_ERR_PEER_FAILED) {
                mr_release(buf);
                failures++;
                st = MR_OK;
            } else if (st != MR_OK) {
                break;
            }
            continue;
        }
        memset(buf, rank, bytes);
        st = mr_send(buf, bytes, STALLED);
        if (others && !seen_stop) seen_stop = access(epoch_file, F_OK) == 0;
        if (seen_stop && st == MR_OK && ++extra == OTHERS_EXTRA) {
            to_others = true;
            printf("sender %d: sends to rank 2 stop %u messages after its stop\n", rank, extra);
        }
        if (st == MR_ERR_PEER_FAILED) {
            mr_release(buf);
            st = MR_OK;
        } else if (st != MR_OK) {
            break;
        }
    }
    failed_at = wall_now();
    f = fopen(epoch_file, "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &stopped_at) != 1) stopped_at = 0;
        fclose(f);
    }
    if (!listed_failed(STALLED)) {
        printf("sender %d: rank 2 not named failed within %.0f s (status %s)\n", rank, limit_s,
               mr_status_string(st));
        return 1;
    }
    printf("sender %d: rank 2 failed after %.2f s (stopped at %.3f)\n", rank,
           stopped_at > 0 ? failed_at - stopped_at : -1.0, stopped_at);
    bool others_ok = true;
    if (others) {
        printf("sender %d: %u messages sent to rank %d and %u received from it meanwhile\n",
               rank, pinged, peer, pings);
        others_ok = to_others && pinged > 0 && pings > 0;
    }
    /* The survivors carry on: 10 messages each way, all received. */
    for (int k = 0; k < 10 && st == MR_OK; k++) {
        void *buf;
        while ((st = mr_reserve(&buf)) == MR_AGAIN) drain(from, &failures);
        if (st != MR_OK) break;
        memset(buf, rank, 64);
        st = mr_send(buf, 64, peer);
    }
    while (st == MR_OK && from[peer] < 10 && wall_now() - failed_at < 20) {
        st = drain(from, &failures);
        if (st == MR_OK) mr_wait(10);
    }
    /* The peer's 11th, its last, may have come already. */
    printf("sender %d: %u of 10 from rank %d\n", rank, from[peer] < 10 ? from[peer] : 10, peer);
    if (st != MR_OK || from[peer] < 10) return 1;
    /* Then one more each way: the peer counted ours, neither leaves before. */
    void *buf;
    while ((st = mr_reserve(&buf)) == MR_AGAIN) drain(from, &failures);
    if (st == MR_OK) st = mr_send(buf, 1, peer);
    while (st == MR_OK && from[peer] < 11 && wall_now() - failed_at < 20) {
        st = drain(from, &failures);
        if (st == MR_OK) mr_wait(10);
    }
    if (st != MR_OK || from[peer] != 11 || !others_ok) return 1;
    printf("sender %d: ok\n", rank);
    return 0;
}

static int stalled(double limit_s, int wake_fd, double stall_s, unsigned stall_after)
{
    unsigned from[3] = {0};
    int failures = 0;
    double start = wall_now(), resumed = 0, before;
    bool told = false;
    char list[64] = "none";
    mr_status_t st = MR_OK;

    while (wall_now() - start < limit_s && failures < 2) {
        before = wall_now();
        if ((st = drain(from, &failures)) != MR_OK) break;
        if (!told && from[0] + from[1] >= stall_after) {
            /* The helper stops this process now. */
            told = write(wake_fd, "s", 1) == 1;
        }
        mr_wait(10);
        if (resumed == 0 && wall_now() - before > stall_s / 2) resumed = wall_now();
    }
    int ranks[3], count = 0;
    if (mr_failed_ranks(ranks, 3, &count) == MR_OK && count > 0) {
        size_t off = 0;
        for (int k = 0; k < count && k < 3; k++) {
            off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d", k ? "," : "", ranks[k]);
        }
    }
    printf("stalled 2: resumed after %.1f s; failed ranks: %s; received %u\n",
           resumed > 0 ? resumed - start : -1.0, list, from[0] + from[1]);
    return 0;
}

int main(int argc, char **argv)
{
    double stall_s = argc > 1 ? atof(argv[1]) : 0;
    size_t others = argc > 3 && strcmp(argv[2], "others") == 0 ? (size_t)atol(argv[3]) : 0;
    const char *env_rank = getenv("PMI_RANK");
    const char *timeout = getenv("MAILRAIL_TIMEOUT");
    double limit_s = 3.0 * (timeout ? atof(timeout) : 60) + stall_s;
    char epoch_file[256];
    int pipefd[2] = {-1, -1}, rank, size, status;
    pid_t helper = -1;

    if (stall_s <= 0 || env_rank == NULL || getenv("MR_STALL_DIR") == NULL ||
        (argc > 2 && (others <= PING_BYTES || argc != 4))) {
        fprintf(stderr, "usage: MR_STALL_DIR=DIR mpiexec -n 3 test_stall STALL_S [others BYTES]\n");
        return 2;
    }
    snprintf(epoch_file, sizeof(epoch_file), "%s/stopped_at", getenv("MR_STALL_DIR"));
    if (atoi(env_rank) == STALLED) {
        /* The helper: stops its parent when told, resumes it STALL_S later. */
        pid_t parent = getpid();
        if (pipe(pipefd) != 0) return 1;
        helper = fork();
        if (helper < 0) return 1;
        if (helper == 0) {
            char c;
            close(pipefd[1]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            /* Hydra sends every process SIGUSR1 when one ends: the helper stays. */
            signal(SIGUSR1, SIG_IGN);
            if (read(pipefd[0], &c, 1) != 1) _exit(0);
            FILE *f = fopen(epoch_file, "w");
            kill(parent, SIGSTOP);
            if (f != NULL) {
                fprintf(f, "%.3f\n", wall_now());
                fclose(f);
            }
            struct timespec ts = {(time_t)stall_s, (long)((stall_s - (time_t)stall_s) * 1e9)};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
            kill(parent, SIGCONT);
            _exit(0);
        }
        close(pipefd[0]);
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 3) {
        if (rank == 0) fprintf(stderr, "test_stall: run it on 3 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Comm comm = MPI_COMM_WORLD;
    if (mr_init_mpi(&comm, sizeof(comm)) != MR_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    /* Every pair connected first: the test is about the stall, not about dialling. */
    int all[3] = {0, 1, 2};
    if (mr_connect(all, 3) != MR_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    status = rank == STALLED ? stalled(limit_s, pipefd[1], stall_s,
                                       others ? OTHERS_STALL_AFTER : STALL_AFTER)
                             : sender(rank, limit_s, epoch_file, others);
    fflush(stdout);
    mr_finalize();
    if (helper > 0) waitpid(helper, NULL, 0);
    /* A rank was named failed: MPI cannot be finalized cleanly. */
    _exit(status);
}
