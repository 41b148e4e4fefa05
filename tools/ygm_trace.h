/*
 * Reader and writer of YGM communication traces.
 *
 * YGM (LLNL's asynchronous communication library) records, with
 * YGM_COMM_TRACE=1, one binary file per rank, trace_<rank>.bin: a plain
 * concatenation of records written with cereal's binary archive
 * (little-endian, no file header). Each record is an int32 type index
 * followed by its fields. Two layouts exist:
 *
 *   type  older layout                          newer layout
 *   0     async {u64 event, i32 to, u32 size}   async
 *   1     mpi_send {u64, i32 to, u32 size}      mpi_send
 *   2     mpi_recv {u64, i32 from, u32 size}    mpi_send_complete {u64 event, u64 start, u32 size}
 *   3     barrier_begin {u64 event, 5 x u64}    mpi_recv
 *   4     barrier_end {u64 event, 5 x u64}      barrier_begin
 *   5     -                                     barrier_end
 *
 * The five barrier counters are send_count, recv_count, pending_isend_bytes,
 * send_local_buffer_bytes and send_remote_buffer_bytes.
 *
 * MPI send completions in the older layout. The older layout has no type for
 * them: with YGM_MPI_TRACE=1, YGM of that version (the tracer of LLNL/ygm pull
 * request 268; comm::check_completed_sends()) logs a completed MPI_Isend as a
 * second type-1 record, trace_mpi_send(next_id, request_id, buffer_size): a
 * fresh event id, the request id where a send has its destination, and the
 * buffer size. Message ids come from one counter per rank that steps by the
 * number of ranks, so a request id is a multiple of it (or congruent to the
 * rank, depending on the counter's start) and never a rank once past the first
 * step. YGM completes its sends in the order it posted them but logs only some
 * completions (those found by MPI_Testsome in process_receive_queue() are not).
 *
 * So, with the number of ranks n known, a type-1 record of the older layout
 * whose destination is outside 0..n-1 is read as YGM_MPI_SEND_COMPLETE when
 *   - an earlier type-1 send of the same buffer size is still waiting for its
 *     completion (the earliest such send is taken, and it and every send
 *     before it count as completed: completions follow the posting order), and
 *   - its event id and its request id are congruent modulo n (both come from
 *     the counter; computed on 32 bits, as YGM's int counter wraps).
 * Any other out-of-range rank, in any record kind and in either layout, is
 * refused as before. A request id inside 0..n-1 reads as a send, which the
 * replay does not use either.
 */
#ifndef YGM_TRACE_H
#define YGM_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum ygm_layout {
    YGM_LAYOUT_AUTO = 0,
    YGM_LAYOUT_OLD,
    YGM_LAYOUT_NEW
} ygm_layout_t;

/* Record kinds, independent of the layout's numbering. */
typedef enum ygm_kind {
    YGM_ASYNC,
    YGM_MPI_SEND,
    YGM_MPI_SEND_COMPLETE,
    YGM_MPI_RECV,
    YGM_BARRIER_BEGIN,
    YGM_BARRIER_END
} ygm_kind_t;

typedef struct ygm_record {
    ygm_kind_t kind;
    uint64_t event_id;
    int32_t peer;            /* to (async, mpi_send) or from (mpi_recv); -1 otherwise. */
    uint32_t size;           /* message_size or buffer_size; 0 for barriers. */
    /* mpi_send_complete only: the send's event id (newer layout), or the request id
     * YGM wrote in the destination field (older layout; sign-extended from 32 bits). */
    uint64_t start_id;
    uint64_t counters[5];    /* barriers only. */
} ygm_record_t;

/* A parsed trace: its records in file order. */
typedef struct ygm_trace {
    ygm_layout_t layout;
    ygm_record_t *records;
    size_t count;
} ygm_trace_t;

/*
 * Parses `len` bytes of one rank's trace. With YGM_LAYOUT_AUTO the layout is
 * detected: the one under which the whole buffer parses, with destinations
 * below `nranks` and barriers paired, wins; the older one when both do.
 * Older-layout send completions (above) are recognised only when `nranks` > 0.
 * Returns 0, or -1 with a message naming `name` and the byte offset of the
 * problem in `err`.
 */
int ygm_trace_parse(const uint8_t *buf, size_t len, ygm_layout_t layout, int nranks,
                    const char *name, ygm_trace_t *out, char *err, size_t err_len);

/* Reads and parses a file, like ygm_trace_parse(). */
int ygm_trace_read(const char *path, ygm_layout_t layout, int nranks, ygm_trace_t *out,
                   char *err, size_t err_len);

void ygm_trace_free(ygm_trace_t *trace);

/*
 * Appends one record in `layout` (OLD or NEW) to `f`. Returns 0 or -1. In the
 * older layout a YGM_MPI_SEND_COMPLETE is written as YGM does, a type-1 record
 * with the request id (start_id, which must fit in an int32) as destination.
 */
int ygm_trace_write(FILE *f, ygm_layout_t layout, const ygm_record_t *record);

const char *ygm_layout_name(ygm_layout_t layout);

#endif /* YGM_TRACE_H */
