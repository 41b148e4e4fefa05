/*
 * Unit tests of the TCP substrate's wire format (substrates/tcp/tcp_wire.c):
 * frame headers, the AUTH message and the address blob, with hand-written
 * bytes and exact expected values. Single process, no sockets.
 */
#include "tcp_wire.h"

#include <arpa/inet.h>
#include <check.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t test_key[TCP_WIRE_KEY_LEN] = {
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
static const uint8_t test_nonce[TCP_WIRE_NONCE_LEN] = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5,
                                                       0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab,
                                                       0xac, 0xad, 0xae, 0xaf};

/* ---- Frame headers ------------------------------------------------------------------- */

START_TEST(frame_data_header_decodes)
{
    /* length 300, imm 0xdeadbeef, kind 7, data channel, reserved 0. */
    const uint8_t h[TCP_WIRE_HDR_LEN] = {0x2c, 0x01, 0x00, 0x00, 0xef, 0xbe,
                                         0xad, 0xde, 0x07, 0x00, 0x00, 0x00};
    tcp_wire_frame_t f;
    tcp_wire_error_t err;

    ck_assert_int_eq(tcp_wire_frame_decode(h, sizeof(h), 4096, &f, &err), MR_OK);
    ck_assert_uint_eq(f.length, 300);
    ck_assert_uint_eq(f.imm, 0xdeadbeefu);
    ck_assert_uint_eq(f.kind, 7);
    ck_assert_uint_eq(f.channel, TCP_WIRE_CH_DATA);
    ck_assert_uint_eq(f.got, 0);
    ck_assert_uint_eq(tcp_wire_frame_need(&f), 300);

    /* The encoder writes the very same bytes. */
    uint8_t out[TCP_WIRE_HDR_LEN];
    tcp_wire_frame_encode(out, TCP_WIRE_CH_DATA, 7, 0xdeadbeefu, 300);
    ck_assert_mem_eq(out, h, sizeof(h));

    /* A length exactly at the limit is accepted. */
    ck_assert_int_eq(tcp_wire_frame_decode(h, sizeof(h), 300, &f, &err), MR_OK);
}
END_TEST

START_TEST(frame_control_header_decodes)
{
    uint8_t h[TCP_WIRE_HDR_LEN];
    tcp_wire_frame_t f;
    tcp_wire_error_t err;

    tcp_wire_frame_encode(h, TCP_WIRE_CH_CONTROL, 0, 42, 0);
    ck_assert_int_eq(tcp_wire_frame_decode(h, sizeof(h), 0, &f, &err), MR_OK);
    ck_assert_uint_eq(f.channel, TCP_WIRE_CH_CONTROL);
    ck_assert_uint_eq(f.imm, 42);
    ck_assert_uint_eq(f.length, 0);
}
END_TEST

START_TEST(frame_truncated_needs_more)
{
    uint8_t h[TCP_WIRE_HDR_LEN];
    tcp_wire_frame_t f;
    tcp_wire_error_t err;

    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 1, 2, 3);
    memset(&f, 0x5a, sizeof(f));
    for (size_t n = 0; n < TCP_WIRE_HDR_LEN; n++) {
        ck_assert_int_eq(tcp_wire_frame_decode(h, n, 4096, &f, &err), MR_AGAIN);
    }
    /* Nothing is written when nothing is decoded. */
    ck_assert_uint_eq(f.length, 0x5a5a5a5au);
}
END_TEST

/* Asserts that decoding `h` under `limit` fails with this status, fault and value. */
static void frame_refused(const uint8_t h[TCP_WIRE_HDR_LEN], size_t limit, mr_status_t status,
                          tcp_wire_fault_t fault, long long value)
{
    tcp_wire_frame_t f;
    tcp_wire_error_t err;

    memset(&f, 0x5a, sizeof(f));
    ck_assert_int_eq(tcp_wire_frame_decode(h, TCP_WIRE_HDR_LEN, limit, &f, &err), status);
    ck_assert_int_eq(err.fault, fault);
    ck_assert_int_eq(err.value, value);
    ck_assert_ptr_nonnull(err.what);
    ck_assert_uint_eq(f.length, 0x5a5a5a5au);
}

