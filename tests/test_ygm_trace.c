/*
 * Unit tests of the YGM trace reader and writer: both layouts round-trip,
 * the layout is detected, and every malformed input is refused with the
 * file name and the offset, never read past. Traces as YGM's tracer writes
 * them with YGM_MPI_TRACE=1 (older layout, send completions as second type-1
 * records naming a request id) are read, and only those records are let through;
 * so are the real traces of tests/ygm/, record by record.
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
            continue; /* Its request id 2 would be a rank there; see the YGM tests below. */
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

/* ---- Traces as YGM writes them -------------------------------------------------------- */

/*
 * Writes, byte by byte as cereal does (not with ygm_trace_write()), one rank's
 * trace in the older layout the way YGM's tracer of pull request 268 writes
 * it: message ids from YGM's int counter, which steps by the number of ranks;
 * an MPI send takes a request id and then its own id; a completed send is a
 * second type-1 record {fresh id, request id, buffer size}, except those YGM
 * does not log; sends complete in the order they were posted.
 */
typedef struct ygm_writer {
    FILE *f;
    char *buf;
    size_t len;
    int nranks;
    uint32_t id;                          /* YGM's counter: an int, so it wraps. */
    size_t counts[6];                     /* Records written, per ygm_kind_t. */
    size_t starts[256], nstarts;          /* Offset of every record... */
    bool open_before[256];                /* ...and whether a barrier is open there. */
    size_t completion_at[64];             /* Offsets of the completion records... */
    int32_t completion_req[64];           /* ...and the request ids they name. */
    size_t ncompletions;
    int32_t pending_req[16];              /* Sends in flight, oldest first. */
    uint32_t pending_size[16];
    int npending;
    bool open_barrier;
} ygm_writer_t;

static void w_le(ygm_writer_t *w, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) fputc((int)((v >> (8 * i)) & 0xff), w->f);
}

static uint64_t w_next_id(ygm_writer_t *w)
{
    w->id += (uint32_t)w->nranks;
    return (uint64_t)(int64_t)(int32_t)w->id; /* int to uint64_t, as in YGM. */
}

static void w_record(ygm_writer_t *w, int32_t type, ygm_kind_t kind)
{
    fflush(w->f);
    ck_assert_uint_lt(w->nstarts, 256);
    w->open_before[w->nstarts] = w->open_barrier;
    w->starts[w->nstarts++] = w->len;
    w->counts[kind]++;
    w_le(w, (uint32_t)type, 4);
}

static void w_init(ygm_writer_t *w, int nranks, uint32_t first_id)
{
    memset(w, 0, sizeof(*w));
    w->f = open_memstream(&w->buf, &w->len);
    ck_assert_ptr_nonnull(w->f);
    w->nranks = nranks;
    w->id = first_id - (uint32_t)nranks;
}

static void w_async(ygm_writer_t *w, int32_t to, uint32_t size)
{
    w_record(w, 0, YGM_ASYNC);
    w_le(w, w_next_id(w), 8);
    w_le(w, (uint32_t)to, 4);
    w_le(w, size, 4);
}

static void w_send(ygm_writer_t *w, int32_t to, uint32_t size)
{
    int32_t request = (int32_t)w_next_id(w);
    w_record(w, 1, YGM_MPI_SEND);
    w_le(w, w_next_id(w), 8);
    w_le(w, (uint32_t)to, 4);
    w_le(w, size, 4);
    w->pending_req[w->npending] = request;
    w->pending_size[w->npending++] = size;
}

/* The oldest send in flight completes; YGM logs it or not. */
static void w_complete(ygm_writer_t *w, bool logged)
{
    ck_assert_int_gt(w->npending, 0);
    if (logged) {
        w_record(w, 1, YGM_MPI_SEND_COMPLETE);
        w->completion_at[w->ncompletions] = w->starts[w->nstarts - 1];
        w->completion_req[w->ncompletions++] = w->pending_req[0];
        w_le(w, w_next_id(w), 8);
        w_le(w, (uint32_t)w->pending_req[0], 4);
        w_le(w, w->pending_size[0], 4);
    }
    w->npending--;
    memmove(w->pending_req, w->pending_req + 1, (size_t)w->npending * sizeof(int32_t));
    memmove(w->pending_size, w->pending_size + 1, (size_t)w->npending * sizeof(uint32_t));
}

static void w_recv(ygm_writer_t *w, int32_t from, uint32_t size)
{
    w_record(w, 2, YGM_MPI_RECV);
    w_le(w, w_next_id(w), 8);
    w_le(w, (uint32_t)from, 4);
    w_le(w, size, 4);
}

