/*
 * The input layout of the UCX wire-format fuzz target, shared by the target
 * (fuzz_ucx_wire.c) and the generator of its seed corpus
 * (make_ucx_wire_corpus.c). The whole input is also parsed as an address
 * blob; as a header stream it reads:
 *
 *     byte  0       the receiving rank (0 to 255)
 *     byte  1       the job size minus one (1 to 256 ranks)
 *     bytes 2-      records: a length byte, then that many bytes of a message
 *                   header (fewer when the input ends)
 */
#ifndef MR_FUZZ_UCX_WIRE_H
#define MR_FUZZ_UCX_WIRE_H

#include "ucx_wire.h"

#define FUZZ_UCX_RANK_AT 0
#define FUZZ_UCX_SIZE_AT 1
#define FUZZ_UCX_RECORDS_AT 2

#endif /* MR_FUZZ_UCX_WIRE_H */
