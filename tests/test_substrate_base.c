/*
 * Unit tests of what the substrate plugins share (substrates/common): the
 * open() preamble, the destination check, the closing and stats operations,
 * the done queue and its drain, random bytes, and coalescing small messages
 * (mr_batch.h). Single process.
 */
#include "mr_batch.h"
#include "mr_random.h"
#include "mr_substrate_base.h"
#include "upcalls_idle.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

/* A plugin's state as the base expects it: the base first. */
struct mr_substrate {
    mr__substrate_base_t base;
    mr__done_queue_t done;
    mr__sreq_t *free_list;
    int extra;
};
MR__BASE_CHECK();

/* What the upcalls saw. */
static struct {
    void *cookies[16];
    int ncookies;
    mr_substrate_t *s;
    mr__sreq_t *resend;        /* Expected from the free list inside the first send_complete(). */
} seen;

static void up_control(void *core, int source, uint32_t imm)
{
    (void)core, (void)source, (void)imm;
}
static void up_failed(void *core, int rank, mr_status_t why) { (void)core, (void)rank, (void)why; }

static void up_complete(void *core, void *cookie)
{
    ck_assert_ptr_eq(core, &seen);
    seen.cookies[seen.ncookies++] = cookie;
    if (seen.resend != NULL) {
        /*
         * A send made by this upcall completes at once: it waits for the next
         * drain. Its request is the one just completed, already freed.
         */
        mr__sreq_t *r = mr__sreq_pop(&seen.s->free_list);
        ck_assert_ptr_eq(r, seen.resend);
        r->cookie = (void *)(uintptr_t)99;
        mr__done_push(&seen.s->done, r);
        seen.resend = NULL;
    }
}

static const mr_substrate_upcalls_t upcalls = {
    .recv_slot_acquire = idle_slot_acquire, .recv_slot_abandon = idle_slot_abandon,
    .deliver = idle_deliver, .deliver_copy = idle_deliver_copy,
    .deliver_handler_now = idle_handler_now, .deliver_now_frames = idle_now_frames,
    .send_complete = up_complete, .control = up_control,
    .peer_failed = up_failed};

static const uint8_t key[MR_JOB_KEY_LEN];

static mr_substrate_params_t good_params(void)
{
    mr_substrate_params_t p = {.rank = 1, .size = 4, .datagram_size = 4096, .max_sends = 8,
                               .recv_slots = 16, .job_key = key, .timeout_s = 7,
                               .core = &seen, .upcalls = &upcalls};
    return p;
}

START_TEST(alloc_fills_the_base)
{
    mr_substrate_params_t p = good_params();
    mr_substrate_t *s = NULL;

    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, &s), MR_OK);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(s->base.rank, 1);
    ck_assert_int_eq(s->base.size, 4);
    ck_assert_uint_eq(s->base.datagram_size, 4096);
    ck_assert_uint_eq(s->base.max_sends, 8);
    ck_assert_uint_eq(s->base.timeout_s, 7);
    ck_assert_ptr_eq(s->base.core, &seen);
    ck_assert_ptr_eq(s->base.up.send_complete, up_complete);
    /* No threshold given: warnings and errors are logged, information is not. */
    ck_assert(mr__log_enabled(&s->base, MR_LOG_WARN));
    ck_assert(!mr__log_enabled(&s->base, MR_LOG_INFO));
    ck_assert(!s->base.closing);
    ck_assert_int_eq(s->extra, 0);
    free(s);
}
END_TEST