START_TEST(frame_oversize_rejected)
{
    uint8_t h[TCP_WIRE_HDR_LEN];

    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 1, 2, 4097);
    frame_refused(h, 4096, MR_ERR_MESSAGE_TOO_LONG, TCP_WIRE_TOO_LONG, 4097);
    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 1, 2, UINT32_MAX);
    frame_refused(h, 4096, MR_ERR_MESSAGE_TOO_LONG, TCP_WIRE_TOO_LONG, (long long)UINT32_MAX);
    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 1, 2, 1);
    frame_refused(h, 0, MR_ERR_MESSAGE_TOO_LONG, TCP_WIRE_TOO_LONG, 1);
}
END_TEST

START_TEST(frame_bad_fields_rejected)
{
    uint8_t h[TCP_WIRE_HDR_LEN];
    tcp_wire_frame_t f;
    tcp_wire_error_t err;

    tcp_wire_frame_encode(h, 2, 0, 0, 0);
    frame_refused(h, 4096, MR_ERR_PROTOCOL, TCP_WIRE_BAD_CHANNEL, 2);
    ck_assert_int_eq(tcp_wire_frame_decode(h, sizeof(h), 4096, &f, &err), MR_ERR_PROTOCOL);
    ck_assert_str_eq(err.what, "unknown channel");
    tcp_wire_frame_encode(h, 255, 0, 0, 0);
    frame_refused(h, 4096, MR_ERR_PROTOCOL, TCP_WIRE_BAD_CHANNEL, 255);
    tcp_wire_frame_encode(h, TCP_WIRE_CH_CONTROL, 0, 0, 8);
    frame_refused(h, 4096, MR_ERR_PROTOCOL, TCP_WIRE_CONTROL_PAYLOAD, 8);
    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 0, 0, 8);
    h[11] = 0x80;
    frame_refused(h, 4096, MR_ERR_PROTOCOL, TCP_WIRE_BAD_RESERVED, 0x8000);
}
END_TEST

START_TEST(frame_take_bounds)
{
    uint8_t h[TCP_WIRE_HDR_LEN];
    tcp_wire_frame_t f;
    tcp_wire_error_t err;
    size_t off;

    tcp_wire_frame_encode(h, TCP_WIRE_CH_DATA, 0, 0, 10);
    ck_assert_int_eq(tcp_wire_frame_decode(h, sizeof(h), 4096, &f, &err), MR_OK);
    ck_assert_uint_eq(tcp_wire_frame_take(&f, 4, &off), 4);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_eq(tcp_wire_frame_take(&f, 100, &off), 6);
    ck_assert_uint_eq(off, 4);
    ck_assert_uint_eq(tcp_wire_frame_need(&f), 0);
    ck_assert_uint_eq(tcp_wire_frame_take(&f, 100, &off), 0);
    ck_assert_uint_eq(off, 10);
}
END_TEST

/* ---- AUTH ---------------------------------------------------------------------------- */

/*
 * The MAC is HMAC-SHA-512 truncated to 32 bytes (libsodium's crypto_auth), of
 * nonce || connector (LE) || acceptor (LE) || "MRTCP-AUTH". The expected bytes
 * come from Python's hmac module, not from libsodium:
 *   hmac.new(bytes(range(32)), nonce + bytes([3,0,0,0,5,0,0,0]) + b"MRTCP-AUTH",
 *            hashlib.sha512).digest()[:32]
 */
START_TEST(auth_mac_known_answer)
{
    static const uint8_t expected[TCP_WIRE_MAC_LEN] = {
        0x29, 0xaf, 0x5b, 0x79, 0x33, 0xae, 0x47, 0x0a, 0xf2, 0xdb, 0x38, 0xb5, 0xa9, 0x40, 0x0a, 0x75,
        0x25, 0x74, 0x5f, 0x0f, 0x7d, 0xdc, 0xe7, 0x2b, 0x3d, 0xdc, 0x25, 0x75, 0x97, 0xd3, 0x59, 0xfd};
    uint8_t m[TCP_WIRE_AUTH_LEN];

    tcp_wire_auth_encode(m, test_key, test_nonce, 3, 5);
    ck_assert_mem_eq(m + 12, expected, sizeof(expected));
}
END_TEST

