/*
 * SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
 * 2012): a keyed hash with a 128-bit key and a 64-bit output, used by the TCP
 * substrate as the message authentication code of its connection handshake.
 * Internal to the plugin.
 */
#ifndef MR_TCP_SIPHASH_H
#define MR_TCP_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* Length of a SipHash key in bytes. */
#define MR_SIPHASH_KEY_LEN 16

/*
 * Returns SipHash-2-4 of the `length` bytes at `data` under `key`. The key is
 * read as two little-endian 64-bit words; the result is the 64-bit value whose
 * little-endian encoding is the 8-byte output of the reference description.
 */
uint64_t mr_siphash24(const uint8_t key[MR_SIPHASH_KEY_LEN], const void *data, size_t length);

#endif /* MR_TCP_SIPHASH_H */
