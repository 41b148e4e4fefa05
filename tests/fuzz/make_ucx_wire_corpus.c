/*
 * Writes the seed corpus of the UCX wire-format fuzz target into a directory
 * (tests/fuzz/corpus/ucx_wire): address blobs and header streams as peers
 * send them, and the malformed ones a broken peer or another program could
 * send. The files are committed; rerun this after a change of the wire
 * format:
 *
 *     cc -std=c11 -D_GNU_SOURCE -Icore/include -Icore/plugin -Isubstrates/common -Isubstrates/ucx \
 *        -Itests/fuzz tests/fuzz/make_ucx_wire_corpus.c substrates/ucx/ucx_wire.c \
 *        -o /tmp/make_corpus
 *     /tmp/make_corpus tests/fuzz/corpus/ucx_wire
 */
#include "fuzz_corpus.h"
#include "fuzz_ucx_wire.h"


/* An address blob with a worker address of `worker_len` made-up bytes. */
static void corpus_addr(corpus_input_t *in, size_t worker_len)
{
    uint8_t worker[512];
    ucx_wire_addr_t a = {.pid = 31337, .boot_hash = UINT64_C(0x8f3a1c2b4d5e6f70),
                         .pidns = UINT64_C(0x4000000effffc), .worker = worker,
                         .worker_len = worker_len};

    for (size_t i = 0; i < worker_len; i++) worker[i] = (uint8_t)(i * 13 + 1);
    in->len = mr__ucx_wire_addr_encode(in->bytes, &a);
}

/* Starts a header stream received by `rank` of `size`. */
static void corpus_stream(corpus_input_t *in, uint8_t rank, unsigned size)
{
    uint8_t head[2] = {rank, (uint8_t)(size - 1)};

    in->len = 0;
    corpus_put(in, head, sizeof(head));
}

/* Appends a record: a header from `source`, `len` bytes of it (10 is whole). */
static void corpus_hdr(corpus_input_t *in, uint8_t kind, uint32_t imm, int32_t source,
                       uint8_t seen, uint8_t len)
{
    uint8_t h[UCX_WIRE_HDR_LEN + 8] = {0};
    ucx_wire_hdr_t w = {.kind = kind, .imm = imm, .source = source, .failures_seen = seen};

    mr__ucx_wire_hdr_encode(h, &w);
    corpus_put(in, &len, 1);
    corpus_put(in, h, len);
}

int main(int argc, char **argv)
{
    static corpus_input_t in;
    const char *dir = corpus_dir(argc, argv);

    /* Address blobs: genuine, padded by the exchange, and malformed. */
    corpus_addr(&in, 180);
    corpus_write(dir, "addr_valid", &in);
    memset(in.bytes + in.len, 0, 64);
    in.len += 64;
    corpus_write(dir, "addr_padded", &in);
    corpus_addr(&in, 1);
    corpus_write(dir, "addr_one_byte_worker", &in);
    corpus_addr(&in, 180);
    in.bytes[0] ^= 0xff;
    corpus_write(dir, "addr_bad_magic", &in);
    corpus_addr(&in, 180);
    in.bytes[4] = 2;
    corpus_write(dir, "addr_bad_version", &in);
    corpus_addr(&in, 180);
    memset(in.bytes + 12, 0, 4);
    corpus_write(dir, "addr_empty_worker", &in);
    corpus_addr(&in, 180);
    in.len -= 1;
    corpus_write(dir, "addr_worker_past_end", &in);
    corpus_addr(&in, 180);
    in.len = 20;
    corpus_write(dir, "addr_truncated", &in);
    /* A TCP substrate address: "MRTC", version 1, port 40000, 127.0.0.1. */
    const uint8_t tcp[12] = {'M', 'R', 'T', 'C', 1, 0, 0x9c, 0x40, 127, 0, 0, 1};
    in.len = 0;
    corpus_put(&in, tcp, sizeof(tcp));
    corpus_write(dir, "addr_tcp", &in);

    /* Header streams: what rank 0 of 4 gets, every kind from every peer. */
    corpus_stream(&in, 0, 4);
    for (int32_t src = 1; src < 4; src++) {
        corpus_hdr(&in, 1, 0x01020304u, src, 0, UCX_WIRE_HDR_LEN);
        for (uint8_t kind = UCX_WIRE_CTRL_CREDIT; kind <= 3; kind++) {
            corpus_hdr(&in, kind, kind == UCX_WIRE_CTRL_CREDIT ? 8 : 0xeadd638bu, src, kind,
                       UCX_WIRE_HDR_LEN);
        }
    }
    corpus_write(dir, "hdr_valid", &in);
    corpus_stream(&in, 255, 256);
    corpus_hdr(&in, 0, UINT32_MAX, 0, 255, UCX_WIRE_HDR_LEN);
    corpus_hdr(&in, 255, 0, 254, 1, UCX_WIRE_HDR_LEN);
    corpus_write(dir, "hdr_large_job", &in);
    corpus_stream(&in, 1, 2);
    corpus_hdr(&in, 0, 1, 0, 0, 9);
    corpus_hdr(&in, 0, 1, 0, 0, 11);
    corpus_hdr(&in, 0, 1, 0, 0, 0);
    corpus_hdr(&in, 0, 1, 0, 0, UCX_WIRE_HDR_LEN);
    corpus_write(dir, "hdr_bad_length", &in);
    corpus_stream(&in, 2, 4);
    corpus_hdr(&in, 0, 1, -1, 0, UCX_WIRE_HDR_LEN);
    corpus_hdr(&in, 0, 1, 4, 0, UCX_WIRE_HDR_LEN);
    corpus_hdr(&in, 0, 1, 2, 0, UCX_WIRE_HDR_LEN);
    corpus_hdr(&in, 0, 1, INT32_MIN, 0, UCX_WIRE_HDR_LEN);
    corpus_write(dir, "hdr_bad_source", &in);
    corpus_stream(&in, 0, 2);
    corpus_hdr(&in, 0, 1, 1, 0, UCX_WIRE_HDR_LEN);
    in.bytes[in.len - UCX_WIRE_HDR_LEN - 1] = UCX_WIRE_HDR_LEN + 5; /* Runs past the end. */
    corpus_write(dir, "hdr_truncated_record", &in);
    return 0;
}
