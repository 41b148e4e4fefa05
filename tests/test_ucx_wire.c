/*
 * Unit tests of the UCX substrate's wire format (substrates/ucx/ucx_wire.c):
 * message headers, the address blob and the hashes, with hand-written bytes
 * and exact expected values. Single process, no UCX.
 */
#include "ucx_wire.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

/* ---- Message headers ----------------------------------------------------------------- */

/* kind 7, imm 0xdeadbeef, source 3, 5 failures seen. */
static const uint8_t hdr_bytes[UCX_WIRE_HDR_LEN] = {0x07, 0xef, 0xbe, 0xad, 0xde,
                                                    0x03, 0x00, 0x00, 0x00, 0x05};

START_TEST(hdr_decodes)
{
    ucx_wire_hdr_t h;
    ucx_wire_error_t err;

    ck_assert_int_eq(mr__ucx_wire_hdr_decode(hdr_bytes, sizeof(hdr_bytes), 0, 4, &h, &err), MR_OK);
    ck_assert_uint_eq(h.kind, 7);
    ck_assert_uint_eq(h.imm, 0xdeadbeefu);
    ck_assert_int_eq(h.source, 3);
    ck_assert_uint_eq(h.failures_seen, 5);

    /* The encoder writes the very same bytes. */
    uint8_t out[UCX_WIRE_HDR_LEN];
    mr__ucx_wire_hdr_encode(out, &h);
    ck_assert_mem_eq(out, hdr_bytes, sizeof(hdr_bytes));
}
END_TEST

START_TEST(hdr_encodes_every_field)
{
    ucx_wire_hdr_t h = {.kind = 3, .imm = 0x01020304u, .source = 0x0a0b0c0d,
                        .failures_seen = 255};
    const uint8_t want[UCX_WIRE_HDR_LEN] = {0x03, 0x04, 0x03, 0x02, 0x01,
                                            0x0d, 0x0c, 0x0b, 0x0a, 0xff};
    uint8_t out[UCX_WIRE_HDR_LEN];

    mr__ucx_wire_hdr_encode(out, &h);
    ck_assert_mem_eq(out, want, sizeof(want));
}
END_TEST

START_TEST(hdr_wrong_length_rejected)
{
    uint8_t longer[UCX_WIRE_HDR_LEN + 1];
    ucx_wire_hdr_t h;
    ucx_wire_error_t err;

    memcpy(longer, hdr_bytes, sizeof(hdr_bytes));
    longer[UCX_WIRE_HDR_LEN] = 0;
    memset(&h, 0x5a, sizeof(h));
    for (size_t n = 0; n < UCX_WIRE_HDR_LEN; n++) {
        memset(&err, 0, sizeof(err));
        ck_assert_int_eq(mr__ucx_wire_hdr_decode(hdr_bytes, n, 0, 4, &h, &err), MR_ERR_PROTOCOL);
        ck_assert_int_eq(err.fault, UCX_WIRE_BAD_HDR_LEN);
        ck_assert_int_eq(err.value, (long long)n);
        ck_assert_ptr_nonnull(err.what);
    }
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(longer, sizeof(longer), 0, 4, &h, &err),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, UCX_WIRE_BAD_HDR_LEN);
    ck_assert_int_eq(err.value, 11);
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(NULL, UCX_WIRE_HDR_LEN, 0, 4, &h, &err),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, UCX_WIRE_BAD_HDR_LEN);
    /* Nothing is written when nothing is decoded. */
    ck_assert_uint_eq(h.imm, 0x5a5a5a5au);
}
END_TEST

/* Asserts that a header from `source` is refused by rank `rank` of `size`. */
static void hdr_source_refused(int32_t source, int32_t rank, int32_t size)
{
    uint8_t b[UCX_WIRE_HDR_LEN];
    ucx_wire_hdr_t h = {.kind = 0, .imm = 1, .source = source, .failures_seen = 0};
    ucx_wire_error_t err;

    mr__ucx_wire_hdr_encode(b, &h);
    memset(&h, 0x5a, sizeof(h));
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(b, sizeof(b), rank, size, &h, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, UCX_WIRE_BAD_SOURCE);
    ck_assert_int_eq(err.value, source);
    ck_assert_uint_eq(h.imm, 0x5a5a5a5au);
}

START_TEST(hdr_bad_source_rejected)
{
    hdr_source_refused(-1, 0, 4);
    hdr_source_refused(4, 0, 4);
    hdr_source_refused(2, 2, 4);       /* This rank itself. */
    hdr_source_refused(INT32_MIN, 1, 2);
    hdr_source_refused(INT32_MAX, 1, 2);
    /* The bytes ff ff ff ff are source -1. */
    uint8_t b[UCX_WIRE_HDR_LEN] = {0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0};
    ucx_wire_hdr_t h;
    ucx_wire_error_t err;
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(b, sizeof(b), 0, 4, &h, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.value, -1);
    /* The largest and smallest peers pass. */
    b[5] = 3;
    b[6] = b[7] = b[8] = 0;
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(b, sizeof(b), 0, 4, &h, &err), MR_OK);
    ck_assert_int_eq(h.source, 3);
    b[5] = 0;
    ck_assert_int_eq(mr__ucx_wire_hdr_decode(b, sizeof(b), 3, 4, &h, &err), MR_OK);
    ck_assert_int_eq(h.source, 0);
}
END_TEST

