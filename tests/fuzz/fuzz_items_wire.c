/*
 * libFuzzer target: the layout of an aggregator's datagram
 * (core/runtime/items_wire.h), which the item layer decodes for every datagram a
 * peer sends. The input is one datagram, header first.
 *
 * The properties checked: the decoders never read past the datagram (each
 * sees an exact copy, for ASan); an accepted header re-encodes to the same
 * bytes; a fixed-size datagram's items fill it exactly; every variable-size
 * item lies inside the datagram, right after its length, and a datagram
 * whose items all decode re-encodes (shortest lengths) to the same bytes;
 * a refused item leaves the outputs untouched.
 */
#include "items_wire.h"

#include <stdlib.h>
#include <string.h>

static void fuzz_variable(const uint8_t *buf, size_t size)
{
    const uint8_t *p = buf + ITEMS_WIRE_HDR_LEN, *end = buf + size;
    uint8_t *again = malloc(size), *q = again + ITEMS_WIRE_HDR_LEN;

    memcpy(again, buf, ITEMS_WIRE_HDR_LEN);
    while (p != end) {
        const uint8_t *item = (const uint8_t *)1;
        size_t length = 12345;
        const uint8_t *next = items_wire_var_next(p, end, &item, &length);
        if (next == NULL) {
            if (item != (const uint8_t *)1 || length != 12345) abort();
            free(again);
            return;
        }
        if (item <= p || item > end || next != item + length || next > end ||
            length > ITEMS_WIRE_VAR_MAX) {
            abort();
        }
        if ((size_t)(item - p) != items_wire_len_size(length)) abort();
        q = items_wire_len_put(q, length);
        memcpy(q, item, length);
        q += length;
        p = next;
    }
    if ((size_t)(q - again) != size || memcmp(again, buf, size) != 0) abort();
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    items_wire_hdr_t h;

    memcpy(buf, data, size);
    if (items_wire_hdr_decode(size ? buf : NULL, size, &h)) {
        uint8_t again[ITEMS_WIRE_HDR_LEN];
        items_wire_hdr_encode(again, h.number, h.item_size);
        if (size < ITEMS_WIRE_HDR_LEN || memcmp(again, buf, ITEMS_WIRE_HDR_LEN) != 0) abort();
        if (h.format == ITEMS_WIRE_FIXED) {
            if (h.item_size == 0 || (size - ITEMS_WIRE_HDR_LEN) % h.item_size != 0) abort();
        } else {
            fuzz_variable(buf, size);
        }
    }
    free(buf);
    return 0;
}
