/*
 * A peer that stops making progress while this rank still has messages for
 * it: mr_finalize() must give up after MAILRAIL_TIMEOUT with MR_ERR_TIMEOUT,
 * or with MR_ERR_PEER_FAILED when the rule for sends in flight (no send
 * completed for MAILRAIL_TIMEOUT while the send pool was empty, which started
 * before finalize) named the peer failed first, and leave MPI (which
 * MailRail started) unfinalized instead of waiting in MPI_Finalize for the
 * stuck peer (issue 11).
 *
 *   MAILRAIL_TIMEOUT=3 mpiexec -n 2 test_stuck_peer
 *
 * Rank 1 sleeps STUCK_S seconds without calling MailRail; rank 0 sends until
 * its send pool is full of messages that cannot leave, then finalizes and
 * prints "finalize: <status> after <seconds> s". tests/run_stuck_peer.sh
 * checks that line.
 */
#include "mailrail.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define STUCK_S 20

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void)
{
    mr_status_t st = mr_init();
    double start, blocked = 0;

    if (st != MR_OK) return 2;
    if (mr_rank() == 1) {
        sleep(STUCK_S); /* No progress at all: the sender's messages cannot drain. */
        mr_finalize();
        return 0;
    }
    /* Send until mr_reserve() has said MR_AGAIN for a whole second. */
    start = now_s();
    while (now_s() - start < 15 && blocked < 1.0) {
        void *buf;
        double t = now_s();
        while ((st = mr_reserve(&buf)) == MR_AGAIN && now_s() - t < 1.0) {
            mr_message_t m;
            if (mr_receive(&m) == MR_OK) mr_release(m.data);
        }
        if (st == MR_AGAIN) {
            blocked = now_s() - t;
            break;
        }
        if (st != MR_OK || mr_send(buf, mr_datagram_size(), 1) != MR_OK) return 3;
    }
    printf("sender: backpressured for %.1f s\n", blocked);
    start = now_s();
    st = mr_finalize();
    printf("finalize: %s after %.1f s\n", mr_status_string(st), now_s() - start);
    fflush(stdout);
    /* MPI is left unfinalized: leave without waiting for the stuck rank. */
    _exit(st == MR_ERR_TIMEOUT || st == MR_ERR_PEER_FAILED ? 0 : 1);
}