/* ---- A handler's prefix ---------------------------------------------------------------- */

START_TEST(hfront_round_trip)
{
    const uint8_t want[UCX_WIRE_HFRONT_LEN] = {0xc8, 0, 0, 0, 0, 0, 0, 0};
    uint8_t msg[UCX_WIRE_HFRONT_LEN + 3] = {0};
    ucx_wire_error_t err;
    uint8_t id = 0;

    mr__ucx_wire_hfront_encode(msg, 200);
    ck_assert_mem_eq(msg, want, sizeof(want));
    ck_assert_int_eq(mr__ucx_wire_hfront_decode(msg, sizeof(msg), &id, &err), MR_OK);
    ck_assert_uint_eq(id, 200);
    id = 7; /* A prefix alone is a message with an empty payload. */
    ck_assert_int_eq(mr__ucx_wire_hfront_decode(msg, UCX_WIRE_HFRONT_LEN, &id, &err), MR_OK);
    ck_assert_uint_eq(id, 200);
}
END_TEST

START_TEST(hfront_bad_prefix_rejected)
{
    uint8_t msg[UCX_WIRE_HFRONT_LEN] = {5, 0, 0, 0, 0, 0, 0, 0};
    ucx_wire_error_t err;
    uint8_t id = 9;

    for (size_t n = 0; n < UCX_WIRE_HFRONT_LEN; n++) {
        memset(&err, 0, sizeof(err));
        ck_assert_int_eq(mr__ucx_wire_hfront_decode(msg, n, &id, &err), MR_ERR_PROTOCOL);
        ck_assert_int_eq(err.fault, UCX_WIRE_BAD_HFRONT);
    }
    ck_assert_int_eq(mr__ucx_wire_hfront_decode(NULL, sizeof(msg), &id, &err), MR_ERR_PROTOCOL);
    for (size_t i = 1; i < UCX_WIRE_HFRONT_LEN; i++) {
        msg[i] = 1; /* Padding that is not zero: not a prefix this version wrote. */
        memset(&err, 0, sizeof(err));
        ck_assert_int_eq(mr__ucx_wire_hfront_decode(msg, sizeof(msg), &id, &err),
                         MR_ERR_PROTOCOL);
        ck_assert_int_eq(err.fault, UCX_WIRE_BAD_HFRONT);
        msg[i] = 0;
    }
    ck_assert_uint_eq(id, 9); /* Written on success only. */
}
END_TEST

/* ---- The address blob ----------------------------------------------------------------- */

/* pid 4660, a 4-byte worker address, boot hash and pid namespace as below, 2 bytes padding. */
static const uint8_t addr_bytes[UCX_WIRE_ADDR_HDR_LEN + 6] = {
    0x52, 0x4d, 0x55, 0x58,                         /* magic */
    0x01, 0x00, 0x00, 0x00,                         /* version, reserved */
    0x34, 0x12, 0x00, 0x00,                         /* pid 0x1234 */
    0x04, 0x00, 0x00, 0x00,                         /* worker address length */
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* boot hash 0x0102030405060708 */
    0xf0, 0xde, 0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12, /* pid namespace 0x123456789abcdef0 */
    0xaa, 0xbb, 0xcc, 0xdd,                         /* worker address */
    0x00, 0x00};                                    /* zero padding of the exchange */

START_TEST(addr_decodes)
{
    ucx_wire_addr_t a;
    ucx_wire_error_t err;

    ck_assert_int_eq(mr__ucx_wire_addr_decode(addr_bytes, sizeof(addr_bytes), &a, &err), MR_OK);
    ck_assert_uint_eq(a.pid, 0x1234);
    ck_assert_uint_eq(a.boot_hash, UINT64_C(0x0102030405060708));
    ck_assert_uint_eq(a.pidns, UINT64_C(0x123456789abcdef0));
    ck_assert_uint_eq(a.worker_len, 4);
    ck_assert_ptr_eq(a.worker, addr_bytes + UCX_WIRE_ADDR_HDR_LEN);

    /* The encoder writes the same blob, without the padding. */
    uint8_t out[UCX_WIRE_ADDR_HDR_LEN + 4];
    memset(out, 0x77, sizeof(out));
    ck_assert_uint_eq(mr__ucx_wire_addr_encode(out, &a), UCX_WIRE_ADDR_HDR_LEN + 4);
    ck_assert_mem_eq(out, addr_bytes, sizeof(out));

    /* A worker address that fills the blob exactly is accepted. */
    ck_assert_int_eq(mr__ucx_wire_addr_decode(addr_bytes, UCX_WIRE_ADDR_HDR_LEN + 4, &a, &err),
                     MR_OK);
    ck_assert_uint_eq(a.worker_len, 4);
}
END_TEST

