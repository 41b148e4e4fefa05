/*
 * The layout of an aggregator's datagram (mailrail_items.h). Internal, pure
 * and header-only: items.c packs and unpacks on the hot path, and the fuzz
 * target tests/fuzz/fuzz_items_wire.c checks the decoders.
 *
 * A datagram is an 8-byte header, then the items back to back:
 *
 *   u16 aggregator number (the order of its creation, from 0, wrapping),
 *   u8 format (0 fixed, 1 variable), u8 reserved (0), u32 item size (fixed;
 *   0 when variable), little-endian.
 *
 * A fixed-size item is its bytes alone. A variable-size item is its length as
 * an unsigned LEB128 number of at most 3 bytes, in its shortest form, and then
 * its bytes.
 */
#ifndef MR_ITEMS_WIRE_H
#define MR_ITEMS_WIRE_H

#include "mailrail.h"
#include "mr_byteorder.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ITEMS_WIRE_HDR_LEN 8
#define ITEMS_WIRE_FIXED 0
#define ITEMS_WIRE_VARIABLE 1
/* The longest variable-size item a 3-byte length can state. */
#define ITEMS_WIRE_VAR_MAX ((1u << 21) - 1)

typedef struct items_wire_hdr {
    uint16_t number;
    uint8_t format;
    uint32_t item_size;
} items_wire_hdr_t;

static inline void items_wire_hdr_encode(uint8_t out[ITEMS_WIRE_HDR_LEN], uint16_t number,
                                         uint32_t item_size)
{
    mr__put_le16(out, number);
    out[2] = item_size == 0 ? ITEMS_WIRE_VARIABLE : ITEMS_WIRE_FIXED;
    out[3] = 0;
    mr__put_le32(out + 4, item_size);
}

/*
 * Reads a header; false when it is too short or not well formed (unknown
 * format, nonzero reserved field, a size that contradicts the format, or a
 * fixed size that does not divide the items' bytes). The number is checked
 * against nothing: the caller matches it.
 */
static inline bool items_wire_hdr_decode(const uint8_t *buf, size_t length,
                                         items_wire_hdr_t *out)
{
    if (length < ITEMS_WIRE_HDR_LEN) return false;
    uint8_t format = buf[2];
    uint32_t size = mr__get_le32(buf + 4);

    if (buf[3] != 0) return false;
    if (format == ITEMS_WIRE_FIXED) {
        if (size == 0 || (length - ITEMS_WIRE_HDR_LEN) % size != 0) return false;
    } else if (format != ITEMS_WIRE_VARIABLE || size != 0) {
        return false;
    }
    out->number = mr__get_le16(buf);
    out->format = format;
    out->item_size = size;
    return true;
}

/* Bytes the length of a variable-size item of `length` bytes takes. */
static inline size_t items_wire_len_size(size_t length)
{
    return length < 0x80 ? 1 : length < 0x4000 ? 2 : 3;
}

/* Writes the length of a variable-size item (<= ITEMS_WIRE_VAR_MAX); returns past it. */
static inline uint8_t *items_wire_len_put(uint8_t *p, size_t length)
{
    while (length >= 0x80) {
        *p++ = (uint8_t)(length | 0x80);
        length >>= 7;
    }
    *p++ = (uint8_t)length;
    return p;
}

/*
 * Reads the variable-size item at p, which ends before `end`: its bytes and
 * length. Returns the position after it, or NULL when the length is cut off,
 * longer than 3 bytes, not in its shortest form, or runs past `end`.
 */
static inline const uint8_t *items_wire_var_next(const uint8_t *p, const uint8_t *end,
                                                 const uint8_t **item, size_t *length)
{
    size_t n = 0;

    for (unsigned shift = 0;; shift += 7) {
        if (p == end || shift > 14) return NULL;
        uint8_t byte = *p++;
        n |= (size_t)(byte & 0x7f) << shift;
        if ((byte & 0x80) == 0) {
            /* A zero last byte after the first makes a longer form than needed. */
            if (byte == 0 && shift > 0) return NULL;
            break;
        }
    }
    if (n > (size_t)(end - p)) return NULL;
    *item = p;
    *length = n;
    return p + n;
}

#endif /* MR_ITEMS_WIRE_H */