static void w_barrier(ygm_writer_t *w, bool begin)
{
    w_record(w, begin ? 3 : 4, begin ? YGM_BARRIER_BEGIN : YGM_BARRIER_END);
    w_le(w, w_next_id(w), 8);
    for (int k = 0; k < 5; k++) w_le(w, (uint64_t)k * 7, 8);
    w->open_barrier = begin;
}

/* The offset of the last record written. */
static size_t w_last(const ygm_writer_t *w)
{
    return w->starts[w->nstarts - 1];
}

static void w_finish(ygm_writer_t *w)
{
    fclose(w->f);
}

/* Two epochs of one rank's traffic, as YGM logs it with YGM_MPI_TRACE=1. */
static void write_ygm_trace(ygm_writer_t *w, int nranks, uint32_t first_id)
{
    w_init(w, nranks, first_id);
    for (int e = 0; e < 2; e++) {
        for (int i = 0; i < 3; i++) w_async(w, i % nranks, 10 + (uint32_t)i);
        w_send(w, 1 % nranks, 4096);
        w_async(w, nranks - 1, 700);
        w_send(w, 0, 8192);
        w_recv(w, nranks - 1, 512);
        w_send(w, 1 % nranks, 4096);
        w_complete(w, true);
        w_complete(w, false); /* Found by MPI_Testsome: not logged. */
        w_async(w, 0, 1);
        w_send(w, 0, 100);
        w_complete(w, true);
        w_barrier(w, true);
        w_async(w, nranks - 1, 33); /* Sent by a handler inside the barrier. */
        w_complete(w, true);
        w_barrier(w, false);
    }
    w_async(w, 0, 5); /* After the last barrier. */
    w_finish(w);
}

/* nranks and the counter's first id: YGM's counters start at 0 or at the rank
 * (first id n, or the rank), and an int counter wraps to negative request ids. */
/* Parses `w`'s trace, which must be accepted. */
static void parse_ok(const ygm_writer_t *w, ygm_layout_t layout, int nranks, ygm_trace_t *t)
{
    char err[1024] = "";

    ck_assert_msg(ygm_trace_parse((uint8_t *)w->buf, w->len, layout, nranks, "trace_0.bin", t,
                                  err, sizeof(err)) == 0, "%s", err);
}

static const struct {
    int nranks;
    uint32_t first_id;
} ygm_variants[] = {
    {2, 2},                        /* Like the report: 2 ranks, ids 2, 4, ... */
    {4, 3},                        /* Rank 3 of 4, ids 3, 7, 11, ... */
    {3, 0x7fffffffu - 3 * 10 + 1}, /* Wraps past INT_MAX in the first epoch. */
    {1, 5},                        /* One rank: every id is a multiple of 1. */
};

START_TEST(ygm_completions_read)
{
    ygm_writer_t w;
    ygm_trace_t t;
    char err[1024] = "";

    write_ygm_trace(&w, ygm_variants[_i].nranks, ygm_variants[_i].first_id);
    ck_assert_uint_eq(w.counts[YGM_MPI_SEND_COMPLETE], 6);
    if (ygm_variants[_i].first_id > 0x7fff0000u) {
        ck_assert_int_lt(w.completion_req[w.ncompletions - 1], 0); /* The counter wrapped. */
    }
    parse_ok(&w, YGM_LAYOUT_AUTO, w.nranks, &t);
    ck_assert_int_eq(t.layout, YGM_LAYOUT_OLD);
    ck_assert_uint_eq(t.count, w.nstarts);
    size_t counts[6] = {0}, c = 0;
    for (size_t i = 0; i < t.count; i++) {
        const ygm_record_t *r = &t.records[i];
        counts[r->kind]++;
        if (r->kind == YGM_MPI_SEND_COMPLETE) {
            /* Never a send to a rank: the request id is kept as start_id. */
            ck_assert_int_eq(r->peer, -1);
            ck_assert_uint_eq(w.starts[i], w.completion_at[c]);
            ck_assert_uint_eq(r->start_id, (uint64_t)(int64_t)w.completion_req[c]);
            c++;
        } else if (r->kind != YGM_BARRIER_BEGIN && r->kind != YGM_BARRIER_END) {
            ck_assert_int_ge(r->peer, 0);
            ck_assert_int_lt(r->peer, w.nranks);
        }
    }
    for (int k = 0; k < 6; k++) ck_assert_uint_eq(counts[k], w.counts[k]);
    ck_assert_uint_eq(counts[YGM_ASYNC], 13);
    ck_assert_uint_eq(counts[YGM_MPI_SEND], 8);
    ck_assert_uint_eq(counts[YGM_MPI_RECV], 2);
    ck_assert_uint_eq(counts[YGM_BARRIER_BEGIN], 2);
    ck_assert_uint_eq(counts[YGM_BARRIER_END], 2);
    /* Written back in the older layout: the very same bytes. */
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    for (size_t i = 0; i < t.count; i++) ck_assert_int_eq(ygm_trace_write(f, t.layout, &t.records[i]), 0);
    fclose(f);
    ck_assert_uint_eq(out_len, w.len);
    ck_assert_int_eq(memcmp(out, w.buf, w.len), 0);
    free(out);
    ygm_trace_free(&t);
    /* Forced, the older layout reads it too; the newer one refuses it. */
    parse_ok(&w, YGM_LAYOUT_OLD, w.nranks, &t);
    ygm_trace_free(&t);
    ck_assert_int_eq(ygm_trace_parse((uint8_t *)w.buf, w.len, YGM_LAYOUT_NEW, w.nranks,
                                     "trace_0.bin", &t, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "trace_0.bin: "));
    ck_assert_ptr_nonnull(strstr(err, "offset"));
    free(w.buf);
}
END_TEST