START_TEST(alloc_refuses_bad_params)
{
    mr_substrate_params_t p = good_params();
    mr_substrate_t *s = NULL;

    ck_assert_int_eq(mr__substrate_alloc(NULL, sizeof(*s), "test", 65536, true, &s),
                     MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, NULL),
                     MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 4095, true, &s),
                     MR_ERR_INVALID_PARAM);
    p.job_key = NULL;
    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, &s),
                     MR_ERR_INVALID_PARAM);
    /* Only substrates that need the key refuse its absence. */
    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, false, &s), MR_OK);
    free(s);
    s = NULL;
    p = good_params();
    p.rank = 4;
    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, &s),
                     MR_ERR_INVALID_PARAM);
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(send_target_closing_stats)
{
    mr_substrate_params_t p = good_params();
    mr_substrate_t *s = NULL;
    mr_stats_t stats;

    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, &s), MR_OK);
    ck_assert_int_eq(mr__send_target_check(NULL, 0), MR_ERR_INVALID_PARAM);
    ck_assert_int_eq(mr__send_target_check(s, -1), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr__send_target_check(s, 4), MR_ERR_INVALID_RANK);
    ck_assert_int_eq(mr__send_target_check(s, 1), MR_ERR_INVALID_RANK); /* Itself. */
    ck_assert_int_eq(mr__send_target_check(s, 0), MR_OK);
    ck_assert_int_eq(mr__send_target_check(s, 3), MR_OK);

    mr__substrate_closing(NULL);
    mr__substrate_closing(s);
    ck_assert(s->base.closing);

    memset(&stats, 0, sizeof(stats));
    stats.size = sizeof(stats);
    stats.connections_rejected = 5;
    s->base.rejected = 3;
    mr__substrate_stats(s, &stats);
    ck_assert_uint_eq(stats.connections_rejected, 8);
    /* A caller's older, shorter struct is left alone. */
    stats.size = offsetof(mr_stats_t, connections_rejected);
    mr__substrate_stats(s, &stats);
    ck_assert_uint_eq(stats.connections_rejected, 8);
    mr__substrate_stats(s, NULL);
    free(s);
}
END_TEST

START_TEST(done_queue_in_order_and_detached)
{
    mr_substrate_params_t p = good_params();
    mr_substrate_t *s = NULL;
    mr__sreq_t reqs[4];

    ck_assert_int_eq(mr__substrate_alloc(&p, sizeof(*s), "test", 65536, true, &s), MR_OK);
    memset(&seen, 0, sizeof(seen));
    seen.s = s;
    for (int i = 3; i >= 0; i--) mr__sreq_push(&s->free_list, &reqs[i]);
    ck_assert(mr__done_empty(&s->done));
    for (int i = 0; i < 3; i++) {
        mr__sreq_t *r = mr__sreq_pop(&s->free_list);
        ck_assert_ptr_eq(r, &reqs[i]);
        r->cookie = (void *)(uintptr_t)(i + 1);
        mr__done_push(&s->done, r);
    }
    ck_assert(!mr__done_empty(&s->done));

    /* The first completion sends again. */
    seen.resend = &reqs[0];
    ck_assert_int_eq(mr__done_drain(s, &s->done, &s->free_list), 3);
    ck_assert_int_eq(seen.ncookies, 3);
    for (int i = 0; i < 3; i++) ck_assert_ptr_eq(seen.cookies[i], (void *)(uintptr_t)(i + 1));
    /* Its completion waits for the next drain; every request is free, cookie cleared. */
    ck_assert(!mr__done_empty(&s->done));
    ck_assert_int_eq(mr__done_drain(s, &s->done, &s->free_list), 1);
    ck_assert_ptr_eq(seen.cookies[3], (void *)(uintptr_t)99);
    ck_assert(mr__done_empty(&s->done));
    ck_assert_int_eq(mr__done_drain(s, &s->done, &s->free_list), 0);
    int nfree = 0;
    for (mr__sreq_t *r = s->free_list; r != NULL; r = r->next) {
        ck_assert_ptr_null(r->cookie);
        nfree++;
    }
    ck_assert_int_eq(nfree, 4);
    free(s);
}
END_TEST

START_TEST(random_bytes)
{
    uint8_t a[64], b[64], zero[64] = {0};

    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    ck_assert(mr__random_bytes(a, sizeof(a)));
    ck_assert(mr__random_bytes(b, sizeof(b)));
    /* 512 random bits are neither all zero nor twice the same. */
    ck_assert_mem_ne(a, zero, sizeof(a));
    ck_assert_mem_ne(a, b, sizeof(a));
    ck_assert(mr__random_bytes(a, 0));
}
END_TEST

