/*
 * The graph kernel's edge sources and serial reference, on one process:
 * parsing, slicing into parts, malformed input, the binary form, R-MAT
 * determinism, and the serial summary of a graph with known answers.
 */
#include "graph_edges.h"
#include "graph_serial.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char test_path[64];

/* Writes `text` to a fresh temporary file and returns its path. */
static const char *write_temp(const void *data, size_t len)
{
    snprintf(test_path, sizeof(test_path), "/tmp/mr_test_graph_XXXXXX");
    int fd = mkstemp(test_path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
    return test_path;
}

static const char *write_text(const char *text)
{
    return write_temp(text, strlen(text));
}

/* Reads the whole file as one slice; returns true on success. */
static bool read_all(const char *path, graph_edges_t *edges, uint64_t *lines, graph_error_t *error)
{
    graph_text_slice_t slice;
    return graph_text_slice(path, 0, 1, &slice, error) &&
           graph_text_read(path, &slice, edges, lines, error);
}

START_TEST(text_parses_edges_comments_and_extra_columns)
{
    const char *path = write_text("# comment\n1 2\n\n  3\t4 1700000000\r\n% other comment\n"
                                  "9223372036854775807 0");
    graph_edges_t edges = {0};
    graph_error_t error;
    uint64_t lines;

    ck_assert(read_all(path, &edges, &lines, &error));
    ck_assert_uint_eq(lines, 6);
    ck_assert_uint_eq(edges.count, 3);
    ck_assert_uint_eq(edges.edge[0].u, 1);
    ck_assert_uint_eq(edges.edge[0].v, 2);
    ck_assert_uint_eq(edges.edge[1].u, 3);
    ck_assert_uint_eq(edges.edge[1].v, 4);
    ck_assert_uint_eq(edges.edge[2].u, (uint64_t)INT64_MAX);
    ck_assert_uint_eq(edges.edge[2].v, 0);
    graph_edges_free(&edges);
    unlink(path);
}
END_TEST

/* Every split into parts covers every line and edge exactly once, in order. */
START_TEST(text_slices_cover_every_line_once)
{
    char text[4096];
    size_t len = 0;
    for (int i = 0; i < 200; i++) {
        len += (size_t)snprintf(text + len, sizeof(text) - len, i % 17 == 0 ? "# c %d\n" : "%d %d\n",
                                i, i * 7 % 13);
    }
    const char *path = write_text(text);
    for (int parts = 1; parts <= 9; parts++) {
        graph_edges_t edges = {0};
        uint64_t total_lines = 0, expected_begin = 0;
        for (int part = 0; part < parts; part++) {
            graph_text_slice_t slice;
            graph_error_t error;
            uint64_t lines;
            ck_assert(graph_text_slice(path, part, parts, &slice, &error));
            ck_assert_uint_eq(slice.begin, expected_begin);
            expected_begin = slice.end;
            ck_assert(graph_text_read(path, &slice, &edges, &lines, &error));
            total_lines += lines;
        }
        ck_assert_uint_eq(expected_begin, len);
        ck_assert_uint_eq(total_lines, 200);
        ck_assert_uint_eq(edges.count, 200 - 12);
        for (size_t e = 0, i = 1; e < edges.count; e++, i++) {
            if (i % 17 == 0) i++;
            ck_assert_uint_eq(edges.edge[e].u, i);
            ck_assert_uint_eq(edges.edge[e].v, i * 7 % 13);
        }
        graph_edges_free(&edges);
    }
    unlink(path);
}
END_TEST

/* Each malformed line is reported with its number and a reason naming the problem. */
START_TEST(text_malformed_lines_are_named)
{
    static const struct {
        const char *text;
        uint64_t line;
        const char *reason;
    } cases[] = {
        {"1 2\n3 x\n", 2, "'x' is not a vertex id"},
        {"1 2\n# c\n7\n", 3, "one column"},
        {"1 2\n-3 4\n", 2, "negative vertex id '-3'"},
        {"1 -4\n", 1, "negative vertex id '-4'"},
        {"1 2\n2 3\n9223372036854775808 1\n", 3, "is larger than 9223372036854775807"},
        {"1 99999999999999999999999\n", 1, "is larger than"},
        {"12a 3\n", 1, "'12a' is not a vertex id"},
        {"1 2\n+5 6\n", 2, "'+5' is not a vertex id"},
        {"1 2\r3 4\r5 6\r", 1, "carriage return inside the line"},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const char *path = write_text(cases[c].text);
        graph_edges_t edges = {0};
        graph_error_t error;
        uint64_t lines;
        ck_assert_msg(!read_all(path, &edges, &lines, &error), "case %zu was accepted", c);
        ck_assert_uint_eq(error.line, cases[c].line);
        ck_assert_msg(strstr(error.reason, cases[c].reason) != NULL, "case %zu: '%s'", c,
                      error.reason);
        graph_edges_free(&edges);
        unlink(path);
    }
}
END_TEST

/* CRLF line ends and an empty file are fine; a line of 1 MiB or more is refused. */
START_TEST(text_line_ends_and_lengths)
{
    graph_edges_t edges = {0};
    graph_error_t error;
    uint64_t lines;
    const char *path = write_text("1 2\r\n3 4\r\n");

    ck_assert(read_all(path, &edges, &lines, &error));
    ck_assert_uint_eq(edges.count, 2);
    ck_assert_uint_eq(edges.edge[1].v, 4);
    graph_edges_free(&edges);
    unlink(path);

    path = write_text("");
    ck_assert(read_all(path, &edges, &lines, &error));
    ck_assert_uint_eq(lines, 0);
    ck_assert_uint_eq(edges.count, 0);
    unlink(path);

    /* A comment of 2^20 - 1 bytes plus its newline fits; one byte more does not. */
    for (size_t len = (1u << 20) - 1; len <= (1u << 20); len++) {
        char *text = malloc(len + 16);
        ck_assert_ptr_nonnull(text);
        text[0] = '#';
        memset(text + 1, 'a', len - 1);
        memcpy(text + len, "\n5 6\n", 5);
        path = write_temp(text, len + 5);
        free(text);
        bool ok = read_all(path, &edges, &lines, &error);
        if (len < (1u << 20)) {
            ck_assert_msg(ok, "a line of %zu bytes was refused: %s", len, error.reason);
            ck_assert_uint_eq(edges.count, 1);
            ck_assert_uint_eq(edges.edge[0].u, 5);
        } else {
            ck_assert(!ok);
            ck_assert_uint_eq(error.line, 1);
            ck_assert_ptr_nonnull(strstr(error.reason, "line of 1048576 bytes or more"));
        }
        graph_edges_free(&edges);
        unlink(path);
    }
    /* The same limit for a last line without a newline. */
    char *text = malloc((1u << 20) + 4);
    ck_assert_ptr_nonnull(text);
    memcpy(text, "1 2\n#", 5);
    memset(text + 5, 'a', (1u << 20) - 1);
    path = write_temp(text, (1u << 20) + 4);
    free(text);
    ck_assert(!read_all(path, &edges, &lines, &error));
    ck_assert_uint_eq(error.line, 2);
    ck_assert_ptr_nonnull(strstr(error.reason, "line of 1048576 bytes or more"));
    graph_edges_free(&edges);
    unlink(path);
}
END_TEST

START_TEST(missing_file_is_an_error)
{
    graph_text_slice_t slice;
    graph_error_t error;
    ck_assert(!graph_text_slice("/nonexistent/graph.el", 0, 1, &slice, &error));
    ck_assert_ptr_nonnull(strstr(error.reason, "cannot open"));
    ck_assert(!graph_file_is_binary("/nonexistent/graph.el"));
}
END_TEST

START_TEST(binary_form_reads_in_parts_and_rejects_bad_files)
{
    unsigned char file[16 + 5 * 16];
    memcpy(file, GRAPH_BINARY_MAGIC, 8);
    graph_put_le64(file + 8, 5);
    for (uint64_t e = 0; e < 5; e++) {
        graph_put_le64(file + 16 + 16 * e, 100 + e);
        graph_put_le64(file + 24 + 16 * e, 200 + e);
    }
    const char *path = write_temp(file, sizeof(file));
    ck_assert(graph_file_is_binary(path));
    graph_edges_t edges = {0};
    graph_error_t error;
    uint64_t total = 0;
    for (int part = 0; part < 3; part++) {
        ck_assert(graph_binary_read(path, part, 3, &edges, &total, &error));
    }
    ck_assert_uint_eq(total, 5);
    ck_assert_uint_eq(edges.count, 5);
    for (uint64_t e = 0; e < 5; e++) {
        ck_assert_uint_eq(edges.edge[e].u, 100 + e);
        ck_assert_uint_eq(edges.edge[e].v, 200 + e);
    }
    graph_edges_free(&edges);
    unlink(path);

    /* A count that does not match the size. */
    graph_put_le64(file + 8, 6);
    path = write_temp(file, sizeof(file));
    ck_assert(!graph_binary_read(path, 0, 1, &edges, &total, &error));
    ck_assert_ptr_nonnull(strstr(error.reason, "announces 6 edges"));
    unlink(path);

    /* An id above 2^63 - 1, reported with its offset. */
    graph_put_le64(file + 8, 5);
    graph_put_le64(file + 16 + 16 * 3, UINT64_MAX);
    path = write_temp(file, sizeof(file));
    ck_assert(!graph_binary_read(path, 0, 1, &edges, &total, &error));
    ck_assert_uint_eq(error.offset, 16 + 16 * 3);
    ck_assert_ptr_nonnull(strstr(error.reason, "larger than"));
    graph_edges_free(&edges);
    unlink(path);
}
END_TEST

/* Edge i depends only on the seed and i: slices concatenate to the whole graph. */
START_TEST(rmat_is_deterministic_and_skewed)
{
    graph_rmat_t rmat = {.scale = 10, .edge_factor = 8, .seed = 42};
    graph_edges_t whole = {0}, parts = {0};
    uint64_t m = graph_rmat_edges(&rmat), low = 0;

    ck_assert_uint_eq(m, 8192);
    ck_assert(graph_rmat_generate(&rmat, 0, m, &whole));
    ck_assert(graph_rmat_generate(&rmat, 0, 1000, &parts));
    ck_assert(graph_rmat_generate(&rmat, 1000, m - 1000, &parts));
    ck_assert_uint_eq(parts.count, m);
    ck_assert_mem_eq(whole.edge, parts.edge, m * sizeof(graph_edge_t));
    for (uint64_t e = 0; e < m; e++) {
        ck_assert_uint_lt(whole.edge[e].u, 1024);
        ck_assert_uint_lt(whole.edge[e].v, 1024);
        low += whole.edge[e].u < 512;
    }
    /* The top bit of u is 0 with probability a + b = 0.76. */
    ck_assert_uint_gt(low, m * 72 / 100);
    ck_assert_uint_lt(low, m * 80 / 100);
    graph_edges_free(&whole);
    graph_edges_free(&parts);
    /* Ids must fit in 63 bits. */
    graph_rmat_t huge = {.scale = 63, .edge_factor = 1, .seed = 1};
    ck_assert(!graph_rmat_generate(&huge, 0, 1, &parts));
    ck_assert_uint_eq(parts.count, 0);
}
END_TEST

/* tests/graph/known.el, whose answers are counted by hand in its header. */
START_TEST(serial_summary_of_a_known_graph)
{
    static const uint64_t list[][2] = {{1, 2}, {1, 3}, {1, 4}, {2, 3}, {2, 4}, {3, 4},
                                       {10, 11}, {11, 12}, {12, 10}, {12, 13}, {20, 21},
                                       {30, 31}, {31, 32}, {32, 33}, {33, 30}, {5, 5}, {2, 1}};
    graph_edges_t edges = {0};
    graph_summary_t s;
    uint64_t checksum = 0;

    for (size_t e = 0; e < sizeof(list) / sizeof(list[0]); e++) {
        ck_assert(graph_edges_push(&edges, list[e][0], list[e][1]));
    }
    ck_assert(graph_serial_summary(&edges, &s));
    ck_assert_uint_eq(s.edges_read, 17);
    ck_assert_uint_eq(s.self_loops, 1);
    ck_assert_uint_eq(s.duplicate_edges, 1);
    ck_assert_uint_eq(s.vertices, 14);
    ck_assert_uint_eq(s.edges, 15);
    ck_assert_uint_eq(s.triangles, 5);
    ck_assert_uint_eq(s.max_degree, 3);
    ck_assert_uint_eq(s.hub, 1);
    static const uint64_t degree[][2] = {{1, 3}, {2, 3}, {3, 3}, {4, 3}, {10, 2}, {11, 2},
                                         {12, 3}, {13, 1}, {20, 1}, {21, 1}, {30, 2}, {31, 2},
                                         {32, 2}, {33, 2}};
    for (size_t v = 0; v < 14; v++) checksum += graph_degree_term(degree[v][0], degree[v][1]);
    ck_assert_uint_eq(s.degree_checksum, checksum);
    graph_edges_free(&edges);
}
END_TEST

/* A complete graph K_n has n(n-1)(n-2)/6 triangles. */
START_TEST(serial_triangles_of_complete_graphs)
{
    for (uint64_t n = 3; n <= 12; n++) {
        graph_edges_t edges = {0};
        graph_summary_t s;
        for (uint64_t u = 0; u < n; u++) {
            for (uint64_t v = u + 1; v < n; v++) ck_assert(graph_edges_push(&edges, v * 1000, u * 1000));
        }
        ck_assert(graph_serial_summary(&edges, &s));
        ck_assert_uint_eq(s.triangles, n * (n - 1) * (n - 2) / 6);
        ck_assert_uint_eq(s.max_degree, n - 1);
        ck_assert_uint_eq(s.hub, 0);
        graph_edges_free(&edges);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("graph");
    TCase *tc = tcase_create("graph");
    tcase_add_test(tc, text_parses_edges_comments_and_extra_columns);
    tcase_add_test(tc, text_slices_cover_every_line_once);
    tcase_add_test(tc, text_malformed_lines_are_named);
    tcase_add_test(tc, text_line_ends_and_lengths);
    tcase_add_test(tc, missing_file_is_an_error);
    tcase_add_test(tc, binary_form_reads_in_parts_and_rejects_bad_files);
    tcase_add_test(tc, rmat_is_deterministic_and_skewed);
    tcase_add_test(tc, serial_summary_of_a_known_graph);
    tcase_add_test(tc, serial_triangles_of_complete_graphs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