START_TEST(auth_round_trip)
{
    uint8_t m[TCP_WIRE_AUTH_LEN];
    tcp_wire_error_t err;
    int32_t rank = -1;

    tcp_wire_auth_encode(m, test_key, test_nonce, 3, 5);
    /* Magic "MRAU", version 3, reserved 0, rank 3, little-endian. */
    const uint8_t head[12] = {0x55, 0x41, 0x52, 0x4d, 0x03, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
                              0x00};
    ck_assert_mem_eq(m, head, sizeof(head));
    ck_assert_int_eq(tcp_wire_auth_verify(m, sizeof(m), test_key, test_nonce, 5, 8, &rank, &err),
                     MR_OK);
    ck_assert_int_eq(rank, 3);
    /* Short input asks for more and leaves the output alone. */
    rank = -1;
    ck_assert_int_eq(tcp_wire_auth_verify(m, sizeof(m) - 1, test_key, test_nonce, 5, 8, &rank,
                                          &err), MR_AGAIN);
    ck_assert_int_eq(rank, -1);
}
END_TEST

/* Asserts that verifying `m` as rank `acceptor` fails with this status, fault and value. */
static void auth_refused(const uint8_t m[TCP_WIRE_AUTH_LEN], int32_t acceptor,
                         mr_status_t status, tcp_wire_fault_t fault, long long value)
{
    tcp_wire_error_t err;
    int32_t rank = -7;

    ck_assert_int_eq(tcp_wire_auth_verify(m, TCP_WIRE_AUTH_LEN, test_key, test_nonce, acceptor,
                                          4, &rank, &err), status);
    ck_assert_int_eq(err.fault, fault);
    ck_assert_int_eq(err.value, value);
    ck_assert_ptr_nonnull(err.what);
    ck_assert_int_eq(rank, -7);
}

START_TEST(auth_wrong_mac_rejected)
{
    uint8_t m[TCP_WIRE_AUTH_LEN], other_key[TCP_WIRE_KEY_LEN], other_nonce[TCP_WIRE_NONCE_LEN];

    /* Each byte of the MAC matters. */
    for (size_t i = 12; i < TCP_WIRE_AUTH_LEN; i++) {
        tcp_wire_auth_encode(m, test_key, test_nonce, 1, 2);
        m[i] ^= 0x01;
        auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC, 1);
    }
    /* Another job's key, another nonce, or an answer meant for another acceptor. */
    memcpy(other_key, test_key, sizeof(other_key));
    other_key[31] ^= 0x80;
    tcp_wire_auth_encode(m, other_key, test_nonce, 1, 2);
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC, 1);
    memcpy(other_nonce, test_nonce, sizeof(other_nonce));
    other_nonce[0] ^= 1;
    tcp_wire_auth_encode(m, test_key, other_nonce, 1, 2);
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC, 1);
    tcp_wire_auth_encode(m, test_key, test_nonce, 1, 3);
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAC, 1);
}
END_TEST

START_TEST(auth_bad_header_rejected)
{
    uint8_t m[TCP_WIRE_AUTH_LEN];

    tcp_wire_auth_encode(m, test_key, test_nonce, 1, 2);
    m[3] = 'X';
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_MAGIC, 0x58524155);
    tcp_wire_auth_encode(m, test_key, test_nonce, 1, 2);
    m[4] = 2; /* The version before either rank could dial. */
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_VERSION, 2);
    tcp_wire_auth_encode(m, test_key, test_nonce, 1, 2);
    m[6] = 1;
    auth_refused(m, 2, MR_ERR_PROTOCOL, TCP_WIRE_BAD_RESERVED, 1);
}
END_TEST

