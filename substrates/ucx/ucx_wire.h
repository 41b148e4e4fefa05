/*
 * The byte-level wire format of the UCX substrate: the address blob that the
 * core all-gathers, and the 10-byte header of every active message. Pure: no
 * UCX calls, no sockets, no allocation, no global state, so that the unit
 * tests (tests/test_ucx_wire.c) and the libFuzzer target
 * (tests/fuzz/fuzz_ucx_wire.c) run exactly the code that reads a peer's
 * bytes. docs/substrate-ucx.md describes the protocol.
 * Internal to the plugin.
 *
 * Decoders return MR_OK or a negative status with a ucx_wire_error_t that
 * says why. They never return MR_AGAIN: UCX hands over a message's header
 * whole, and an address is a complete blob. Their output parameters are
 * written on MR_OK only, and the error on a negative status only.
 */
#ifndef MR_UCX_WIRE_H
#define MR_UCX_WIRE_H

#include "mailrail.h"
#include "mr_byteorder.h"
#include "mr_wire.h"

#include <stddef.h>
#include <stdint.h>

/*
 * The address blob, little-endian: u32 magic, u8 version, u8[3] reserved
 * (written as 0, not checked), u32 pid, u32 length of the UCX worker
 * address, u64 boot id hash, u64 pid-namespace inode; then the worker
 * address itself.
 */
#define UCX_WIRE_ADDR_MAGIC 0x58554d52u /* "MRUX" read as a little-endian number. */
#define UCX_WIRE_ADDR_VERSION 1
#define UCX_WIRE_ADDR_HDR_LEN 32

/*
 * The header of every control message and of data messages that carry
 * something (credits, failures seen), little-endian and packed: u8 kind,
 * u32 imm, i32 source rank, u8 failures seen (saturating). Other data
 * messages have no header: their AM id names the sender and the kind.
 */
#define UCX_WIRE_HDR_LEN 10

/*
 * The kind byte of a data message's header: MR_KIND_DATA, MR_KIND_ITEMS, or
 * this for a batch of small messages (substrates/common/mr_batch.h).
 */
#define UCX_WIRE_DATA_BATCH 0x80

/*
 * Kinds of control messages (the kind byte of a control message's header).
 * Kinds 1 to 3 were the HELLO, READY and BYE rounds of earlier versions, before
 * endpoints were made on first use; a receiver now refuses them.
 */
enum {
    UCX_WIRE_CTRL_CREDIT = 0 /* A credit return, or a failure notice; imm is the core's. */
};

/*
 * A header-less handler's message longer than UCX_WIRE_HFRONT_MIN bytes and
 * at most _MAX (its id included) goes with the id in front, eager: an 8-byte
 * prefix, u8 handler id then 7 zero bytes, before the payload, which stays
 * 8-byte aligned. The receiver reads the id in the cache line UCX's own
 * header shares, not in the payload's last one (docs/substrate-ucx.md).
 */
#define UCX_WIRE_HFRONT_LEN 8
#define UCX_WIRE_HFRONT_MIN 64
#define UCX_WIRE_HFRONT_MAX 16384 /* Beyond it the miss is small beside the message. */

/* FNV-1a, 64 bits: the boot id hash and address digests. */
#define UCX_WIRE_FNV64_INIT UINT64_C(0xcbf29ce484222325)

/* What a decoder found wrong. */
typedef enum ucx_wire_fault {
    UCX_WIRE_TRUNCATED = 1,  /* An address blob shorter than its header. */
    UCX_WIRE_BAD_MAGIC,      /* Not a MailRail UCX address at all. */
    UCX_WIRE_BAD_VERSION,    /* Another version of the address. */
    UCX_WIRE_BAD_LENGTH,     /* A worker address that is empty or runs past the blob. */
    UCX_WIRE_BAD_HDR_LEN,    /* A message header of another length. */
    UCX_WIRE_BAD_SOURCE,     /* A source rank that is not a peer of this rank. */
    UCX_WIRE_BAD_HFRONT      /* A handler's prefix that is short or not zero-padded. */
} ucx_wire_fault_t;

/* Why a decoder refused its input; `fault` is a ucx_wire_fault_t. */
typedef mr__wire_error_t ucx_wire_error_t;