/* Traces with YGM_COMM_TRACE=1 alone (asyncs and barriers) read exactly as before. */
START_TEST(ygm_comm_trace_only)
{
    ygm_writer_t w;
    ygm_trace_t t;

    w_init(&w, 3, 3);
    for (int e = 0; e < 3; e++) {
        for (int i = 0; i < 5; i++) w_async(&w, (e + i) % 3, 100u * (uint32_t)i);
        w_barrier(&w, true);
        if (e == 1) w_async(&w, 2, 9);
        w_barrier(&w, false);
    }
    w_finish(&w);
    for (int layout = YGM_LAYOUT_AUTO; layout <= YGM_LAYOUT_OLD; layout++) {
        parse_ok(&w, (ygm_layout_t)layout, 3, &t);
        ck_assert_int_eq(t.layout, YGM_LAYOUT_OLD);
        ck_assert_uint_eq(t.count, 22);
        size_t asyncs = 0;
        uint64_t bytes = 0;
        for (size_t i = 0; i < t.count; i++) {
            if (t.records[i].kind != YGM_ASYNC) continue;
            asyncs++;
            bytes += t.records[i].size;
            ck_assert_uint_eq(t.records[i].event_id, 3 + 3 * (uint64_t)i);
        }
        ck_assert_uint_eq(asyncs, 16);
        ck_assert_uint_eq(bytes, 3 * 1000 + 9);
        ygm_trace_free(&t);
    }
    free(w.buf);
}
END_TEST

/*
 * Finishes the trace in `w` and asserts that it is refused at its last record,
 * a rank check that names the record and says `why`.
 */
static void expect_refused(ygm_writer_t *w, ygm_layout_t layout, int nranks, const char *why)
{
    size_t at = w_last(w);
    ygm_trace_t t;
    char err[1024] = "", where[64];

    w_finish(w);
    ck_assert_int_eq(ygm_trace_parse((uint8_t *)w->buf, w->len, layout, nranks, "bad.bin", &t,
                                     err, sizeof(err)), -1);
    snprintf(where, sizeof(where), "bad.bin: record at offset %zu names rank ", at);
    ck_assert_msg(strstr(err, where) != NULL, "'%s' lacks '%s'", err, where);
    ck_assert_msg(strstr(err, why) != NULL, "'%s' lacks '%s'", err, why);
    free(w->buf);
}