/* Coalescing (mr_batch.h): who leaves alone, who is packed, and when a batch is full. */
START_TEST(batcher_packs_after_the_first_message)
{
    mr__batcher_t b;
    uint8_t payload[32];
    mr__batch_t *batch;

    for (int i = 0; i < 32; i++) payload[i] = (uint8_t)(i + 1);
    /* 2 batches of 64 bytes; messages of at most 16 bytes are packed. */
    ck_assert_int_eq(mr__batcher_init(&b, 3, 2, 64, 16), MR_OK);
    ck_assert_uint_eq(b.max_frame, 16);
    /* The first message to each rank since the last progress call leaves alone. */
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8), MR__BATCH_ALONE);
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8), MR__BATCH_ADDED);
    ck_assert_int_eq(mr__batcher_add(&b, 2, MR_KIND_DATA, payload, 8), MR__BATCH_ALONE);
    ck_assert_int_eq(mr__batcher_add(&b, 2, MR_KIND_ITEMS, payload, 0),
                     MR__BATCH_ADDED);
    /* Both batches are taken: rank 0's second message leaves alone too. */
    ck_assert_int_eq(mr__batcher_add(&b, 0, MR_KIND_DATA, payload, 8), MR__BATCH_ALONE);
    ck_assert_int_eq(mr__batcher_add(&b, 0, MR_KIND_DATA, payload, 8), MR__BATCH_ALONE);
    /* Too long to pack. */
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 17),
                     MR__BATCH_ALONE);
    ck_assert_uint_eq(b.nopen, 2);
    /* A batch holds one kind: data to rank 2, whose batch holds items, must send it first. */
    ck_assert_int_eq(mr__batcher_add(&b, 2, MR_KIND_DATA, payload, 8), MR__BATCH_FULL);
    ck_assert(!mr__batcher_append(&b, 2, MR_KIND_DATA, payload, 8));
    /* Rank 1's batch takes frames of 16 bytes (8 of header, 8 of payload) until its 64
       bytes are used: 4 in all. The inline append and the full add pack alike. */
    size_t max_frame = 0;
    mr_append_window_t *win = mr__batcher_windows(&b, &max_frame);
    ck_assert_ptr_eq(win, b.win);
    ck_assert_uint_eq(max_frame, 16);
    ck_assert_uint_eq(win[0].kind, 0); /* No batch open for rank 0: the core sees no room. */
    ck_assert(!mr_append_window_put(&win[0], MR_KIND_DATA, payload, 8));
    ck_assert(!mr_append_window_put(&win[1], MR_KIND_ITEMS, payload, 8)); /* Not its kind. */
    for (int c = 8; c < 11; c++) {
        if (c == 10) {
            /* As the core appends, through the window (ABI 6). */
            ck_assert(mr_append_window_put(&win[1], MR_KIND_DATA, payload + c, 8));
        } else if (c % 2 == 0) {
            ck_assert(mr__batcher_append(&b, 1, MR_KIND_DATA, payload + c, 8));
        } else {
            ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload + c, 8),
                             MR__BATCH_ADDED);
        }
    }
    ck_assert(!mr__batcher_append(&b, 1, MR_KIND_DATA, payload, 8));
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8),
                     MR__BATCH_FULL);
    /* Counted while the batches are still open (mr_stats_t.messages_coalesced). */
    mr_stats_t stats = {.size = sizeof(stats)};
    mr__batcher_stats(&b, &stats);
    ck_assert_uint_eq(stats.messages_coalesced, 5);

    /* What the receiver reads back: the frames in order, kinds and bytes intact. */
    batch = mr__batcher_detach(&b, 1);
    ck_assert_ptr_nonnull(batch);
    ck_assert_ptr_null(mr__batcher_detach(&b, 1));
    ck_assert_uint_eq(b.nopen, 1);
    ck_assert_uint_eq(batch->nframes, 4);
    ck_assert_uint_eq(batch->used, 64);
    ck_assert_uint_eq(b.added, 4);
    ck_assert_uint_eq(b.win[1].kind, 0); /* Detached: its window is closed. */
    ck_assert(!mr_append_window_put(&b.win[1], MR_KIND_DATA, payload, 8));
    size_t off = 0, len;
    const uint8_t *data;
    unsigned kind, n = 0;
    while (mr__batch_frame_next(batch->data, batch->used, &off, &kind, &data, &len) == 1) {
        ck_assert_uint_eq(kind, MR_KIND_DATA);
        ck_assert_uint_eq(len, 8);
        ck_assert_mem_eq(data, n == 0 ? payload : payload + 7 + n, 8);
        /* Every payload starts 8-byte aligned in the batch. */
        ck_assert_uint_eq((size_t)(data - batch->data) % 8, 0);
        n++;
    }
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(off, 64);
    /* Sent: the batch is free again. */
    mr__batcher_release(&b, batch);
    ck_assert_ptr_eq(b.free_list, batch);
    ck_assert_int_eq(batch->dest, -1);

    /* Rank 2's batch holds one empty item frame. */
    batch = mr__batcher_detach(&b, 2);
    off = 0;
    ck_assert_int_eq(mr__batch_frame_next(batch->data, batch->used, &off, &kind, &data, &len), 1);
    ck_assert_uint_eq(kind, MR_KIND_ITEMS);
    ck_assert_uint_eq(len, 0);
    ck_assert_int_eq(mr__batch_frame_next(batch->data, batch->used, &off, &kind, &data, &len), 0);
    mr__batcher_release(&b, batch);

    /* After a progress call, the first message leaves alone again. */
    mr__batcher_next_epoch(&b);
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8),
                     MR__BATCH_ALONE);
    ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8),
                     MR__BATCH_ADDED);
    mr__batcher_fini(&b);

    /* Off: nothing is packed. */
    ck_assert_int_eq(mr__batcher_init(&b, 3, 2, 64, 0), MR_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(mr__batcher_add(&b, 1, MR_KIND_DATA, payload, 8), MR__BATCH_ALONE);
    }
    ck_assert_ptr_null(mr__batcher_windows(&b, &max_frame)); /* The core appends nothing. */
    ck_assert_uint_eq(max_frame, 0);
    mr__batcher_fini(&b);
}
END_TEST

