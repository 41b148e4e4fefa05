/*
 * libFuzzer target: the YGM trace reader. Byte 0 picks the layout (auto,
 * older, newer), byte 1 the number of ranks, the rest is the trace. Parsing
 * must never crash or read past the buffer; an accepted trace must write back
 * to exactly the same bytes in the layout it was read as; a refusal must name
 * the file and an offset.
 */
#include "ygm_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ygm_trace_t trace;
    char err[1024];

    if (size < 2) return 0;
    ygm_layout_t layout = (ygm_layout_t)(data[0] % 3);
    int nranks = 1 + data[1];
    /* An exact copy, so that ASan catches a read one byte past the end. */
    uint8_t *copy = malloc(size - 2 ? size - 2 : 1);
    memcpy(copy, data + 2, size - 2);
    if (ygm_trace_parse(copy, size - 2, layout, nranks, "fuzz.bin", &trace, err, sizeof(err)) !=
        0) {
        if (strstr(err, "fuzz.bin") == NULL) abort();
        free(copy);
        return 0;
    }
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    for (size_t i = 0; i < trace.count; i++) {
        if (ygm_trace_write(f, trace.layout, &trace.records[i]) != 0) abort();
    }
    fclose(f);
    if (out_len != size - 2 || memcmp(out, copy, out_len) != 0) abort();
    free(out);
    free(copy);
    ygm_trace_free(&trace);
    return 0;
}