/* Only type-1 records that can be YGM's completions get past the rank check. */
START_TEST(ygm_completion_rule_is_strict)
{
    ygm_writer_t w;

    /* Out-of-range ranks in other kinds: refused, whatever came before. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w_async(&w, 200004, 64);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "names rank 200004, outside 0..1");
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w_recv(&w, 200004, 64);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "names rank 200004, outside 0..1");
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w_async(&w, -1, 64);
    expect_refused(&w, YGM_LAYOUT_AUTO, 2, "names rank -1");

    /* A type-1 record out of range with no send before it. */
    w_init(&w, 2, 2);
    w_async(&w, 1, 8);
    w.pending_req[0] = 200004, w.pending_size[0] = 64, w.npending = 1; /* A send never logged. */
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "no earlier MPI send awaits completion");

    /* Two completions of one send. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w_complete(&w, true);
    w.pending_req[0] = w.completion_req[0], w.pending_size[0] = 64, w.npending = 1;
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "no earlier MPI send awaits completion");

    /* No send of that size is waiting. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w.pending_size[0] = 65;
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "no earlier MPI send of that size awaits completion");

    /* Sends complete in order: once a later send completed, an earlier one cannot. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 100);
    w_send(&w, 1, 200);
    w_send(&w, 1, 300);
    w_complete(&w, false);
    w_complete(&w, true); /* Completes the 200-byte send, so the 100-byte one is done. */
    w.pending_req[0] = 2, w.pending_size[0] = 100; /* The 100-byte send again. */
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "no earlier MPI send of that size");

    /* A request id that YGM's counter cannot have produced on this rank. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w.pending_req[0] = 200005; /* Odd; every id of this counter is even. */
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 2, "not from one YGM id counter");

    /* Without the number of ranks, a completion cannot be told from a bad send. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w.pending_req[0] = -4;
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_OLD, 0, "the number of ranks is not known");

    /* The newer layout has its own completion type: type 1 out of range is refused. */
    w_init(&w, 2, 2);
    w_send(&w, 1, 64);
    w_complete(&w, true);
    expect_refused(&w, YGM_LAYOUT_NEW, 2, "names rank 2, outside 0..1");
}
END_TEST

/* A request id inside 0..n-1 is a send to that rank: nothing else changes. */
START_TEST(ygm_in_range_type1_is_a_send)
{
    ygm_writer_t w;
    ygm_trace_t t;

    w_init(&w, 4, 1);
    w_send(&w, 3, 64); /* Request id 1: a rank. */
    w_complete(&w, true);
    w_finish(&w);
    parse_ok(&w, YGM_LAYOUT_AUTO, 4, &t);
    ck_assert_uint_eq(t.count, 2);
    ck_assert_int_eq(t.records[1].kind, YGM_MPI_SEND);
    ck_assert_int_eq(t.records[1].peer, 1);
    ygm_trace_free(&t);
    free(w.buf);
}
END_TEST

/*
 * Every cut of a YGM trace that is not at a record boundary is refused in the
 * older layout, as truncated, with the offset. (Detection may take a prefix
 * for the newer layout, whose records have other sizes; it too must name the
 * file and an offset when it refuses.)
 */
START_TEST(ygm_truncation_everywhere)
{
    ygm_writer_t w;

    write_ygm_trace(&w, 2, 2);
    for (size_t cut = 0; cut < w.len; cut++) {
        bool boundary = false, closed = false;
        for (size_t k = 0; k < w.nstarts; k++) {
            if (w.starts[k] == cut) boundary = true, closed = !w.open_before[k];
        }
        for (int layout = YGM_LAYOUT_AUTO; layout <= YGM_LAYOUT_OLD; layout++) {
            ygm_trace_t t;
            char err[1024] = "";
            /* A copy of exactly `cut` bytes, so that a read past it is caught by ASan. */
            uint8_t *copy = malloc(cut ? cut : 1);
            memcpy(copy, w.buf, cut);
            int rc = ygm_trace_parse(copy, cut, (ygm_layout_t)layout, 2, "cut.bin", &t, err,
                                     sizeof(err));
            free(copy);
            if (layout == YGM_LAYOUT_OLD) {
                /* Exactly the whole-record prefixes outside a barrier parse. */
                ck_assert_msg((rc == 0) == (boundary && closed), "cut at %zu: %d %s", cut, rc, err);
            }
            if (rc == 0) {
                ygm_trace_free(&t);
            } else {
                ck_assert_ptr_nonnull(strstr(err, "cut.bin"));
                ck_assert_ptr_nonnull(strstr(err, "offset"));
                if (!boundary && layout == YGM_LAYOUT_OLD) {
                    ck_assert_msg(strstr(err, "truncated") != NULL, "cut at %zu: %s", cut, err);
                }
            }
        }
    }
    free(w.buf);
}
END_TEST

/* The writer puts a completion in the older layout only if its request id fits. */
START_TEST(ygm_write_old_completion)
{
    ygm_record_t c = {.kind = YGM_MPI_SEND_COMPLETE, .event_id = 9, .peer = -1,
                      .start_id = (uint64_t)1 << 40, .size = 4};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    ck_assert_int_eq(ygm_trace_write(f, YGM_LAYOUT_OLD, &c), -1);
    c.start_id = (uint64_t)-6; /* A wrapped counter: request id -6. */
    ck_assert_int_eq(ygm_trace_write(f, YGM_LAYOUT_OLD, &c), 0);
    fclose(f);
    static const uint8_t want[20] = {1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0,
                                     0xfa, 0xff, 0xff, 0xff, 4, 0, 0, 0};
    ck_assert_uint_eq(len, 20);
    ck_assert_int_eq(memcmp(buf, want, 20), 0);
    free(buf);
}
END_TEST