START_TEST(addr_reserved_bytes_ignored)
{
    uint8_t b[sizeof(addr_bytes)];
    ucx_wire_addr_t a;
    ucx_wire_error_t err;

    /* The reserved bytes are written as zero but never checked. */
    memcpy(b, addr_bytes, sizeof(b));
    b[5] = 1;
    b[6] = 2;
    b[7] = 3;
    ck_assert_int_eq(mr__ucx_wire_addr_decode(b, sizeof(b), &a, &err), MR_OK);
    ck_assert_uint_eq(a.pid, 0x1234);
}
END_TEST

/* Asserts that `b` (`len` bytes) is refused with this fault and value, writing nothing. */
static void addr_refused(const uint8_t *b, size_t len, ucx_wire_fault_t fault, long long value)
{
    ucx_wire_addr_t a;
    ucx_wire_error_t err;

    memset(&a, 0x5a, sizeof(a));
    ck_assert_int_eq(mr__ucx_wire_addr_decode(b, len, &a, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, fault);
    ck_assert_int_eq(err.value, value);
    ck_assert_ptr_nonnull(err.what);
    ck_assert_uint_eq(a.pid, 0x5a5a5a5au);
}

START_TEST(addr_bad_fields_rejected)
{
    uint8_t b[sizeof(addr_bytes)];

    addr_refused(NULL, 64, UCX_WIRE_TRUNCATED, 0);
    for (size_t n = 0; n < UCX_WIRE_ADDR_HDR_LEN; n++) {
        addr_refused(addr_bytes, n, UCX_WIRE_TRUNCATED, (long long)n);
    }
    memcpy(b, addr_bytes, sizeof(b));
    b[0] = 'M'; /* "MMUX" */
    addr_refused(b, sizeof(b), UCX_WIRE_BAD_MAGIC, 0x58554d4d);
    memcpy(b, addr_bytes, sizeof(b));
    b[4] = 2;
    addr_refused(b, sizeof(b), UCX_WIRE_BAD_VERSION, 2);
    /* A TCP substrate address is no UCX address. */
    const uint8_t tcp[UCX_WIRE_ADDR_HDR_LEN + 4] = {'M', 'R', 'T', 'C', 1, 0, 0x9c, 0x40,
                                                    127, 0, 0, 1};
    addr_refused(tcp, sizeof(tcp), UCX_WIRE_BAD_MAGIC, 0x4354524d);
    /* An empty worker address, and ones that run past the blob. */
    memcpy(b, addr_bytes, sizeof(b));
    b[12] = 0;
    addr_refused(b, sizeof(b), UCX_WIRE_BAD_LENGTH, 0);
    memcpy(b, addr_bytes, sizeof(b));
    addr_refused(b, UCX_WIRE_ADDR_HDR_LEN + 3, UCX_WIRE_BAD_LENGTH, 4);
    b[12] = 7;
    addr_refused(b, sizeof(b), UCX_WIRE_BAD_LENGTH, 7);
    b[12] = 0xff;
    b[13] = 0xff;
    b[14] = 0xff;
    b[15] = 0xff;
    addr_refused(b, sizeof(b), UCX_WIRE_BAD_LENGTH, 0xffffffffLL);
}
END_TEST

/* ---- Hashes ---------------------------------------------------------------------------- */

START_TEST(fnv1a64_known_answers)
{
    /* The published FNV-1a 64-bit test vectors. */
    ck_assert_uint_eq(mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, "", 0),
                      UINT64_C(0xcbf29ce484222325));
    ck_assert_uint_eq(mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, "a", 1),
                      UINT64_C(0xaf63dc4c8601ec8c));
    ck_assert_uint_eq(mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, "foobar", 6),
                      UINT64_C(0x85944171f73967e8));
    /* Hashing in two pieces is hashing the whole. */
    uint64_t foo = mr__ucx_wire_fnv1a64(UCX_WIRE_FNV64_INIT, "foo", 3);
    ck_assert_uint_eq(mr__ucx_wire_fnv1a64(foo, "bar", 3), UINT64_C(0x85944171f73967e8));
}
END_TEST


static Suite *ucx_wire_suite(void)
{
    Suite *s = suite_create("ucx-wire");
    TCase *tc = tcase_create("headers");

    tcase_add_test(tc, hdr_decodes);
    tcase_add_test(tc, hdr_encodes_every_field);
    tcase_add_test(tc, hdr_wrong_length_rejected);
    tcase_add_test(tc, hdr_bad_source_rejected);
    tcase_add_test(tc, hfront_round_trip);
    tcase_add_test(tc, hfront_bad_prefix_rejected);
    suite_add_tcase(s, tc);
    tc = tcase_create("address");
    tcase_add_test(tc, addr_decodes);
    tcase_add_test(tc, addr_reserved_bytes_ignored);
    tcase_add_test(tc, addr_bad_fields_rejected);
    suite_add_tcase(s, tc);
    tc = tcase_create("hashes");
    tcase_add_test(tc, fnv1a64_known_answers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ucx_wire_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
