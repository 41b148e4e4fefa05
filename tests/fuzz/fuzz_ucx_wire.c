/*
 * libFuzzer target: the UCX substrate's wire format (substrates/ucx/ucx_wire.c),
 * the parser of every byte a peer sends: its address blob and the header of
 * each of its active messages. The input layout is in fuzz_ucx_wire.h.
 *
 * The properties checked: no decoder reads past its input (each sees an
 * exact copy, for ASan), an accepted address keeps its worker address inside
 * the blob and re-encodes to the same bytes (but the reserved ones, which are
 * not checked), an accepted header is exactly 10 bytes from a peer of the
 * receiving rank and re-encodes to the same bytes, a refusal comes with a
 * negative status, a reason and untouched outputs, and the FNV-1a hash of
 * the input is the same in two pieces as in one.
 */
#include "fuzz_ucx_wire.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void fuzz_check_error(mr_status_t status, const ucx_wire_error_t *err)
{
    if (status >= 0 || err->what == NULL || err->what[0] == '\0') abort();
}

static void fuzz_addr(const uint8_t *data, size_t size)
{
    uint8_t *blob = malloc(size ? size : 1);
    ucx_wire_addr_t a, untouched;
    ucx_wire_error_t err;

    memcpy(blob, data, size);
    memset(&a, 0xa5, sizeof(a));
    untouched = a;
    mr_status_t st = mr__ucx_wire_addr_decode(size ? blob : NULL, size, &a, &err);
    if (st == MR_OK) {
        if (size < UCX_WIRE_ADDR_HDR_LEN || a.worker != blob + UCX_WIRE_ADDR_HDR_LEN ||
            a.worker_len == 0 || a.worker_len > size - UCX_WIRE_ADDR_HDR_LEN) {
            abort();
        }
        uint8_t *again = malloc(UCX_WIRE_ADDR_HDR_LEN + a.worker_len);
        size_t n = mr__ucx_wire_addr_encode(again, &a);
        if (n != UCX_WIRE_ADDR_HDR_LEN + a.worker_len || memcmp(again, blob, 5) != 0 ||
            again[5] != 0 || again[6] != 0 || again[7] != 0 ||
            memcmp(again + 8, blob + 8, n - 8) != 0) {
            abort();
        }
        free(again);
    } else {
        fuzz_check_error(st, &err);
        if (memcmp(&a, &untouched, sizeof(a)) != 0) abort();
    }
    free(blob);
}

static void fuzz_header(const uint8_t *bytes, size_t len, int32_t rank, int32_t size)
{
    uint8_t *exact = malloc(len ? len : 1);
    ucx_wire_hdr_t h, untouched;
    ucx_wire_error_t err;

    memcpy(exact, bytes, len);
    memset(&h, 0xa5, sizeof(h));
    untouched = h;
    mr_status_t st = mr__ucx_wire_hdr_decode(exact, len, rank, size, &h, &err);
    if (st == MR_OK) {
        uint8_t again[UCX_WIRE_HDR_LEN];
        if (len != UCX_WIRE_HDR_LEN || h.source < 0 || h.source >= size || h.source == rank) {
            abort();
        }
        mr__ucx_wire_hdr_encode(again, &h);
        if (memcmp(again, exact, UCX_WIRE_HDR_LEN) != 0) abort();
    } else {
        fuzz_check_error(st, &err);
        if (memcmp(&h, &untouched, sizeof(h)) != 0) abort();
        if (len == UCX_WIRE_HDR_LEN && err.fault != UCX_WIRE_BAD_SOURCE) abort();
    }

    /* The same bytes as a handler's message with its id in front. */
    uint8_t id = 0xa5;
    st = mr__ucx_wire_hfront_decode(exact, len, &id, &err);
    if (st == MR_OK) {
        uint8_t again[UCX_WIRE_HFRONT_LEN];
        mr__ucx_wire_hfront_encode(again, id);
        if (len < UCX_WIRE_HFRONT_LEN || memcmp(again, exact, UCX_WIRE_HFRONT_LEN) != 0) abort();
    } else {
        fuzz_check_error(st, &err);
        if (id != 0xa5 || err.fault != UCX_WIRE_BAD_HFRONT) abort();
    }
    free(exact);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_addr(data, size);

    /* FNV-1a in two pieces is FNV-1a of the whole. */
    size_t cut = size ? data[0] % (size + 1) : 0;
    uint64_t head = mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, data, cut);
    if (mr__ucx_wire_fnv1a64(head, data + cut, size - cut) !=
        mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, data, size)) {
        abort();
    }

    if (size < FUZZ_UCX_RECORDS_AT) return 0;
    int32_t rank = data[FUZZ_UCX_RANK_AT], job = (int32_t)data[FUZZ_UCX_SIZE_AT] + 1;
    size_t pos = FUZZ_UCX_RECORDS_AT;
    while (pos < size) {
        size_t len = data[pos++];
        if (len > size - pos) len = size - pos;
        fuzz_header(data + pos, len, rank, job);
        pos += len;
    }
    return 0;
}
