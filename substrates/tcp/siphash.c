/*
 * SipHash-2-4, written from the algorithm's description: the state is four
 * 64-bit words initialised from the key and four constants; each 8-byte
 * little-endian message word is absorbed with two SipRounds, the last word
 * carries the message length in its top byte, and four SipRounds finalise.
 */
#include "siphash.h"

#include "mr_byteorder.h"

static inline uint64_t sip_rotl(uint64_t x, unsigned b)
{
    return (x << b) | (x >> (64u - b));
}

typedef struct sip_state {
    uint64_t v0, v1, v2, v3;
} sip_state_t;

static inline void sip_round(sip_state_t *s)
{
    s->v0 += s->v1;
    s->v1 = sip_rotl(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = sip_rotl(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = sip_rotl(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = sip_rotl(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = sip_rotl(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = sip_rotl(s->v2, 32);
}

/* Absorbs one message word: c = 2 compression rounds. */
static inline void sip_absorb(sip_state_t *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    sip_round(s);
    s->v0 ^= m;
}

uint64_t mr_siphash24(const uint8_t key[MR_SIPHASH_KEY_LEN], const void *data, size_t length)
{
    const uint8_t *in = data;
    const uint64_t k0 = mr_get_le64(key);
    const uint64_t k1 = mr_get_le64(key + 8);
    sip_state_t s = {
        .v0 = k0 ^ UINT64_C(0x736f6d6570736575), /* "somepseu" */
        .v1 = k1 ^ UINT64_C(0x646f72616e646f6d), /* "dorandom" */
        .v2 = k0 ^ UINT64_C(0x6c7967656e657261), /* "lygenera" */
        .v3 = k1 ^ UINT64_C(0x7465646279746573), /* "tedbytes" */
    };
    size_t whole = length - (length % 8);
    uint64_t last;

    for (size_t i = 0; i < whole; i += 8) sip_absorb(&s, mr_get_le64(in + i));

    /* The final word: the remaining 0 to 7 bytes, and length mod 256 on top. */
    last = (uint64_t)(length & 0xffu) << 56;
    for (size_t i = 0; i < length % 8; i++) last |= (uint64_t)in[whole + i] << (8u * i);
    sip_absorb(&s, last);

    /* d = 4 finalisation rounds. */
    s.v2 ^= 0xffu;
    sip_round(&s);
    sip_round(&s);
    sip_round(&s);
    sip_round(&s);
    return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}
