/*
 * The model behind mailrail_moe alone (tools/moe/moe_model.h): tokens and
 * experts cut into pieces give the same bytes as whole, the Zipf routing
 * never repeats an expert and follows its skew, a router's trace is read or
 * refused with the file and the line, and the placement gives every rank
 * E / P experts, the most popular on the hot ranks.
 */
#include "moe_model.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(test_pieces_match_whole)
{
    enum { H = 7168, PIECE = 4088 };
    static uint8_t whole[H], part[H], out_whole[H], out_part[H];

    moe_token_bytes(7, 3, 11, 0, whole, H);
    moe_token_bytes(7, 3, 11, 0, part, PIECE);
    moe_token_bytes(7, 3, 11, PIECE, part + PIECE, H - PIECE);
    ck_assert_mem_eq(whole, part, H);
    /* Another token, rank or seed gives other bytes. */
    moe_token_bytes(7, 3, 12, 0, part, H);
    ck_assert(memcmp(whole, part, H) != 0);
    moe_token_bytes(7, 4, 11, 0, part, H);
    ck_assert(memcmp(whole, part, H) != 0);

    moe_expert_apply(5, 0, whole, out_whole, H);
    moe_expert_apply(5, 0, whole, out_part, PIECE);
    moe_expert_apply(5, PIECE, whole + PIECE, out_part + PIECE, H - PIECE);
    ck_assert_mem_eq(out_whole, out_part, H);
    /* Another expert transforms differently; in place is the same as apart. */
    moe_expert_apply(6, 0, whole, out_part, H);
    ck_assert(memcmp(out_whole, out_part, H) != 0);
    memcpy(part, whole, H);
    moe_expert_apply(5, 0, part, part, H);
    ck_assert_mem_eq(out_whole, part, H);

    uint8_t acc[4] = {250, 1, 2, 3}, in[4] = {10, 1, 2, 3};
    moe_accumulate(acc, in, 4);
    ck_assert_uint_eq(acc[0], 4);
    ck_assert_uint_eq(acc[3], 6);
}
END_TEST

START_TEST(test_zipf_distinct_and_skewed)
{
    moe_routing_t uni, skew;
    enum { T = 5000, K = 8, E = 64 };
    unsigned long c_uni[E] = {0}, c_skew[E] = {0};

    ck_assert(moe_routing_zipf(&uni, T, K, E, 0.0, 1));
    ck_assert(moe_routing_zipf(&skew, T, K, E, 1.4, 1));
    for (unsigned t = 0; t < T; t++) {
        for (unsigned j = 0; j < K; j++) {
            ck_assert_uint_lt(uni.route[t * K + j], E);
            ck_assert_uint_lt(skew.route[t * K + j], E);
            c_uni[uni.route[t * K + j]]++;
            c_skew[skew.route[t * K + j]]++;
            for (unsigned i = 0; i < j; i++) {
                ck_assert_uint_ne(uni.route[t * K + i], uni.route[t * K + j]);
                ck_assert_uint_ne(skew.route[t * K + i], skew.route[t * K + j]);
            }
        }
    }
    /* Uniform: every expert near T K / E = 625. Skewed: expert 0 in most tokens. */
    for (unsigned e = 0; e < E; e++) {
        ck_assert_uint_gt(c_uni[e], 530);
        ck_assert_uint_lt(c_uni[e], 720);
    }
    ck_assert_uint_gt(c_skew[0], T * 9 / 10);
    ck_assert_uint_gt(c_skew[1], c_skew[10]);
    ck_assert_uint_gt(c_skew[10], c_skew[60]);
    /* The same seed draws the same routing. */
    moe_routing_t again;
    ck_assert(moe_routing_zipf(&again, T, K, E, 1.4, 1));
    ck_assert_mem_eq(again.route, skew.route, sizeof(uint16_t) * T * K);
    moe_routing_free(&uni);
    moe_routing_free(&skew);
    moe_routing_free(&again);
}
END_TEST

/* Writes `text` to a temporary file; returns its path (static). */
static const char *moe_file(const char *text)
{
    static char path[64];
    strcpy(path, "/tmp/test_moe_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    return path;
}

START_TEST(test_read_routing)
{
    moe_routing_t r;
    char why[512];
    const char *path = moe_file("# trace\n3 1\n\n 0,2 \n");

    ck_assert(moe_routing_read(&r, path, 0, 4, why, sizeof(why)));
    ck_assert_uint_eq(r.tokens, 2);
    ck_assert_uint_eq(r.k, 2);
    ck_assert_uint_eq(r.route[0], 3);
    ck_assert_uint_eq(r.route[1], 1);
    ck_assert_uint_eq(r.route[2], 0);
    ck_assert_uint_eq(r.route[3], 2);
    unsigned order[4];
    moe_popularity(&r, order); /* Each chosen once: ties by id. */
    ck_assert_uint_eq(order[0], 0);
    ck_assert_uint_eq(order[3], 3);
    moe_routing_free(&r);
    unlink(path);

    static const struct { const char *text; unsigned k; const char *why; } bad[] = {
        {"0 1\n1 1\n", 0, ":2: expert 1 appears twice"},
        {"0 1\n1 4\n", 0, ":2: expert 4 is out of range"},
        {"0 1\n1 2 3\n", 0, ":2: 3 experts, expected 2"},
        {"0 1\n", 3, ":1: 2 experts, expected 3"},
        {"0 -1\n", 0, ":1: '-1' is not an expert id"},
        {"0 1x\n", 0, ":1: '1x' is not an expert id"},
        {"# nothing\n\n", 0, ": no routing line"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        path = moe_file(bad[i].text);
        ck_assert_msg(!moe_routing_read(&r, path, bad[i].k, 4, why, sizeof(why)), "%s", bad[i].text);
        ck_assert_msg(strstr(why, bad[i].why) != NULL, "'%s' lacks '%s'", why, bad[i].why);
        ck_assert(strncmp(why, path, strlen(path)) == 0);
        ck_assert_ptr_null(r.route);
        unlink(path);
    }
    ck_assert(!moe_routing_read(&r, "/nonexistent/trace", 0, 4, why, sizeof(why)));
}
END_TEST

START_TEST(test_place)
{
    enum { E = 24, P = 6 };
    unsigned order[E];
    int owner[E], count[P], hot[2] = {4, 5};

    for (unsigned e = 0; e < E; e++) order[e] = (e * 7) % E; /* Expert 0, then 7, 14, ... */
    for (int hotness = 0; hotness < 2; hotness++) {
        memset(count, 0, sizeof(count));
        moe_place(E, P, order, hotness, hot, 2, owner);
        for (unsigned e = 0; e < E; e++) count[owner[e]]++;
        for (int p = 0; p < P; p++) ck_assert_int_eq(count[p], E / P);
    }
    /* Hot: the 8 most popular on ranks 4 and 5, alternating. */
    for (unsigned q = 0; q < 8; q++) ck_assert_int_eq(owner[order[q]], hot[q % 2]);
    for (unsigned q = 8; q < E; q++) ck_assert_int_lt(owner[order[q]], 4);
    /* Spread: round robin in popularity order. */
    moe_place(E, P, order, false, hot, 2, owner);
    for (unsigned q = 0; q < E; q++) ck_assert_int_eq(owner[order[q]], (int)(q % P));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_pieces_match_whole);
    tcase_add_test(tc, test_zipf_distinct_and_skewed);
    tcase_add_test(tc, test_read_routing);
    tcase_add_test(tc, test_place);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
