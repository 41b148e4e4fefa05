/*
 * Unit tests of the YGM trace reader and writer: both layouts round-trip,
 * the layout is detected, and every malformed input is refused with the
 * file name and the offset, never read past.
 */
#include "ygm_trace.h"

#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes a small trace in `layout` into memory; returns its bytes. */
static uint8_t *sample_trace(ygm_layout_t layout, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    ygm_record_t recs[] = {
        {.kind = YGM_ASYNC, .event_id = 1, .peer = 3, .size = 100},
        {.kind = YGM_MPI_SEND, .event_id = 2, .peer = 1, .size = 4096},
        {.kind = YGM_MPI_SEND_COMPLETE, .event_id = 3, .start_id = 2, .size = 4096},
        {.kind = YGM_MPI_RECV, .event_id = 4, .peer = 2, .size = 512},
        {.kind = YGM_BARRIER_BEGIN, .event_id = 5, .peer = -1, .counters = {1, 2, 3, 4, 5}},
        {.kind = YGM_BARRIER_END, .event_id = 6, .peer = -1, .counters = {6, 7, 8, 9, 10}},
        {.kind = YGM_ASYNC, .event_id = 7, .peer = 0, .size = 0},
    };
    ck_assert_ptr_nonnull(f);
    for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
        if (layout == YGM_LAYOUT_OLD && recs[i].kind == YGM_MPI_SEND_COMPLETE) {
            ck_assert_int_eq(ygm_trace_write(f, layout, &recs[i]), -1); /* Not in that layout. */
            continue;
        }
        ck_assert_int_eq(ygm_trace_write(f, layout, &recs[i]), 0);
    }
    fclose(f);
    return (uint8_t *)buf;
}

START_TEST(round_trip_and_detection)
{
    ygm_layout_t layout = _i == 0 ? YGM_LAYOUT_OLD : YGM_LAYOUT_NEW;
    size_t len;
    uint8_t *buf = sample_trace(layout, &len);
    ygm_trace_t t;
    char err[512] = "";

    /* 4-byte type + payload: 20, 20, (24), 20, 52, 52, 20. */
    ck_assert_uint_eq(len, layout == YGM_LAYOUT_OLD ? 184 : 208);
    ck_assert_msg(ygm_trace_parse(buf, len, YGM_LAYOUT_AUTO, 4, "t.bin", &t, err, sizeof(err)) == 0,
                  "%s", err);
    ck_assert_int_eq(t.layout, layout);
    ck_assert_uint_eq(t.count, layout == YGM_LAYOUT_OLD ? 6 : 7);
    ck_assert_int_eq(t.records[0].kind, YGM_ASYNC);
    ck_assert_uint_eq(t.records[0].event_id, 1);
    ck_assert_int_eq(t.records[0].peer, 3);
    ck_assert_uint_eq(t.records[0].size, 100);
    ck_assert_int_eq(t.records[1].kind, YGM_MPI_SEND);
    size_t b = layout == YGM_LAYOUT_OLD ? 3 : 4;
    if (layout == YGM_LAYOUT_NEW) {
        ck_assert_int_eq(t.records[2].kind, YGM_MPI_SEND_COMPLETE);
        ck_assert_uint_eq(t.records[2].start_id, 2);
    }
    ck_assert_int_eq(t.records[b - 1].kind, YGM_MPI_RECV);
    ck_assert_int_eq(t.records[b - 1].peer, 2);
    ck_assert_int_eq(t.records[b].kind, YGM_BARRIER_BEGIN);
    ck_assert_uint_eq(t.records[b].counters[4], 5);
    ck_assert_int_eq(t.records[b + 1].kind, YGM_BARRIER_END);
    ck_assert_uint_eq(t.records[b + 1].counters[0], 6);
    ck_assert_uint_eq(t.records[b + 2].size, 0);
    ygm_trace_free(&t);
    /* Forcing the other layout fails with a reason. */
    ck_assert_int_eq(ygm_trace_parse(buf, len, layout == YGM_LAYOUT_OLD ? YGM_LAYOUT_NEW
                                                                          : YGM_LAYOUT_OLD,
                                     4, "t.bin", &t, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "t.bin"));
    free(buf);
}
END_TEST

/* Every proper prefix that cuts a record is refused, naming the file and an offset. */
START_TEST(truncation_everywhere)
{
    size_t len;
    uint8_t *buf = sample_trace(YGM_LAYOUT_NEW, &len);
    static const size_t boundaries[] = {0, 20, 40, 64, 84, 136, 188, 208};

    for (size_t cut = 0; cut < len; cut++) {
        ygm_trace_t t;
        char err[512] = "";
        bool boundary = false;
        for (size_t k = 0; k < sizeof(boundaries) / sizeof(boundaries[0]); k++) {
            boundary |= boundaries[k] == cut;
        }
        /* A copy of exactly `cut` bytes, so that a read past it is caught by ASan. */
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, buf, cut);
        int rc = ygm_trace_parse(copy, cut, YGM_LAYOUT_NEW, 4, "cut.bin", &t, err, sizeof(err));
        free(copy);
        if (rc == 0) {
            /* Only whole records with paired barriers parse. */
            ck_assert_msg(boundary && cut != 136, "cut at %zu parsed", cut);
            ygm_trace_free(&t);
        } else {
            ck_assert_ptr_nonnull(strstr(err, "cut.bin"));
            ck_assert_ptr_nonnull(strstr(err, "offset"));
        }
    }
    free(buf);
}
END_TEST

START_TEST(corrupt_fields)
{
    uint8_t rec[20] = {0};
    ygm_trace_t t;
    char err[512];

    rec[0] = 9; /* No such type in either layout. */
    ck_assert_int_eq(ygm_trace_parse(rec, 20, YGM_LAYOUT_AUTO, 4, "x.bin", &t, err, sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "unknown record type 9 at offset 0"));
    memset(rec, 0, sizeof(rec));
    rec[12] = 4; /* async to rank 4 of 4. */
    ck_assert_int_eq(ygm_trace_parse(rec, 20, YGM_LAYOUT_OLD, 4, "x.bin", &t, err, sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "rank 4"));
    rec[12] = 0xff, rec[13] = 0xff, rec[14] = 0xff, rec[15] = 0xff; /* Rank -1. */
    ck_assert_int_eq(ygm_trace_parse(rec, 20, YGM_LAYOUT_OLD, 4, "x.bin", &t, err, sizeof(err)),
                     -1);
    /* A barrier end without a begin. */
    uint8_t end[52] = {4};
    ck_assert_int_eq(ygm_trace_parse(end, 52, YGM_LAYOUT_OLD, 4, "x.bin", &t, err, sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "unpaired barrier"));
    /* An empty trace is valid and empty. */
    ck_assert_int_eq(ygm_trace_parse(rec, 0, YGM_LAYOUT_AUTO, 4, "x.bin", &t, err, sizeof(err)),
                     0);
    ck_assert_uint_eq(t.count, 0);
    ygm_trace_free(&t);
    ck_assert_int_eq(ygm_trace_read("/nonexistent/trace_0.bin", YGM_LAYOUT_AUTO, 4, &t, err,
                                    sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/trace_0.bin"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ygm_trace");
    TCase *tc = tcase_create("reader");
    SRunner *sr;
    int failed;

    tcase_add_loop_test(tc, round_trip_and_detection, 0, 2);
    tcase_add_test(tc, truncation_everywhere);
    tcase_add_test(tc, corrupt_fields);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