START_TEST(auth_bad_rank_rejected)
{
    uint8_t m[TCP_WIRE_AUTH_LEN];

    /* A genuine MAC, but rank 2 does not connect to itself, nor -1 or 4 (of 4) to anyone. */
    tcp_wire_auth_encode(m, test_key, test_nonce, 2, 2);
    auth_refused(m, 2, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK, 2);
    tcp_wire_auth_encode(m, test_key, test_nonce, -1, 2);
    auth_refused(m, 2, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK, -1);
    tcp_wire_auth_encode(m, test_key, test_nonce, 4, 2);
    auth_refused(m, 2, MR_ERR_INVALID_RANK, TCP_WIRE_BAD_RANK, 4);
}
END_TEST

/* Either rank of a pair may dial: a higher rank's AUTH is as good as a lower one's. */
START_TEST(auth_from_higher_rank)
{
    uint8_t m[TCP_WIRE_AUTH_LEN];
    tcp_wire_error_t err;
    int32_t rank = -1;

    tcp_wire_auth_encode(m, test_key, test_nonce, 3, 0);
    ck_assert_int_eq(tcp_wire_auth_verify(m, sizeof(m), test_key, test_nonce, 0, 4, &rank, &err),
                     MR_OK);
    ck_assert_int_eq(rank, 3);
}
END_TEST

/* ---- ACCEPT -------------------------------------------------------------------------- */

/*
 * The ACCEPT's MAC covers nonce || connector || acceptor || "MRTCP-ACCEPT",
 * so that an AUTH cannot be sent back as an ACCEPT. From Python:
 *   hmac.new(bytes(range(32)), nonce + bytes([3,0,0,0,5,0,0,0]) + b"MRTCP-ACCEPT",
 *            hashlib.sha512).digest()[:32]
 */
static const uint8_t accept_known_mac[TCP_WIRE_MAC_LEN] = {
    0x95, 0xe8, 0xc7, 0x38, 0xba, 0x93, 0x30, 0x13, 0x99, 0x7d, 0xf4, 0xfb, 0x81, 0xa2, 0x75, 0x2e,
    0x0e, 0x2f, 0x92, 0x28, 0x96, 0x0b, 0x6f, 0x58, 0x41, 0xe8, 0x2e, 0x54, 0x84, 0xda, 0xd8, 0x10};

START_TEST(accept_round_trip_and_rejects)
{
    uint8_t m[TCP_WIRE_ACCEPT_LEN], auth[TCP_WIRE_AUTH_LEN], other_nonce[TCP_WIRE_NONCE_LEN];
    tcp_wire_error_t err;

    tcp_wire_accept_encode(m, test_key, test_nonce, 3, 5);
    /* Magic "MRAC", version 3, reserved 0, the acceptor's rank 5. */
    const uint8_t head[12] = {0x43, 0x41, 0x52, 0x4d, 0x03, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00,
                              0x00};
    ck_assert_mem_eq(m, head, sizeof(head));
    ck_assert_mem_eq(m + 12, accept_known_mac, TCP_WIRE_MAC_LEN);
    ck_assert_int_eq(tcp_wire_accept_verify(m, sizeof(m), test_key, test_nonce, 3, 5, &err), MR_OK);
    ck_assert_int_eq(tcp_wire_accept_verify(m, sizeof(m) - 1, test_key, test_nonce, 3, 5, &err),
                     MR_AGAIN);
    /* Another rank answered, or for another connector, or to another challenge. */
    ck_assert_int_eq(tcp_wire_accept_verify(m, sizeof(m), test_key, test_nonce, 3, 6, &err),
                     MR_ERR_INVALID_RANK);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_RANK);
    ck_assert_int_eq(tcp_wire_accept_verify(m, sizeof(m), test_key, test_nonce, 2, 5, &err),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_MAC);
    memcpy(other_nonce, test_nonce, sizeof(other_nonce));
    other_nonce[5] ^= 4;
    ck_assert_int_eq(tcp_wire_accept_verify(m, sizeof(m), test_key, other_nonce, 3, 5, &err),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_MAC);
    /* An AUTH message is no ACCEPT, even with the acceptor's rank in it. */
    tcp_wire_auth_encode(auth, test_key, test_nonce, 5, 3);
    ck_assert_int_eq(tcp_wire_accept_verify(auth, sizeof(auth), test_key, test_nonce, 3, 5, &err),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_MAGIC);
    memcpy(auth, m, sizeof(auth));
    auth[0] = 0x55; /* The ACCEPT's bytes under the AUTH magic: still the wrong MAC. */
    int32_t rank = -1;
    ck_assert_int_eq(tcp_wire_auth_verify(auth, sizeof(auth), test_key, test_nonce, 3, 8, &rank,
                                          &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_MAC);
}
END_TEST

