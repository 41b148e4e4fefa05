/*
 * mailrail_moe's baseline, what a user codes today: the tokens packed by
 * destination, MPI_Alltoall of the counts, MPI_Alltoallv of the tokens, the
 * experts over what arrived, MPI_Alltoallv back, the combine (moe_step.h).
 */
#include "moe_step.h"
#include "tool_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* *buf with room for `len` bytes, grown when needed; stops the job when out of memory. */
static uint8_t *moe_buffer(uint8_t **buf, size_t *cap, size_t len)
{
    if (len > *cap || *buf == NULL) {
        free(*buf);
        *buf = malloc(len + 1);
        *cap = len;
        if (*buf == NULL) {
            fprintf(stderr, "mailrail_moe: out of memory for %zu bytes of MPI buffers\n", len);
            tool_abort();
        }
    }
    return *buf;
}

/*
 * One step through MPI: returns this rank's seconds. Records of header and
 * token, packed by destination in the order of the tokens; the results come
 * back in the same places.
 */
double moe_step_alltoallv(moe_rank_t *r)
{
    const moe_options_t *o = r->o;
    size_t rec = MOE_HEADER + o->hidden, pairs = (size_t)o->tokens * o->k;
    int p = r->size;
    int *scount = calloc((size_t)p * 4, sizeof(int)), *sdispl = scount + p,
        *rcount = scount + 2 * p, *rdispl = scount + 3 * p;
    size_t *fill = calloc((size_t)p, sizeof(size_t));
    MPI_Datatype record;
    MPI_Request req;
    long nap = moe_nap_ns(o);

    MPI_Type_contiguous((int)rec, MPI_BYTE, &record);
    MPI_Type_commit(&record);
    r->piece_bytes = o->hidden;
    r->pieces = 1;
    r->full_mask = 1;
    moe_barrier(o);
    double start = tool_now();

    for (size_t i = 0; i < pairs; i++) scount[r->owner[r->route[i]]]++;
    for (int d = 1; d < p; d++) sdispl[d] = sdispl[d - 1] + scount[d - 1];
    uint8_t *send = moe_buffer(&r->a2a_send, &r->a2a_send_cap, pairs * rec);
    for (uint64_t t = 0; t < o->tokens; t++) {
        for (unsigned j = 0; j < o->k; j++) {
            moe_header_t h = {.token = (uint32_t)t, .expert = r->route[t * o->k + j],
                              .slot = (uint8_t)j};
            int d = r->owner[h.expert];
            uint8_t *at = send + ((size_t)sdispl[d] + fill[d]++) * rec;
            memcpy(at, &h, sizeof(h));
            memcpy(at + MOE_HEADER, r->tokens + t * o->hidden, o->hidden);
        }
    }
    MPI_Ialltoall(scount, 1, MPI_INT, rcount, 1, MPI_INT, MPI_COMM_WORLD, &req);
    tool_mpi_wait(&req, nap);
    size_t nrecv = 0;
    for (int d = 0; d < p; d++) {
        rdispl[d] = (int)nrecv;
        nrecv += (size_t)rcount[d];
    }
    uint8_t *recv = moe_buffer(&r->a2a_recv, &r->a2a_recv_cap, nrecv * rec);
    MPI_Ialltoallv(send, scount, sdispl, record, recv, rcount, rdispl, record, MPI_COMM_WORLD,
                   &req);
    tool_mpi_wait(&req, nap);
    /* The experts, in place, source by source. */
    for (int d = 0; d < p; d++) {
        for (int i = 0; i < rcount[d]; i++) {
            uint8_t *at = recv + ((size_t)rdispl[d] + (size_t)i) * rec;
            if (moe_expert(r, at, rec, d, at) != rec) memset(at, 0xff, MOE_HEADER);
        }
    }
    MPI_Ialltoallv(recv, rcount, rdispl, record, send, scount, sdispl, record, MPI_COMM_WORLD,
                   &req);
    tool_mpi_wait(&req, nap);
    for (int d = 0; d < p; d++) {
        for (int i = 0; i < scount[d]; i++) moe_combine(r, send + ((size_t)sdispl[d] + (size_t)i) * rec, rec, d);
    }
    double seconds = tool_now() - start;

    free(scount);
    free(fill);
    MPI_Type_free(&record);
    return seconds;
}

void moe_alltoallv_free(moe_rank_t *r)
{
    free(r->a2a_send);
    free(r->a2a_recv);
    r->a2a_send = r->a2a_recv = NULL;
    r->a2a_send_cap = r->a2a_recv_cap = 0;
}