START_TEST(batcher_frame_limit)
{
    mr__batcher_t b;

    /* Room for 512 empty frames, but a batch keeps at most MR__BATCH_MAX_FRAMES. */
    ck_assert_int_eq(mr__batcher_init(&b, 1, 1, 2048, 64), MR_OK);
    ck_assert_int_eq(mr__batcher_add(&b, 0, MR_KIND_DATA, NULL, 0), MR__BATCH_ALONE);
    for (unsigned i = 0; i < MR__BATCH_MAX_FRAMES; i++) {
        ck_assert_int_eq(mr__batcher_add(&b, 0, MR_KIND_DATA, NULL, 0), MR__BATCH_ADDED);
    }
    ck_assert_int_eq(mr__batcher_add(&b, 0, MR_KIND_DATA, NULL, 0), MR__BATCH_FULL);
    mr__batcher_fini(&b);
}
END_TEST

START_TEST(batch_frames_that_do_not_add_up)
{
    /* One 3-byte frame (padded to 8), then a header that claims more than is left. */
    const uint8_t wire[] = {3, 0, 0, 0x80, 0, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0, 0,
                            5, 0, 0, 0, 0, 0, 0, 0, 'x'};
    size_t off = 0, len;
    const uint8_t *data;
    unsigned kind;

    ck_assert_int_eq(mr__batch_frame_next(wire, sizeof(wire), &off, &kind, &data, &len), 1);
    ck_assert_uint_eq(kind, MR_KIND_ITEMS);
    ck_assert_uint_eq(len, 3);
    ck_assert_mem_eq(data, "abc", 3);
    ck_assert_int_eq(mr__batch_frame_next(wire, sizeof(wire), &off, &kind, &data, &len),
                     MR_ERR_PROTOCOL);
    ck_assert_uint_eq(off, 16); /* Not advanced past the bad frame. */
    /* The header's second word is zero on the wire; the padding must be in the batch. */
    const uint8_t marked[] = {3, 0, 0, 0, 1, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0, 0};
    off = 0;
    ck_assert_int_eq(mr__batch_frame_next(marked, sizeof(marked), &off, &kind, &data, &len),
                     MR_ERR_PROTOCOL);
    ck_assert_int_eq(mr__batch_frame_next(wire, 11, &off, &kind, &data, &len), MR_ERR_PROTOCOL);
    /* A header cut short. */
    off = 0;
    ck_assert_int_eq(mr__batch_frame_next(wire, 2, &off, &kind, &data, &len), MR_ERR_PROTOCOL);
    /* An empty batch has no frames. */
    ck_assert_int_eq(mr__batch_frame_next(wire, 0, &off, &kind, &data, &len), 0);
}
END_TEST

int main(void)
{
    Suite *suite = suite_create("substrate-base");
    TCase *tc = tcase_create("base");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, alloc_fills_the_base);
    tcase_add_test(tc, alloc_refuses_bad_params);
    tcase_add_test(tc, send_target_closing_stats);
    tcase_add_test(tc, done_queue_in_order_and_detached);
    tcase_add_test(tc, random_bytes);
    tcase_add_test(tc, batcher_packs_after_the_first_message);
    tcase_add_test(tc, batcher_frame_limit);
    tcase_add_test(tc, batch_frames_that_do_not_add_up);
    suite_add_tcase(suite, tc);
    sr = srunner_create(suite);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