/* ---- Address blob -------------------------------------------------------------------- */

START_TEST(addr_round_trip_and_rejects)
{
    struct sockaddr_in in, out;
    uint8_t b[TCP_WIRE_ADDR_LEN];
    tcp_wire_error_t err;

    memset(&in, 0, sizeof(in));
    in.sin_family = AF_INET;
    in.sin_port = htons(4242);
    in.sin_addr.s_addr = htonl(0x7f000001);
    tcp_wire_addr_encode(b, &in);
    const uint8_t expect[TCP_WIRE_ADDR_LEN] = {'M', 'R', 'T', 'C', 1, 0, 0x10, 0x92,
                                               127, 0, 0, 1};
    ck_assert_mem_eq(b, expect, sizeof(b));
    ck_assert_int_eq(tcp_wire_addr_parse(b, sizeof(b), &out, &err), MR_OK);
    ck_assert_uint_eq(ntohs(out.sin_port), 4242);
    ck_assert_uint_eq(ntohl(out.sin_addr.s_addr), 0x7f000001);
    ck_assert_int_eq(out.sin_family, AF_INET);

    ck_assert_int_eq(tcp_wire_addr_parse(b, sizeof(b) - 1, &out, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_TRUNCATED);
    ck_assert_int_eq(tcp_wire_addr_parse(NULL, 64, &out, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_TRUNCATED);
    b[0] = 'X';
    ck_assert_int_eq(tcp_wire_addr_parse(b, sizeof(b), &out, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_MAGIC);
    b[0] = 'M';
    b[4] = 2;
    ck_assert_int_eq(tcp_wire_addr_parse(b, sizeof(b), &out, &err), MR_ERR_PROTOCOL);
    ck_assert_int_eq(err.fault, TCP_WIRE_BAD_VERSION);
    ck_assert_int_eq(err.value, 2);
}
END_TEST

static Suite *tcp_wire_suite(void)
{
    Suite *s = suite_create("tcp-wire");
    TCase *tc = tcase_create("frame");
    tcase_add_test(tc, frame_data_header_decodes);
    tcase_add_test(tc, frame_control_header_decodes);
    tcase_add_test(tc, frame_truncated_needs_more);
    tcase_add_test(tc, frame_oversize_rejected);
    tcase_add_test(tc, frame_bad_fields_rejected);
    tcase_add_test(tc, frame_take_bounds);
    suite_add_tcase(s, tc);
    tc = tcase_create("auth");
    tcase_add_test(tc, auth_mac_known_answer);
    tcase_add_test(tc, auth_round_trip);
    tcase_add_test(tc, auth_wrong_mac_rejected);
    tcase_add_test(tc, auth_bad_header_rejected);
    tcase_add_test(tc, auth_bad_rank_rejected);
    tcase_add_test(tc, auth_from_higher_rank);
    tcase_add_test(tc, accept_round_trip_and_rejects);
    suite_add_tcase(s, tc);
    tc = tcase_create("addr");
    tcase_add_test(tc, addr_round_trip_and_rejects);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tcp_wire_suite());
    int failed;

    if (tcp_wire_init() != MR_OK) return EXIT_FAILURE;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
