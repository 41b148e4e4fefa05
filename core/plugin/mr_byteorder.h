/*
 * Little-endian fields in byte buffers, for the wire formats of the core and
 * the plugins (headers, handshakes, address blobs). Internal.
 */
#ifndef MR_BYTEORDER_H
#define MR_BYTEORDER_H

#include <stdint.h>

static inline void mr__put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void mr__put_le32(uint8_t *p, uint32_t v)
{
    for (unsigned i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8u * i));
}

static inline void mr__put_le64(uint8_t *p, uint64_t v)
{
    for (unsigned i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8u * i));
}

static inline uint16_t mr__get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t mr__get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (unsigned i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8u * i);
    return v;
}

static inline uint64_t mr__get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8u * i);
    return v;
}

#endif /* MR_BYTEORDER_H */