/*
 * Traces recorded by YGM's own tracer (tests/ygm/README.md): 2 ranks of
 * ygm_traffic.cpp, communication records only (n2_comm) and with YGM's MPI
 * records too (n2_both). What YGM reported when it ran: 335,736 async events
 * (GLOBAL_ASYNC_COUNT) and 11 barriers. The MPI records must match across the
 * ranks: what one sent, the other received.
 */
typedef struct ygm_counts {
    size_t kind[6];
    uint64_t async_bytes;
} ygm_counts_t;

static ygm_counts_t real_trace(const char *dir, const char *set, int rank)
{
    char path[512], err[256];
    ygm_trace_t t;
    ygm_counts_t c = {0};

    snprintf(path, sizeof(path), "%s/traces/%s/trace_%d.bin", dir, set, rank);
    ck_assert_msg(ygm_trace_read(path, YGM_LAYOUT_AUTO, 2, &t, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(t.layout, YGM_LAYOUT_OLD); /* The tracer of YGM pull request 268. */
    for (size_t i = 0; i < t.count; i++) {
        const ygm_record_t *r = &t.records[i];
        c.kind[r->kind]++;
        if (r->kind == YGM_ASYNC) {
            ck_assert_int_ge(r->peer, 0);
            ck_assert_int_le(r->peer, 1);
            c.async_bytes += r->size;
        }
    }
    ygm_trace_free(&t);
    return c;
}

START_TEST(real_ygm_traces)
{
    const char *tarball = getenv("MR_TEST_YGM_TARBALL");
    char dir[] = "/tmp/mailrail-ygm-XXXXXX", cmd[1024];

    ck_assert_msg(tarball != NULL, "MR_TEST_YGM_TARBALL names tests/ygm/ygm-pr268-n2.tar.xz");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd), "tar -xJf '%s' -C '%s'", tarball, dir);
    ck_assert_msg(system(cmd) == 0, "%s failed (is xz-utils installed?)", cmd);
    for (int both = 0; both < 2; both++) {
        const char *set = both ? "n2_both" : "n2_comm";
        ygm_counts_t r0 = real_trace(dir, set, 0), r1 = real_trace(dir, set, 1);
        ck_assert_uint_eq(r0.kind[YGM_ASYNC] + r1.kind[YGM_ASYNC], 335736);
        ck_assert_uint_eq(r0.kind[YGM_ASYNC], 167873);
        ck_assert_uint_eq(r0.async_bytes + r1.async_bytes, 9283514);
        for (int k = YGM_BARRIER_BEGIN; k <= YGM_BARRIER_END; k++) {
            ck_assert_uint_eq(r0.kind[k], 11);
            ck_assert_uint_eq(r1.kind[k], 11);
        }
        if (!both) {
            ck_assert_uint_eq(r0.kind[YGM_MPI_SEND] + r0.kind[YGM_MPI_RECV] +
                                  r0.kind[YGM_MPI_SEND_COMPLETE], 0);
            continue;
        }
        /* Every MPI send completed, and arrived at the other rank. */
        ck_assert_uint_gt(r0.kind[YGM_MPI_SEND], 0);
        ck_assert_uint_eq(r0.kind[YGM_MPI_SEND_COMPLETE], r0.kind[YGM_MPI_SEND]);
        ck_assert_uint_eq(r1.kind[YGM_MPI_SEND_COMPLETE], r1.kind[YGM_MPI_SEND]);
        ck_assert_uint_eq(r0.kind[YGM_MPI_SEND], r1.kind[YGM_MPI_RECV]);
        ck_assert_uint_eq(r1.kind[YGM_MPI_SEND], r0.kind[YGM_MPI_RECV]);
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
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
    tcase_add_loop_test(tc, ygm_completions_read, 0,
                        (int)(sizeof(ygm_variants) / sizeof(ygm_variants[0])));
    tcase_add_test(tc, ygm_comm_trace_only);
    tcase_add_test(tc, ygm_completion_rule_is_strict);
    tcase_add_test(tc, ygm_in_range_type1_is_a_send);
    tcase_add_test(tc, ygm_truncation_everywhere);
    tcase_add_test(tc, ygm_write_old_completion);
    suite_add_tcase(s, tc);
    /* 13 MB of real traces, parsed under both layouts: seconds under the sanitizers. */
    TCase *real = tcase_create("real");
    tcase_set_timeout(real, 100);
    tcase_add_test(real, real_ygm_traces);
    suite_add_tcase(s, real);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