/* A decoded address blob. */
typedef struct ucx_wire_addr {
    uint32_t pid;
    uint64_t boot_hash;      /* Ranks with the same nonzero hash share a kernel. */
    uint64_t pidns;          /* The pid namespace, for watching the peer with a pidfd. */
    const uint8_t *worker;   /* The UCX worker address, inside the decoded blob. */
    size_t worker_len;
} ucx_wire_addr_t;

/* A decoded message header. */
typedef struct ucx_wire_hdr {
    uint8_t kind;
    uint32_t imm;
    int32_t source;
    uint8_t failures_seen;
} ucx_wire_hdr_t;

/* Continues an FNV-1a 64-bit hash `h` over `len` bytes. */
uint64_t mr__ucx_wire_fnv1a64(uint64_t h, const void *data, size_t len);

/*
 * Writes the address blob of `a` (its worker address included) to `out`,
 * which has room for UCX_WIRE_ADDR_HDR_LEN + a->worker_len bytes. Returns
 * the blob's length.
 */
size_t mr__ucx_wire_addr_encode(uint8_t *out, const ucx_wire_addr_t *a);

/*
 * Parses an address blob of `length` bytes (zero padding after the worker
 * address is allowed). MR_ERR_PROTOCOL for a missing or short blob, a wrong
 * magic or version, or a worker address length of 0 or beyond the blob;
 * MR_OK with *out set otherwise (out->worker points into `blob`).
 */
mr_status_t mr__ucx_wire_addr_decode(const void *blob, size_t length, ucx_wire_addr_t *out,
                                     ucx_wire_error_t *err);

/* Writes a message header. (Inline, as the decoder: they run on every message.) */
static inline void mr__ucx_wire_hdr_encode(uint8_t out[UCX_WIRE_HDR_LEN], const ucx_wire_hdr_t *h)
{
    out[0] = h->kind;
    mr__put_le32(out + 1, h->imm);
    mr__put_le32(out + 5, (uint32_t)h->source);
    out[9] = h->failures_seen;
}

/*
 * Decodes the `length` bytes at `header` as the header of a message received
 * by rank `rank` of a job of `size`. MR_ERR_PROTOCOL for a missing header, a
 * header of another length than UCX_WIRE_HDR_LEN, or a source outside
 * [0, size) or equal to `rank`; MR_OK with *out set otherwise.
 */
static inline mr_status_t mr__ucx_wire_hdr_decode(const void *header, size_t length, int32_t rank,
                                                  int32_t size, ucx_wire_hdr_t *out,
                                                  ucx_wire_error_t *err)
{
    const uint8_t *h = header;
    int32_t source;

    if (h == NULL || length != UCX_WIRE_HDR_LEN) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_HDR_LEN, "header length",
                             (long long)length);
    }
    source = (int32_t)mr__get_le32(h + 5);
    if (source < 0 || source >= size || source == rank) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_SOURCE, "source rank", source);
    }
    out->kind = h[0];
    out->imm = mr__get_le32(h + 1);
    out->source = source;
    out->failures_seen = h[9];
    return MR_OK;
}

/* Writes the prefix of a handler's message whose id is `id`. */
static inline void mr__ucx_wire_hfront_encode(uint8_t out[UCX_WIRE_HFRONT_LEN], uint8_t id)
{
    mr__put_le32(out, id); /* Little-endian: the id first, then zeros. */
    mr__put_le32(out + 4, 0);
}

/*
 * Decodes the prefix of a handler's message of `length` bytes at `data`.
 * MR_ERR_PROTOCOL when the message is shorter than the prefix or its padding
 * is not zero; MR_OK with *id set otherwise (the payload follows the prefix).
 */
static inline mr_status_t mr__ucx_wire_hfront_decode(const void *data, size_t length, uint8_t *id,
                                                     ucx_wire_error_t *err)
{
    const uint8_t *p = data;

    if (p == NULL || length < UCX_WIRE_HFRONT_LEN) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_HFRONT, "handler message length",
                             (long long)length);
    }
    if ((mr__get_le32(p) & ~UINT32_C(0xff)) != 0 || mr__get_le32(p + 4) != 0) {
        return mr__wire_fail(err, MR_ERR_PROTOCOL, UCX_WIRE_BAD_HFRONT, "handler prefix padding",
                             (long long)mr__get_le32(p));
    }
    *id = p[0];
    return MR_OK;
}

#endif /* MR_UCX_WIRE_H */
